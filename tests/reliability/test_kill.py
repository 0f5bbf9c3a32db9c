"""Runs of the real CLI killed with SIGTERM/SIGINT/SIGKILL at several points (including in the
middle of writing a checkpoint) resume and finish with parameters bitwise equal to a run that
was never stopped."""

from __future__ import annotations

import signal
import time

import pytest

from rloo.runtime.checkpoint.verify import latest_checkpoint, list_checkpoints, step_of, verify_checkpoint

from ._helpers import assert_params_moved, assert_same_params, metric_steps
from ._runner import run_cli

ARGS = [
    "reward_fn=reliability._helpers:reward_short",
    "steps=8",
    "batch_size=2",
    "k=2",
    "max_new_tokens=5",
    "lr=3e-3",
    "warmup_steps=2",
    "save_every=2",
    "keep_checkpoints=2",
    "eval_every=4",
    "eval_prompts=2",
    "eval.batch_size=2",
]


def _argv(tiny_model_dir, out, *extra):
    return ["train", f"policy={tiny_model_dir}", f"output_dir={out}", *ARGS, *extra]


@pytest.fixture(scope="module")
def cli_reference(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cliref") / "run"
    rc, text = run_cli(_argv(tiny_model_dir, out), out.parent / "log.txt")
    assert rc == 0, text
    assert_params_moved(tiny_model_dir, out / "model")
    return out


def _resume(tiny_model_dir, out, fault, n):
    return run_cli(_argv(tiny_model_dir, out, "--resume"), out.parent / f"log{n}.txt", fault)


def test_killed_three_times_then_resumed_equals_uninterrupted(cli_reference, tiny_model_dir, tmp_path):
    """SIGTERM mid-step 3, SIGKILL while writing checkpoint 6, SIGKILL mid-step 7; each resumed."""
    out = tmp_path / "run"
    rc, text = run_cli(_argv(tiny_model_dir, out), tmp_path / "log0.txt", "term@3")
    assert rc == 128 + signal.SIGTERM, text
    last = text.strip().splitlines()[-1]
    assert last == (
        f"rloo train: interrupted: SIGTERM received; stopped at step 3/8 and saved {out}/checkpoints/step-000003; "
        f"continue with the same command plus --resume"
    )
    assert [step_of(c) for c in list_checkpoints(out)] == [2, 3]

    rc, text = _resume(tiny_model_dir, out, "kill-ckpt@6", 1)
    assert rc == -signal.SIGKILL, text
    assert "resuming from" in text and "step-000003 at step 3" in text
    partial = out / "checkpoints" / ".tmp-step-000006"
    assert partial.exists() and not (out / "checkpoints" / "step-000006").exists()
    assert step_of(latest_checkpoint(out)) == 4 and verify_checkpoint(out / "checkpoints" / "step-000004") is None

    rc, text = _resume(tiny_model_dir, out, "kill@7", 2)
    assert rc == -signal.SIGKILL, text
    assert "skipping unfinished checkpoint" in text and "at step 4" in text
    assert not partial.exists()
    assert 7 in metric_steps(out)  # logged by the killed process, after its last checkpoint

    rc, text = _resume(tiny_model_dir, out, None, 3)
    assert rc == 0, text
    assert_same_params(cli_reference / "model", out / "model")
    assert metric_steps(out) == list(range(1, 9)), "steps logged after a checkpoint are not duplicated"
    assert metric_steps(out, "eval/win_rate") == metric_steps(cli_reference, "eval/win_rate")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["int@1", "kill-ckpt@2", "kill-rename@4", "term@8", "kill@8"])
def test_single_fault_then_resume_equals_uninterrupted(fault, cli_reference, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    rc, text = run_cli(_argv(tiny_model_dir, out), tmp_path / "log0.txt", fault)
    assert rc != 0, text
    rc, text = _resume(tiny_model_dir, out, None, 1)
    assert rc == 0, text
    assert_same_params(cli_reference / "model", out / "model")
    assert metric_steps(out) == list(range(1, 9))


@pytest.mark.slow
def test_external_sigterm_at_an_arbitrary_moment(cli_reference, tiny_model_dir, tmp_path):
    """A SIGTERM from outside, whenever it lands (rollout, backward, eval, checkpoint), loses nothing."""
    import multiprocessing as mp

    from ._runner import _child, _context

    out = tmp_path / "run"
    proc = _context().Process(target=_child, args=(_argv(tiny_model_dir, out), str(tmp_path / "log0.txt"), None))
    proc.start()
    deadline = time.time() + 300
    while not list_checkpoints(out) and time.time() < deadline and proc.is_alive():
        time.sleep(0.05)
    time.sleep(0.3)
    proc.terminate()  # SIGTERM
    proc.join()
    assert proc.exitcode in (0, 128 + signal.SIGTERM), (tmp_path / "log0.txt").read_text()
    rc, text = _resume(tiny_model_dir, out, None, 1)
    assert rc == 0, text
    assert_same_params(cli_reference / "model", out / "model")
    del mp
