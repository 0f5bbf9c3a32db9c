"""SIGKILL of one process of a `torchrun --nproc_per_node 2 -m rloo.cli train` run (CPU, gloo): the
run ends (torchrun stops the other process), the surviving process says in one line which rank is
gone and how to continue (no traceback of rloo's, no "writing a checkpoint" it does not write), no
process of the run is left, torchrun exits non-zero, and the newest complete checkpoint resumes to
the end under a fresh torchrun launch. (tests/unit/test_peers.py checks the line's making in process.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.child_env import child_env

from ._procs import children, cmdline, kill_all, still_alive

TESTS = Path(__file__).resolve().parents[1]
ENV = child_env(TESTS, OMP_NUM_THREADS="1")  # one thread per process: two processes on two cores
STEPS = 24  # after the kill (at step >= 4) at least 20 steps of 0.2 s or more (slow_reward) remain
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "-m", "rloo.cli"]


def _argv(tiny_model_dir, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        f"policy={tiny_model_dir}",
        f"output_dir={out}",
        "reward_fn=reliability._procs:slow_reward",
        f"steps={STEPS}",
        "batch_size=4",  # 2 prompts per process
        "k=2",
        "max_new_tokens=5",
        "eval_every=null",
        "save_every=3",
        *extra,
    ]


def _rank(pid: int) -> int | None:
    try:
        env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [int(v[5:]) for v in env if v.startswith(b"RANK=")]
    return found[0] if found else None


def _ranks(launcher: int) -> dict[int, int]:
    """rank -> pid of the trainer processes under a torchrun launcher."""
    procs = [p for p in children(launcher) if "rloo.cli" in cmdline(p) and "spawn_main" not in cmdline(p)]
    return {r: p for p in procs if (r := _rank(p)) is not None}


def _wait_for_checkpoint(out: Path, proc: subprocess.Popen, steps: int, timeout: float = 600) -> None:
    """Until `steps` steps are logged and a checkpoint is complete."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, "the run ended before it could be killed"
        logged = (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []
        if len(logged) >= steps and list((out / "checkpoints").glob("step-*/COMPLETE")):
            return
        time.sleep(0.05)
    raise TimeoutError(f"no checkpoint and {steps} steps in {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_of_one_rank_is_one_line_and_the_checkpoint_resumes(tiny_model_dir, tmp_path, victim):
    out = tmp_path / "run"
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        proc = subprocess.Popen([*TORCHRUN, *_argv(tiny_model_dir, out)], stdout=f, stderr=subprocess.STDOUT, env=ENV)
    family: list[int] = []
    try:
        _wait_for_checkpoint(out, proc, 4)
        ranks = _ranks(proc.pid)
        assert sorted(ranks) == [0, 1], [(p, cmdline(p)) for p in children(proc.pid)]
        family = children(proc.pid)
        os.kill(ranks[victim], signal.SIGKILL)
        assert proc.wait(120) != 0  # no hang: torchrun stops the survivor, and reports the failure
        assert not still_alive(family, 30)
    finally:  # a failed check leaves nothing running either
        kill_all([proc.pid, *family])
    text = log.read_text()
    survivor = 1 - victim
    ours = [line for line in text.splitlines() if line.startswith("rloo train:")]  # not the progress lines
    assert len(ours) == 1, text
    line = ours[0]
    assert line.startswith(f"rloo train: error: rank {victim} of 2 (pid {ranks[victim]}) is gone"), text
    assert f"rank {survivor}" in line and "--resume" in line, line
    # neither torch's rank-prefixed traceback of the survivor nor a frame of rloo's code
    assert f"[rank{survivor}]" not in text and "/rloo/" not in text, text
    assert "writing a checkpoint" not in text, text  # the survivor's step could not finish: none is written
    newest = sorted((out / "checkpoints").glob("step-*/COMPLETE"))[-1].parent
    assert str(newest) in line, line

    with open(tmp_path / "resume.txt", "w") as f:
        argv = [*TORCHRUN, *_argv(tiny_model_dir, out, "--resume")]
        resumed = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=ENV, timeout=600)
    assert resumed.returncode == 0, (tmp_path / "resume.txt").read_text()
    assert f"resuming from {newest} at step" in (tmp_path / "resume.txt").read_text()
    records = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss/policy" in r] == list(range(1, STEPS + 1))
    assert (out / "model" / "model.safetensors").exists()
