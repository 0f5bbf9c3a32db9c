"""rloo's defaults for torch's CPU threads: how long an idle OpenMP thread spins, and how many
threads a command uses (docs/install.md, "Threads on a busy machine"; measured in
docs/results/threads/). Each applies only where the environment says nothing: a user's
OMP_NUM_THREADS, GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.

Why. torch's CPU ops run in GNU OpenMP (libgomp) teams. A thread that finishes its share of a
parallel region waits for its partner at the barrier by spinning, 300,000 spins (a few ms) by
default, before it sleeps. On a machine whose cores other processes keep busy, the partner it waits
for is often descheduled, and the spinning thread burns the time slice the partner needs: beside
8 busy loops on 2 cores two threads took 3.6x the time of one. Measured here (docs/results/threads):
the same work took 8x the CPU time with the default spin and about the 1-thread CPU time with
GOMP_SPINCOUNT=0 or OMP_WAIT_POLICY=PASSIVE, which confirms it; but a sleeping wait costs a futex
wake-up per region, ~20% of a quiet 2-thread SFT, and even without spinning two threads on cores
shared with busy processes wait for each other's turn. Hence two defaults:

1. GOMP_SPINCOUNT=SPIN (`spin_default`, set by rloo/__init__.py before torch loads libgomp, which
   reads it once; inherited by every process rloo starts): short enough that a descheduled partner
   costs little, long enough to cover the gap between two regions of a quiet step.
2. the thread count (`choose_threads`, by the CLI before a command runs, as OMP_NUM_THREADS so the
   rollout producer and vLLM's worker start from it too): the cores this process may run on less
   those other processes keep busy, at least 1. A count rloo chose is marked (CHOSEN), so that
   `--resume` takes the count recorded in the run's checkpoint instead (cpukind.resume_threads):
   a resume stays bit for bit whatever the load is then.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, MutableMapping

# ~0.1 ms of spinning (libgomp's own estimate is 100,000 spins per ms) instead of its 300,000
SPIN = "10000"
# Set beside OMP_NUM_THREADS when the count is rloo's choice, not the user's
CHOSEN = "RLOO_THREADS_CHOSEN"
LOADAVG = "/proc/loadavg"


def spin_default(environ: Mapping[str, str]) -> dict[str, str]:
    """{"GOMP_SPINCOUNT": SPIN} unless the environment sets the spin or the wait policy (either decides)."""
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return {}
    return {"GOMP_SPINCOUNT": SPIN}


def busy_elsewhere(load1: float, running: list[int]) -> float:
    """Cores other processes keep busy: the lower of the 1-minute load average and the tasks runnable
    now less this one (median of a few samples). The lower, so that fewer threads than cores are
    taken only when the last minute and the present agree: a load average still high from work that
    has just ended, or a burst of short tasks, leaves the count at the cores."""
    now = max(0.0, statistics.median(running) - 1) if running else load1
    return max(0.0, min(load1, now))


def thread_count(cores: int, busy: float) -> int:
    """The idle cores, rounded half up, clamped to 1..cores: round(cores - busy)."""
    return max(1, min(cores, math.floor(cores - busy + 0.5)))


def runnable_now(samples: int = 5, gap_s: float = 0.01) -> list[int]:
    """Runnable tasks on this machine, `samples` readings of /proc/loadavg's 4th field ("R/total");
    [] where there is no such file."""
    out = []
    for i in range(samples):
        try:
            with open(LOADAVG) as f:
                out.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return []
        if i + 1 < samples:
            time.sleep(gap_s)
    return out


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_threads(environ: MutableMapping[str, str]) -> tuple[int, int, float] | None:
    """Sets OMP_NUM_THREADS (and CHOSEN) in `environ` to the policy's count unless it is set already;
    returns (threads, cores, busy elsewhere), or None where the user's OMP_NUM_THREADS decides."""
    if environ.get("OMP_NUM_THREADS") and not chosen_by_rloo(environ):
        return None
    cores = available_cores()
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = 0.0
    busy = busy_elsewhere(load1, runnable_now())
    threads = thread_count(cores, busy)
    environ["OMP_NUM_THREADS"] = environ[CHOSEN] = str(threads)
    return threads, cores, busy


def chosen_by_rloo(environ: Mapping[str, str]) -> bool:
    """Whether OMP_NUM_THREADS is the policy's choice (a later command in the same process chooses again)."""
    return bool(environ.get(CHOSEN)) and environ.get(CHOSEN) == environ.get("OMP_NUM_THREADS")


def threads_note(threads: int, cores: int, busy: float) -> str | None:
    """The line a command prints when the policy took fewer threads than cores; None otherwise."""
    if threads >= cores:
        return None
    return (
        f"threads: {threads} of {cores} cores, other processes keep ~{busy:.1f} busy "
        "(OMP_NUM_THREADS=N chooses; docs/install.md, 'Threads on a busy machine')"
    )


def apply_thread_policy(environ: MutableMapping[str, str]) -> str | None:
    """The thread count for a command where OMP_NUM_THREADS does not set it: in `environ`, for torch
    (which reads it when first imported) and every process the command starts, and in torch itself
    where a --plugin or the preflight check imported it already. Returns the line to print, if any."""
    chosen = choose_threads(environ)
    if chosen is None:
        return None
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(chosen[0])
    return threads_note(*chosen)
