"""Dropout off by default (issue 11, point 2): sampling and the update see the same function.

A GPT-2 whose config sets dropout 0.1 (GPT-2's default config does): PPO on-policy (one epoch of
one minibatch) must start at ratio 1 with no clipping, and 2-process DDP/FSDP must equal one
process within test_distributed's tolerance. `disable_dropout=false` is the control: dropout
stays on in the update and the same checks fail (so they can fail).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from helpers.tiny_archs import tiny_lm
from rloo import RLConfig, train
from rloo.config import AlgorithmSettings
from rloo.modeling.dropout import disable_dropout, has_dropout

HELPERS = Path(__file__).parents[1] / "helpers"
sys.path.insert(0, str(HELPERS))
import dropout_dist_worker  # noqa: E402

EPS = torch.finfo(torch.float32).eps
PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :", "post : tl;dr :"]


def _reward(prompts, completions):
    return [len(c.split()) / 5 for c in completions]


def _ppo_first_minibatch(path, out, disable: bool) -> dict:
    cfg = RLConfig(
        policy=str(path),
        output_dir=out,
        steps=1,
        batch_size=4,
        k=4,
        max_new_tokens=8,
        lr=1e-2,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        seed=0,
        dtype="float32",
        algorithm="ppo",
        algorithm_settings=AlgorithmSettings(ppo_epochs=1, num_minibatches=1, value_model="head"),
        disable_dropout=disable,
    )
    return next(h for h in train(cfg, prompts=PROMPTS, reward_fn=_reward).history if "ppo/clipfrac" in h)


def test_ppo_on_policy_ratio_is_one_with_dropout_in_config(gpt2_dropout, tmp_path):
    on = _ppo_first_minibatch(gpt2_dropout, tmp_path / "off", disable=True)
    # mean ratio over <= 32 tokens: each log-ratio is float rounding of two passes over the same
    # function (2^8 eps relative to |log p| + 1 <= 5: see tests/equivalence/test_gradient_matrix.py)
    assert on["ppo/clipfrac"] == 0.0
    assert abs(on["ppo/ratio_mean"] - 1) <= 2**8 * EPS * 5
    assert abs(on["ppo/approx_kl"]) <= (2**8 * EPS * 5) ** 2 + 4 * EPS  # k3 ~ logr^2/2, plus its own rounding
    kept = _ppo_first_minibatch(gpt2_dropout, tmp_path / "on", disable=False)  # the control
    assert kept["ppo/approx_kl"] > 1e-4 and abs(kept["ppo/ratio_mean"] - 1) > 2**8 * EPS * 5


def test_disable_dropout_switches_every_dropout_off_and_keeps_the_config():
    for arch in ("gpt2", "gpt_neox", "llama", "qwen2"):
        model = tiny_lm(arch, dropout=0.1)
        assert has_dropout(model), arch
        disable_dropout(model)
        assert not has_dropout(model), arch
        assert model.config.to_dict() == tiny_lm(arch, dropout=0.1).config.to_dict()  # save_pretrained unchanged
        x = torch.randint(2, 40, (2, 7))
        model.train()
        a, b = model(input_ids=x).logits, model(input_ids=x).logits
        assert torch.equal(a, b), f"{arch}: train mode still random after disable_dropout"
        model.eval()
        torch.testing.assert_close(model(input_ids=x).logits, a, rtol=0, atol=0)


def _step1(run: Path) -> dict:
    import json

    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.two_process_jobs("dropout")
def test_two_processes_match_one_with_dropout_in_config(two_process_runs, gpt2_dropout, tmp_path):
    """Step 1 of tests/equivalence/test_distributed.py's run (same prompts, k, lr) on a GPT-2 with dropout:
    DDP and FSDP over 2 processes give one process's loss and gradient norm. Compared at step 1,
    before AdamW (whose first update is about lr * sign(g)) can turn rounding-level differences of
    near-zero gradient entries into lr-sized weight differences. Tolerance: relative 1e-5, as for
    gradient checkpointing (tests/equivalence/test_checkpointing_shared.py): the same float32 math in another
    order (the plain pass instead of the shared one, an all-reduce of two halves)."""
    _, runs = two_process_runs["dropout"]  # the tier's one torchrun launch (tests/equivalence/conftest.py)
    dropout_dist_worker.run(str(gpt2_dropout), str(tmp_path / "one"), ["ddp"])
    one = _step1(tmp_path / "one" / "ddp")
    assert one["grad/norm"] > 0
    for mode in ("ddp", "fsdp", "ddp-gc"):
        two = _step1(runs / mode)
        for key in ("loss/policy", "grad/norm", "reward/score"):
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (mode, key, two[key], one[key])
