"""Plain-text progress lines (no terminal: CI, a log file, nohup) with elapsed time and an ETA."""

from __future__ import annotations


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
