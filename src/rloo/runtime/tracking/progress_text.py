"""Plain-text progress lines (no terminal: CI, a log file, nohup) with elapsed time and an ETA."""

from __future__ import annotations

import time


def format_duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Time left if the remaining `total - done` units take as long as the `done` ones did
    (None before the first unit). `done`/`total` count units of this process (after a resume:
    since the restart)."""
    if done <= 0:
        return None
    return elapsed / done * max(0, total - done)


def progress_suffix(done: int, total: int, elapsed: float) -> str:
    """'elapsed 1m02s, ETA 3m10s' for a progress line."""
    eta = eta_seconds(done, total, elapsed)
    return f"elapsed {format_duration(elapsed)}" + ("" if eta is None else f", ETA {format_duration(eta)}")


class PlainProgress:
    """tqdm's interface for a stage's loop when stderr is not a terminal: a plain line every tenth
    of the run (and at its end), with the loop's postfix, the elapsed time and an ETA."""

    disable = True  # like a disabled tqdm: `rloo train` then prints its own lines

    def __init__(self, total: int, desc: str, write, initial: int = 0):

        self._clock = time.perf_counter
        self.total, self.desc, self.write, self.n, self.start = total, desc, write, initial, initial
        self.every, self.t0, self.postfix = max(1, total // 10), self._clock(), ""

    def set_postfix(self, **values) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n % self.every == 0 or self.n == self.total:
            when = progress_suffix(self.n - self.start, self.total - self.start, self._clock() - self.t0)
            self.write(f"{self.desc} {self.n}/{self.total}: {self.postfix} ({when})".replace(":  (", ": ("))

    def close(self) -> None:
        pass
