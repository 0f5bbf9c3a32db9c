"""The rollout producer process (rl.max_staleness > 0, rloo.rollout.producer; docs/async.md) lives and
dies with its trainer: SIGKILL of the trainer leaves no process behind; SIGKILL of the producer stops
the trainer with one line and a checkpoint, and --resume finishes the run exactly as a run that was
never stopped (tests/reliability/test_async_resume.py checks more cases in process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ._helpers import assert_same_params

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
CLI = "import sys; from rloo.cli import main; sys.exit(main(sys.argv[1:]))"


def slow_reward(prompts, completions):
    """reward_short, 0.2 s a batch: a run stays mid-way long enough to be killed there."""
    time.sleep(0.2)
    return [-len(c.split()) / 10 for c in completions]


ENV = os.environ | {"PYTHONPATH": f"{SRC}{os.pathsep}{TESTS}", "OMP_NUM_THREADS": "2"}


def _argv(tiny_model_dir, out: Path, batch_size: int = 2, save_every: str = "5") -> list[str]:
    """`rloo train` of a 30-step run at max_staleness=1 with the slow reward."""
    return [
        "train",
        f"policy={tiny_model_dir}",
        f"output_dir={out}",
        "reward_fn=reliability.test_async_processes:slow_reward",
        "steps=30",
        f"batch_size={batch_size}",
        "k=2",
        "max_new_tokens=5",
        "eval_every=null",
        f"save_every={save_every}",
        "max_staleness=1",
    ]


def _start(tiny_model_dir, out: Path, *extra) -> subprocess.Popen:
    argv = [*_argv(tiny_model_dir, out), *extra]
    log = open(out.parent / f"log-{len(list(out.parent.glob('log-*')))}.txt", "w")
    return subprocess.Popen([sys.executable, "-c", CLI, *argv], stdout=log, stderr=subprocess.STDOUT, env=ENV)


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (recursively)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found + [g for c in found for g in _children(c)]


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever adopted it, counts as gone)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_for_steps(out: Path, proc: subprocess.Popen, n: int, timeout: float = 600) -> None:
    metrics, t0 = out / "metrics.jsonl", time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, "the run ended before it could be killed"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {n} steps in {timeout} s")


def _producer(trainer: int) -> int:
    found = [p for p in _children(trainer) if "spawn_main" in _cmdline(p) and "resource_tracker" not in _cmdline(p)]
    assert len(found) == 1, [(p, _cmdline(p)) for p in _children(trainer)]
    return found[0]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_stopped_trainer_leaves_no_process(tiny_model_dir, tmp_path, sig):
    """SIGKILL: no Python code runs in the trainer (the kernel ends the producer); SIGTERM: the loop
    checkpoints and stops, and the sampler's close() ends the producer."""
    out = tmp_path / "run"
    proc = _start(tiny_model_dir, out)
    try:
        _wait_for_steps(out, proc, 2)
        family = _children(proc.pid)
        _producer(proc.pid)  # the producer is among them
        proc.send_signal(sig)
        assert proc.wait(300) == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM)
        t0 = time.monotonic()
        while (
            any(_alive(p) for p in family) and time.monotonic() - t0 < 30
        ):  # SIGKILL on the parent's death is at once; slack for a loaded machine
            time.sleep(0.05)
        assert not [(p, _cmdline(p)) for p in family if _alive(p)]
    finally:
        proc.kill()


def _metrics(out: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock times."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def test_sigkill_of_the_producer_stops_the_trainer_with_one_line_and_resume_finishes(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    proc = _start(tiny_model_dir, out)
    reference = _start(tiny_model_dir, tmp_path / "ref")  # never stopped; runs meanwhile (log-1.txt)
    try:
        _wait_for_steps(out, proc, 2)
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
    resumed = _start(tiny_model_dir, out, "--resume")
    assert resumed.wait(300) == 0, (tmp_path / "log-2.txt").read_text()
    records = _metrics(out)
    steps = [r["step"] for r in records if "loss/policy" in r]  # the final eval adds a record at 30
    assert steps == list(range(1, 31))
    # exact: the checkpoint held the older weights version, and each batch's generator is (seed, t)'s
    assert records == _metrics(tmp_path / "ref")
    assert_same_params(tmp_path / "ref" / "model", out / "model")
    assert not [p for p in _children(os.getpid()) if "spawn_main" in _cmdline(p)]


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
        _wait_for_steps(out, proc, 2)
        ranks = [p for p in _children(proc.pid) if "rloo.cli" in _cmdline(p) and "spawn_main" not in _cmdline(p)]
        ranks = [p for p in ranks if _producer_or_none(p) is not None]
        assert len(ranks) == 2, [(p, _cmdline(p)) for p in _children(proc.pid)]
        family = _children(proc.pid)
        os.kill(ranks[0], signal.SIGKILL)
        assert proc.wait(300) != 0  # torchrun reports the failed process
        t0 = time.monotonic()
        while any(_alive(p) for p in family) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert not [(p, _cmdline(p)) for p in family if _alive(p)]
    finally:  # a failed check leaves nothing running either
        for p in [proc.pid, *family]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _producer_or_none(trainer: int) -> int | None:
    found = [p for p in _children(trainer) if "spawn_main" in _cmdline(p) and "resource_tracker" not in _cmdline(p)]
    return found[0] if len(found) == 1 else None
