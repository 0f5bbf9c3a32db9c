"""Process-tree helpers of the producer tests (test_async_processes.py, test_remote_producer.py,
test_producer_address.py): a CLI child with Popen's interface, the processes under a pid, waits.

The trainers and producers are children of the forkserver of `_runner` (torch and rloo imported
once for the session, each child forked from it) instead of fresh interpreters, which cost 3-5 s
of CPU each importing torch and rloo: the process trees the tests kill are the same (the trainer, a
real process; its producer, spawned by it as in any run)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from ._runner import start_cli


def slow_reward(prompts, completions):
    """reward_short, 0.2 s a batch: a run stays mid-way long enough to be killed there."""
    time.sleep(0.2)
    return [-len(c.split()) / 10 for c in completions]


class Cli:
    """`rloo *argv` in a forkserver child (reliability._runner), stdout and stderr to `log`, with the
    part of subprocess.Popen's interface the tests use (an exit by signal s is -s, as there)."""

    def __init__(self, argv: list[str], log: Path, threads: int = 1):
        Path(log).touch()  # there at once, as Popen's: a caller may name the next log by counting them
        self.proc = start_cli(argv, log, threads=threads)
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    def wait(self, timeout: float) -> int:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise TimeoutError(f"process {self.pid} still running after {timeout} s")
        return self.proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self.proc.exitcode is None:
            import os

            os.kill(self.pid, sig)

    def kill(self) -> None:
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join()


def remote_trainer(tiny_model_dir, out: Path, address: str | None, *extra, steps=10, reward="slow_reward"):
    """`rloo train` at max_staleness=2, one thread (_runner), its producer on `address` or, with
    None, the lag simulated in the trainer's process (LaggedSampler)."""
    argv = [
        "train",
        f"policy={tiny_model_dir}",
        f"output_dir={out}",
        f"reward_fn=reliability._procs:{reward}",
        f"steps={steps}",
        "batch_size=2",
        "k=2",
        "max_new_tokens=5",
        "eval_every=null",
        "save_every=3",
        "max_staleness=2",
        *([f"producer_address={address}"] if address else []),
        *extra,
    ]
    return Cli(argv, out.parent / f"{out.name}-trainer.txt")


def remote_producer(log: Path, address: str, *extra) -> Cli:
    return Cli(["produce", f"address={address}", "threads=1", *extra], log)


def children(pid: int) -> list[int]:
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
    return found + [g for c in found for g in children(c)]


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever adopted it, counts as gone)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def still_alive(family: list[int], timeout: float) -> list[tuple[int, str]]:
    """The processes of `family` (pid, command line) still running after up to `timeout` s: a process
    that ends with its parent ends at once, the slack is for a loaded machine."""
    t0 = time.monotonic()
    while any(alive(p) for p in family) and time.monotonic() - t0 < timeout:
        time.sleep(0.05)
    return [(p, cmdline(p)) for p in family if alive(p)]


def kill_all(pids: list[int]) -> None:
    """SIGKILL what is left of a test's processes, so a failed check leaves nothing running."""
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_for_steps(out: Path, proc, n: int, timeout: float = 600) -> None:
    metrics, t0 = out / "metrics.jsonl", time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, "the run ended before it could be killed"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {n} steps in {timeout} s")


def metrics(out: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock times."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_line(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text and "frame #" not in text, text  # neither Python's nor c10d's
    return text.strip().splitlines()[-1]
