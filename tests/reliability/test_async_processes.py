"""The rollout producer process (rl.max_staleness > 0, rloo.rollout.producer; docs/async.md) lives and
dies with its trainer: SIGKILL of the trainer leaves no process behind; SIGKILL of the producer stops
the trainer with one line and a checkpoint, and --resume finishes the run exactly as a run that was
never stopped (tests/reliability/test_async_resume.py checks more cases in process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_env import child_env

from ._helpers import assert_same_params
from ._procs import Cli, children, cmdline, kill_all, metrics, still_alive, wait_for_steps

TESTS = Path(__file__).resolve().parents[1]
ENV = child_env(TESTS, OMP_NUM_THREADS="2")
# the run that is resumed to its end: after step 2 is logged, 10 more of at least 0.2 s each
# (slow_reward) remain to kill its producer in; runs that are stopped for good have 30
STEPS = 12


def _argv(tiny_model_dir, out: Path, batch_size: int = 2, save_every: str = "5", steps: int = 30) -> list[str]:
    """`rloo train` of a `steps`-step run at max_staleness=1 with the slow reward."""
    return [
        "train",
        f"policy={tiny_model_dir}",
        f"output_dir={out}",
        "reward_fn=reliability._procs:slow_reward",
        f"steps={steps}",
        f"batch_size={batch_size}",
        "k=2",
        "max_new_tokens=5",
        "eval_every=null",
        f"save_every={save_every}",
        "max_staleness=1",
    ]


def _start(tiny_model_dir, out: Path, *extra, steps: int = 30) -> Cli:
    """The trainer with two threads (one for it, one for the producer process it starts)."""
    argv = [*_argv(tiny_model_dir, out, steps=steps), *extra]
    return Cli(argv, out.parent / f"log-{len(list(out.parent.glob('log-*')))}.txt", threads=2)


def _producer(trainer: int) -> int:
    found = [p for p in children(trainer) if "spawn_main" in cmdline(p) and "resource_tracker" not in cmdline(p)]
    assert len(found) == 1, [(p, cmdline(p)) for p in children(trainer)]
    return found[0]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_stopped_trainer_leaves_no_process(tiny_model_dir, tmp_path, sig):
    """SIGKILL: no Python code runs in the trainer (the kernel ends the producer); SIGTERM: the loop
    checkpoints and stops, and the sampler's close() ends the producer."""
    out = tmp_path / "run"
    proc = _start(tiny_model_dir, out)
    try:
        wait_for_steps(out, proc, 2)
        family = children(proc.pid)
        _producer(proc.pid)  # the producer is among them
        proc.send_signal(sig)
        assert proc.wait(300) == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM)
        assert not still_alive(family, 30)  # SIGKILL on the parent's death is at once
    finally:
        proc.kill()


def test_sigkill_of_the_producer_stops_the_trainer_with_one_line_and_resume_finishes(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _start(tiny_model_dir, out, steps=STEPS)
    reference = _start(tiny_model_dir, tmp_path / "ref", steps=STEPS)  # never stopped; runs meanwhile (log-1.txt)
    try:
        wait_for_steps(out, proc, 2)
        producer = _producer(proc.pid)
        os.kill(producer, signal.SIGKILL)
        assert proc.wait(300) == 2
        assert reference.wait(300) == 0, (tmp_path / "log-1.txt").read_text()
    finally:
        proc.kill()
        reference.kill()
    text = (tmp_path / "log-0.txt").read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"rloo train: error: the rollout producer (pid {producer}) was killed by SIGKILL (at step")
    assert "rerun with --resume" in last and "Traceback" not in text
    resumed = _start(tiny_model_dir, out, "--resume", steps=STEPS)
    assert resumed.wait(300) == 0, (tmp_path / "log-2.txt").read_text()
    records = metrics(out)
    steps = [r["step"] for r in records if "loss/policy" in r]  # the final eval adds a record at STEPS
    assert steps == list(range(1, STEPS + 1))
    # exact: the checkpoint held the older weights version, and each batch's generator is (seed, t)'s
    assert records == metrics(tmp_path / "ref")
    assert_same_params(tmp_path / "ref" / "model", out / "model")
    assert not [p for p in children(os.getpid()) if "spawn_main" in cmdline(p)]


@pytest.mark.slow  # the producer's end with its killed parent: test_a_stopped_trainer_leaves_no_process[SIGKILL]
def test_sigkill_of_one_torchrun_process_leaves_no_producer(tiny_model_dir, tmp_path):
    """Under torchrun each trainer process starts its own producer (rloo.rollout.producer): SIGKILL
    of one trainer process ends its producer with it (the kernel), torchrun then stops the other
    trainer process, whose producer ends with it: nothing of the run is left."""
    out = tmp_path / "run"
    argv = _argv(tiny_model_dir, out, batch_size=4, save_every="null")  # 2 prompts per process
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "-m", "rloo.cli"]
    log = open(tmp_path / "log.txt", "w")
    proc, family = subprocess.Popen([*run, *argv], stdout=log, stderr=subprocess.STDOUT, env=ENV), []
    try:
        wait_for_steps(out, proc, 2)
        ranks = [p for p in children(proc.pid) if "rloo.cli" in cmdline(p) and "spawn_main" not in cmdline(p)]
        ranks = [p for p in ranks if _producer_or_none(p) is not None]
        assert len(ranks) == 2, [(p, cmdline(p)) for p in children(proc.pid)]
        family = children(proc.pid)
        os.kill(ranks[0], signal.SIGKILL)
        assert proc.wait(300) != 0  # torchrun reports the failed process
        assert not still_alive(family, 60)
    finally:  # a failed check leaves nothing running either
        kill_all([proc.pid, *family])


def _producer_or_none(trainer: int) -> int | None:
    found = [p for p in children(trainer) if "spawn_main" in cmdline(p) and "resource_tracker" not in cmdline(p)]
    return found[0] if len(found) == 1 else None
