"""Numerical guard: a non-finite loss or gradient skips the update (counted, logged); a streak of
`max_skipped_steps` stops the run with a checkpoint from before the problem."""

from __future__ import annotations

import json

import pytest

import rloo.algorithms.common as common
from rloo import RLConfig, train
from rloo.errors import NonFiniteError
from rloo.runtime.checkpoint.verify import latest_checkpoint, list_checkpoints, load_state, step_of

from ._helpers import PROMPTS, assert_same_params, reward_short
from .conftest import rl_config as _cfg


def _nan_loss_on(monkeypatch, bad_calls: set[int]):
    """Make the policy loss NaN on the given (1-based) rloo_step calls (eq. 5's loss, formed in
    algorithms/common.py's policy_gradient_update for rloo and the other sequence-level methods)."""
    calls = {"n": 0}
    real = common.policy_gradient_loss

    def loss_fn(*a, **kw):
        calls["n"] += 1
        loss, stats = real(*a, **kw)
        return (loss * float("nan"), stats) if calls["n"] in bad_calls else (loss, stats)

    monkeypatch.setattr(common, "policy_gradient_loss", loss_fn)


def test_isolated_non_finite_step_is_skipped_and_counted(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _nan_loss_on(monkeypatch, {2})
    result = train(_cfg(tiny_model_dir, out, max_skipped_steps=2), prompts=PROMPTS, reward_fn=reward_short)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["guard/skipped"] for r in recs] == [0, 1, 0, 0, 0, 0]
    assert recs[-1]["guard/skipped_total"] == 1
    assert result.model_path.exists()
    counters = load_state(latest_checkpoint(out))["counters"]
    assert counters["updates"] == 5 and counters["skipped_total"] == 1 and counters["skipped_in_row"] == 0


def test_streak_stops_with_a_checkpoint_from_before_it(reference, tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _nan_loss_on(monkeypatch, {4, 5})  # steps 4 and 5; step 4 would have been a periodic checkpoint
    with pytest.raises(
        NonFiniteError,
        match=r"2 steps in a row \(steps 4-5\) had a non-finite loss or gradient; "
        r"stopped\. Checkpoint from before the problem: .*step-000003\. Lower lr",
    ):
        train(_cfg(tiny_model_dir, out, max_skipped_steps=2), prompts=PROMPTS, reward_fn=reward_short)
    err = capsys.readouterr().err
    assert "checkpoint at step 4 postponed" in err
    assert [step_of(c) for c in list_checkpoints(out)] == [2, 3]
    assert not (out / "model").exists()
    # The checkpoint is the exact state after step 3 of a healthy run: resuming from it without
    # the fault ends exactly where the uninterrupted run ends.
    monkeypatch.undo()
    train(_cfg(tiny_model_dir, out, max_skipped_steps=2), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert_same_params(reference / "model", out / "model")


def test_guard_setting_is_validated():
    with pytest.raises(Exception, match="max_skipped_steps"):
        RLConfig(policy="p", max_skipped_steps=0)
