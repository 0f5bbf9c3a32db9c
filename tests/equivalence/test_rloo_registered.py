"""One RLOO (issue 54 item 2): rloo's MethodSpec names its estimators (rloo.core.estimators), its
settings select among them (config/methods.py's rloo_estimators), and every combination runs the
group step with the fast paths (the shared prompt pass, the chunked head, micro-batches).

- algorithms/rloo.py's `rloo_step`, the readable eq. 1-5 in one pass, gives the first gradient of the
  registered path (the group step with rloo's default estimators, leave_one_out and policy_gradient);
- each combination's first gradient with every fast path on equals the plain pass's (no shared
  prompt, no micro-batches, the whole head at once). A micro-batch normalised by itself, a shared
  pass whose rows are put back in the wrong order, or a chunk of the head dropped are off by far more
  than the tolerance (test_accumulation, test_fastpath); TINY_MODEL_BACKWARD of the gradient's scale
  bounds two float orders of one sum.
"""

from __future__ import annotations

import itertools
from functools import partial

import pytest
import torch

from helpers.grads import GradRecorder
from helpers.tiny_archs import save_tiny_lm
from rloo.algorithms.clipped_group import clipped_group_step
from rloo.algorithms.registry import is_plain_rloo, make_algorithm
from rloo.algorithms.rloo import rloo_step
from rloo.config import METHOD_SPECS, RLConfig
from rloo.config.method_settings import RlooSettings
from rloo.config.methods import rloo_estimators
from rloo.core.estimators import ADVANTAGES, LOSSES
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_BACKWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]
K = 4
ONE_PASS = {"ppo_epochs": 1, "num_minibatches": 1}  # rloo_clip's first gradient is then the batch's
COMBINATIONS = {
    "k3": {"kl_estimator": "k3"},
    "token": {"kl_level": "token"},
    "clip": {"rloo_clip": True} | ONE_PASS,
    "clip_token": {"rloo_clip": True, "kl_level": "token", "kl_estimator": "k3"} | ONE_PASS,
    "drop": {"drop_zero_variance": True},
}


def reward_fn(prompts, completions):
    pairs = zip(prompts, completions, strict=True)
    return [len(c.split()) / 4 - 0.5 * c.count(":") + 0.1 * len(p.split()) for p, c in pairs]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("rloo_registered") / "llama", "llama")


def _config(path, out, settings: dict, fast: bool) -> RLConfig:
    return RLConfig(
        policy=str(path),
        output_dir=out,
        algorithm_settings=settings,
        k=K,
        beta=0.1,
        max_new_tokens=8,
        batch_size=len(PROMPTS),
        dtype="float32",
        seed=0,
        max_grad_norm=1e6,
        share_prompt=fast,
        micro_batch_size=1 if fast else None,
        max_logits_mb=1e-3 if fast else 256,  # a few rows' logits per chunk of the head
    )


def _first_gradient(cfg: RLConfig, step=None) -> dict[str, torch.Tensor]:
    models = load_models(cfg, reward_fn=reward_fn)
    opt = GradRecorder(models.policy)
    step = step or make_algorithm(cfg, models).step
    step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    assert opt.grads is not None, "no optimizer step"
    return opt.grads


def _assert_same(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys()
    scale = max(g.abs().max().item() for g in want.values())
    assert scale > 0
    for name in want:
        assert_close(got[name], want[name], TINY_MODEL_BACKWARD, scale=scale, msg=f"{what}: {name}")


def test_every_setting_selects_registered_estimators():
    """rloo's table entry names its default estimators; each ablation setting selects registered ones,
    and only the defaults with k1 and every group kept take rloo_step's one pass."""
    spec = METHOD_SPECS["rloo"]
    assert (spec.advantage, spec.loss, spec.choose) == ("leave_one_out", "policy_gradient", rloo_estimators)
    seen = set()
    for level, clip in itertools.product(("sequence", "token"), (False, True)):
        advantage, loss = spec.estimators(RlooSettings(kl_level=level, rloo_clip=clip))
        assert advantage in ADVANTAGES and loss in LOSSES
        assert LOSSES[loss].token_mean == (clip and level == "token")  # the token-level surrogate averages tokens
        seen.add((advantage, loss))
    assert len(seen) == 4
    assert is_plain_rloo(RLConfig(policy="p"))
    for settings in COMBINATIONS.values():
        assert not is_plain_rloo(RLConfig(policy="p", algorithm_settings=settings))


def test_rloo_step_gives_the_registered_paths_gradient(policy_dir, tmp_path):
    """The readable eq. 1-5 (rloo_step, its one pass) and the group step on rloo's default estimators."""
    cfg = _config(policy_dir, tmp_path / "o", {}, fast=False)
    paper = _first_gradient(cfg, rloo_step)
    registered = _first_gradient(cfg, partial(clipped_group_step, METHOD_SPECS["rloo"]))
    _assert_same(registered, paper, "rloo_step vs the registered path")


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_fast_paths_serve_every_combination(name, policy_dir, tmp_path):
    settings = COMBINATIONS[name]
    plain = _first_gradient(_config(policy_dir, tmp_path / "plain", settings, fast=False))
    fast = _first_gradient(_config(policy_dir, tmp_path / "fast", settings, fast=True))
    _assert_same(fast, plain, name)
