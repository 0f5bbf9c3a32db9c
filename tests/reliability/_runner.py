"""Run the real `rloo` CLI in a child process that can be killed, with faults injected at exact points.

Children are forked from a forkserver that has imported torch/transformers/rloo once, so each
run costs its training time, not 10+ s of imports. The forkserver itself never computes, so no
thread pool is live when it forks. Every child uses one torch thread unless `threads` says otherwise
(two start the rollout producer at max_staleness > 0, rloo.rollout.producer): all runs that are
compared bit for bit then do the same arithmetic in the same order.

Faults (`kind@step`), each raised by the process against itself at a deterministic point:
  term@s       SIGTERM in the middle of step s (after its metrics are logged)
  int@s        SIGINT, likewise
  hup@s        SIGHUP, likewise (a closed terminal or ssh session)
  term2@s      two SIGTERMs in the middle of step s (the second stops at once)
  kill@s       SIGKILL in the middle of step s (metrics of step s are on disk, its checkpoint is not)
  kill-ckpt@s  SIGKILL while checkpoint s is being written (model written, state.pt half written)
  kill-rename@s  SIGKILL after checkpoint s is complete in its temp folder, before the rename
  slow-config@0  writing config.yaml into a new run folder takes 1.5 s (its temp file is there
               meanwhile): the window in which other processes see a half-made run folder
  kill-log@n   SIGKILL right after the n-th metrics record of the process, whichever stage wrote it
               (SFT, reward model, RL: `rloo compare`'s cells at a chosen point)
  term-log@n   SIGTERM at the same point
  int-log@n    SIGINT at the same point
  pause@s      after logging step s, write `<log>.paused` and sleep 4 s (a run that is surely
               mid-way while a second process tries the same folder)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path

_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(
            [
                "rloo.cli",
                "rloo.training.rl",
                "torch.utils.tensorboard",
                "reliability._helpers",
                "reliability._runner",
                "reliability._procs",
            ]
        )
    return _CTX


def run_cli(
    argv: list[str], log: Path, fault: str | None = None, timeout: float = 300, threads: int = 1
) -> tuple[int, str]:
    """Run `rloo *argv` in a child; returns (exit code, or -signal if killed; its stderr+stdout)."""
    proc = _context().Process(target=_child, args=(argv, str(log), fault, threads))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise TimeoutError(f"rloo {' '.join(argv)} did not finish in {timeout}s")
    return proc.exitcode, Path(log).read_text()


def start_cli(argv: list[str], log: Path, fault: str | None = None, threads: int = 1):
    """Start `rloo *argv` in a child and return it at once (join it, read `log` after)."""
    proc = _context().Process(target=_child, args=(argv, str(log), fault, threads))
    proc.start()
    return proc


def start_lock_holder(folder: Path, ready_dir: Path, seconds: float = 60, shared: bool = False):
    """A child that holds `folder`'s run lock (reliability._helpers.hold_lock); returned once it does."""
    import time

    from ._helpers import hold_lock

    ready = Path(ready_dir) / f"ready-{folder.name}-{time.monotonic_ns()}"
    proc = _context().Process(target=hold_lock, args=(str(folder), str(ready), seconds, False, shared))
    proc.start()
    t0 = time.monotonic()
    while not ready.exists():
        assert proc.is_alive() and time.monotonic() - t0 < 60, "the lock holder did not start"
        time.sleep(0.05)
    return proc


def _child(argv, log, fault, threads=1):
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import torch

    torch.set_num_threads(threads)
    if fault:
        _install(*fault.split("@"), log=log)
    from rloo.cli import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _install(kind: str, at: str, log: str = "") -> None:
    import rloo.runtime.checkpoint.save as ck
    import rloo.runtime.tracking.log as tracking

    at = int(at)
    me = os.getpid()
    if kind == "slow-config":
        import time

        import rloo.training.common as common

        real_write = common.atomic_write_text

        def slow_write(path, text):
            Path(path).with_name(f".{Path(path).name}.tmp").write_text(text)
            time.sleep(1.5)
            real_write(path, text)

        common.atomic_write_text = slow_write
    elif kind == "pause":
        import time

        real_log = tracking.MetricsLogger.log

        def log_then_pause(self, step, metrics):
            real_log(self, step, metrics)
            if step == at and "loss/policy" in metrics:
                Path(log + ".paused").write_text(str(me))
                time.sleep(4)

        tracking.MetricsLogger.log = log_then_pause
    elif kind in ("kill-log", "term-log", "int-log"):  # a signal right after the at-th metrics record of any stage
        real_log = tracking.MetricsLogger.log
        calls = [0]
        sig = {"kill-log": signal.SIGKILL, "term-log": signal.SIGTERM, "int-log": signal.SIGINT}[kind]

        def log_then_die(self, step, metrics):
            real_log(self, step, metrics)
            calls[0] += 1
            if calls[0] == at:
                os.kill(me, sig)

        tracking.MetricsLogger.log = log_then_die
    elif kind in ("term", "int", "hup", "kill", "term2"):
        sig = {"term": signal.SIGTERM, "int": signal.SIGINT, "hup": signal.SIGHUP, "kill": signal.SIGKILL}.get(
            kind, signal.SIGTERM
        )
        real_log = tracking.MetricsLogger.log

        def log(self, step, metrics):
            real_log(self, step, metrics)
            if step == at and "loss/policy" in metrics:
                for _ in range(2 if kind == "term2" else 1):
                    os.kill(me, sig)

        tracking.MetricsLogger.log = log
    elif kind == "kill-ckpt":
        real_state = ck.write_state

        def write_state(state, path):
            if state["step"] == at:
                real_state(state, path)
                data = Path(path).read_bytes()
                Path(path).write_bytes(data[: len(data) // 2])
                os.kill(me, signal.SIGKILL)
            real_state(state, path)

        ck.write_state = write_state
    elif kind == "kill-rename":
        real_replace = ck._replace_dir

        def replace(src, dst):
            if dst.name == f"step-{at:06d}":
                os.kill(me, signal.SIGKILL)
            real_replace(src, dst)

        ck._replace_dir = replace
    else:
        raise ValueError(f"unknown fault {kind!r}")
