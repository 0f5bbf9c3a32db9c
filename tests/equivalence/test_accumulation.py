"""Gradient accumulation (rl.micro_batch_size, issue 32 point 4): every method's first update in
micro-batches has the gradient of the whole batch at once (rloo.core.accumulation).

The same seed samples the same rollout with and without micro-batches (splitting draws nothing from
the generator), so the gradients the optimizer receives are compared directly. Micro-batches of one
prompt (k rows) against the whole batch of 3 prompts: a loss normalised per micro-batch instead of
per batch (a token mean over the micro-batch's tokens, a row mean over its rows) is off by a factor
of 1/3 or by the tokens' shares, far outside the tolerance. Tolerance: the tiny models' backward
bound (tests/tolerance.py, TINY_MODEL_BACKWARD eps x the whole-batch gradient's largest entry).
Also: the whole gradient is clipped once, after accumulation (max_grad_norm small)."""

from __future__ import annotations

import pytest
import torch

from helpers.grads import GradRecorder
from helpers.tiny_archs import save_tiny_lm
from rloo.algorithms import make_algorithm
from rloo.config import METHOD_SPECS, AlgorithmSettings, RLConfig
from rloo.errors import ConfigError
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_BACKWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]
K = 4


def reward_fn(prompts, completions):
    return [
        len(c.split()) / 4 - 0.5 * c.count(":") + 0.1 * len(p.split())
        for p, c in zip(prompts, completions, strict=True)
    ]


# (method, its settings): every online method, rloo's ablations whose loss normalises differently
CASES = {
    "rloo": ("rloo", {}),
    "rloo_token_kl": ("rloo", {"kl_level": "token"}),
    "rloo_clip_token": ("rloo", {"rloo_clip": True, "kl_level": "token", "ppo_epochs": 1, "num_minibatches": 1}),
    "reinforce": ("reinforce", {}),
    "raft": ("raft", {}),
    "grpo": ("grpo", {"ppo_epochs": 1, "num_minibatches": 1}),
    "dr_grpo": ("dr_grpo", {"ppo_epochs": 1, "num_minibatches": 1}),
    "reinforce_pp": ("reinforce_pp", {"ppo_epochs": 1, "num_minibatches": 1}),
    "ppo_head": ("ppo", {"ppo_epochs": 1, "num_minibatches": 1, "value_model": "head"}),
    "ppo_separate": ("ppo", {"ppo_epochs": 1, "num_minibatches": 1, "value_model": "separate"}),
    "vanilla_pg": ("vanilla_pg", {"value_model": "head"}),
}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("acc") / "llama", "llama")


def _config(path, out, method: str, settings: dict, micro: int | None, **kw) -> RLConfig:
    own = METHOD_SPECS[method].settings.model_fields
    return RLConfig(
        policy=str(path),
        output_dir=out,
        algorithm=method,
        algorithm_settings=AlgorithmSettings(**{k: v for k, v in settings.items() if k in own}),
        k=K,
        beta=0.1,
        max_new_tokens=8,
        batch_size=len(PROMPTS),
        micro_batch_size=micro,
        dtype="float32",
        seed=0,
        **{"max_grad_norm": 1e6} | kw,
    )


def first_gradient(cfg: RLConfig) -> dict[str, torch.Tensor]:
    models = load_models(cfg, reward_fn=reward_fn)
    opt = GradRecorder(models.policy)
    torch.manual_seed(0)  # a separate value model's fresh score head is drawn from the global generator
    make_algorithm(cfg, models).step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    assert opt.grads is not None
    return opt.grads


@pytest.mark.parametrize("case", list(CASES))
def test_micro_batches_give_the_whole_batch_gradient(case, policy_dir, tmp_path):
    method, settings = CASES[case]
    whole = first_gradient(_config(policy_dir, tmp_path / "whole", method, settings, None))
    micro = first_gradient(_config(policy_dir, tmp_path / "micro", method, settings, 1))
    assert micro.keys() == whole.keys()
    scale = max(g.abs().max().item() for g in whole.values())
    assert scale > 0
    for name in whole:
        assert_close(micro[name], whole[name], TINY_MODEL_BACKWARD, scale=scale, msg=f"{case}: {name}")


def test_clipping_applies_to_the_accumulated_gradient(policy_dir, tmp_path):
    """max_grad_norm clips the summed gradient once, after the last micro-batch: micro-batches and
    the whole batch clip alike (clipping each micro-batch's part instead would change the direction:
    the prompts' gradients are not parallel). The shares are checked above (clipping hides a scale)."""
    whole = first_gradient(_config(policy_dir, tmp_path / "whole", "rloo", {}, None, max_grad_norm=1e-3))
    micro = first_gradient(_config(policy_dir, tmp_path / "micro", "rloo", {}, 1, max_grad_norm=1e-3))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in whole.values()]))
    assert abs(float(norm) - 1e-3) < 1e-6  # it was clipped
    for name in whole:
        assert_close(micro[name], whole[name], TINY_MODEL_BACKWARD, scale=1e-3, msg=name)


def test_micro_batch_settings_are_checked_in_one_line(policy_dir, tmp_path):
    with pytest.raises(ConfigError, match="micro_batch_size: 4 is larger than batch_size=3"):
        _config(policy_dir, tmp_path, "rloo", {}, 4)
    with pytest.raises(ConfigError, match="off-policy update"):
        _config(policy_dir, tmp_path, "rloo", {}, 1, max_staleness=1)
