"""What the micro-benchmark scripts beside this file share: a median timing and their common flags.

from microbench import median_ms, script_args      # the scripts run as `python benchmarks/X.py`
"""

from __future__ import annotations

import argparse
import statistics
import time


def median_ms(fn, reps: int, warmup: int = 1) -> float:
    """The median wall time of `reps` calls of fn(), in ms, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def script_args(doc: str, *, threads: int, reps: int, rounds: int) -> argparse.Namespace:
    """--threads, --reps, --rounds and --json FILE, with these defaults; the description is doc's first line."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--json", default=None)
    return ap.parse_args()
