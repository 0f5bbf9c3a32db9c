"""Exact resume in-process: a run stopped by SIGTERM at step s and resumed ends with the same
parameters, bit for bit, as a run that was never stopped (deterministic CPU settings)."""

from __future__ import annotations

import os
import shutil
import signal

import pytest
import torch

import rloo.algorithms.rloo as rl
import rloo.runtime.tracking.log as tracking
from rloo import train
from rloo.errors import Interrupted, RlooError
from rloo.runtime.checkpoint.verify import latest_checkpoint, list_checkpoints, load_state, step_of

from ._helpers import PROMPTS, assert_params_moved, assert_same_params, metric_steps, reward_short
from .conftest import rl_config as _cfg


def _signal_after(monkeypatch, at_step: int, signum=signal.SIGTERM):
    """Deliver `signum` to this process in the middle of step `at_step` (1-based)."""
    calls = {"n": 0}
    real = rl.rloo_step  # make_algorithm looks it up when the run starts

    def step(*a, **kw):
        calls["n"] += 1
        out = real(*a, **kw)
        if calls["n"] == at_step:
            os.kill(os.getpid(), signum)
        return out

    monkeypatch.setattr(rl, "rloo_step", step)


def test_training_moves_the_parameters(reference, tiny_model_dir):
    assert_params_moved(tiny_model_dir, reference / "model")


@pytest.mark.parametrize("stop_at", [3, 4])  # between checkpoints, and on a checkpoint step
def test_sigterm_then_resume_is_bitwise_exact(stop_at, reference, tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _signal_after(monkeypatch, stop_at)
    with pytest.raises(Interrupted, match=rf"SIGTERM received; stopped at step {stop_at}/6 .*plus resume=True$") as exc:
        train(_cfg(tiny_model_dir, out), prompts=PROMPTS, reward_fn=reward_short)
    assert exc.value.exit_code == 128 + signal.SIGTERM
    assert step_of(latest_checkpoint(out)) == stop_at
    assert not (out / "model").exists()
    monkeypatch.undo()
    train(_cfg(tiny_model_dir, out), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert_same_params(reference / "model", out / "model")
    assert metric_steps(out) == list(range(1, 7)), "each step is logged exactly once across the resume"


def _copy_without_newest(reference, out):
    """The finished reference run with its last checkpoint (step 6) and final model removed."""
    shutil.copytree(reference, out)
    shutil.rmtree(out / "checkpoints" / "step-000006")
    shutil.rmtree(out / "model")
    assert [step_of(c) for c in list_checkpoints(out)] == [4]


def test_resume_from_an_older_checkpoint_replays_exactly(reference, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    _copy_without_newest(reference, out)
    train(_cfg(tiny_model_dir, out), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert_same_params(reference / "model", out / "model")
    assert metric_steps(out) == list(range(1, 7))


def test_eval_does_not_perturb_training(tiny_model_dir, tmp_path):
    """The periodic eval samples with its own generator: training with and without it ends equal."""
    runs = {}
    for every in (None, 1):
        out = tmp_path / f"eval-{every}"
        train(
            _cfg(
                tiny_model_dir, out, steps=3, eval_every=every, eval_prompts=3, save_every=None, eval={"batch_size": 3}
            ),
            reward_fn=reward_short,
        )
        runs[every] = out
    assert any("eval/win_rate" in line for line in (runs[1] / "metrics.jsonl").read_text().splitlines())
    assert_same_params(runs[None] / "model", runs[1] / "model")


def test_checkpoint_holds_the_whole_state(reference):
    st = load_state(latest_checkpoint(reference))
    assert {
        "optimizer",
        "scheduler",
        "rng",
        "stream",
        "counters",
        "metrics_bytes",
        "step",
        "config",
        "prompts_sha",
    } <= set(st)
    assert {"python", "numpy", "torch", "sampler"} <= set(st["rng"])
    assert st["step"] == 6 and st["counters"]["updates"] == 6


def test_resume_refuses_other_prompts(reference, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    with pytest.raises(RlooError, match="training prompts differ"):
        train(_cfg(tiny_model_dir, out), prompts=PROMPTS[:3], reward_fn=reward_short, resume=True)


def test_resume_refuses_structural_changes(reference, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    with pytest.raises(RlooError, match=r"cannot resume with different k \(k: 2 -> 3\)"):
        train(_cfg(tiny_model_dir, out, k=3), prompts=PROMPTS, reward_fn=reward_short, resume=True)


def test_resume_with_another_thread_count_says_it_is_not_bit_for_bit(reference, tiny_model_dir, tmp_path, capsys):
    """Reductions split by thread: a checkpoint records the run's count, and a resume with another
    says in one line that it continues to float rounding only (docs/cli.md, "What is deterministic")."""
    out = tmp_path / "run"
    _copy_without_newest(reference, out)
    saved = load_state(latest_checkpoint(out))["threads"]
    assert saved == torch.get_num_threads()
    torch.set_num_threads(saved + 1)
    try:
        train(_cfg(tiny_model_dir, out), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    finally:
        torch.set_num_threads(saved)
    lines = [x for x in capsys.readouterr().err.splitlines() if "not bit for bit" in x]
    assert len(lines) == 1 and f"with {saved + 1} thread(s) where the run used {saved}" in lines[0], lines


def test_resume_with_a_new_lr_uses_it(reference, tiny_model_dir, tmp_path, capsys):
    # the non-finite guard tells the user to lower lr and resume: the new lr must take effect
    out = tmp_path / "run"
    _copy_without_newest(reference, out)
    result = train(_cfg(tiny_model_dir, out, lr=1e-3), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert "changed settings (not an exact continuation): lr: 0.003 -> 0.001" in capsys.readouterr().err
    lrs = [h["lr"] for h in result.history if "lr" in h]
    assert len(lrs) == 2 and all(abs(lr - 1e-3) < 1e-12 for lr in lrs)  # warm-up (2 steps) is long over


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo"])
def test_stateful_algorithms_resume_exactly(algorithm, tiny_model_dir, tmp_path, monkeypatch):
    """The moving-average baseline (reinforce) and the value model + its optimizer (ppo) are part
    of the checkpoint: an interrupted run still ends bitwise equal to an uninterrupted one."""
    kw = dict(algorithm=algorithm, steps=4)
    ref = tmp_path / "ref"
    train(_cfg(tiny_model_dir, ref, **kw), prompts=PROMPTS, reward_fn=reward_short)
    out = tmp_path / "run"
    real_log = tracking.MetricsLogger.log

    def log(self, step, metrics):
        real_log(self, step, metrics)
        if step == 3 and "reward/score" in metrics:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(tracking.MetricsLogger, "log", log)
    with pytest.raises(Interrupted, match="stopped at step 3/4"):
        train(_cfg(tiny_model_dir, out, **kw), prompts=PROMPTS, reward_fn=reward_short)
    monkeypatch.undo()
    train(_cfg(tiny_model_dir, out, **kw), prompts=PROMPTS, reward_fn=reward_short, resume=True)
    assert_same_params(ref / "model", out / "model")
