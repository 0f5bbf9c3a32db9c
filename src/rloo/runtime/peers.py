"""Which processes of a torchrun run are gone, and the one line a surviving process says about them.

A process of a torchrun run that is killed mid-run (SIGKILL, the kernel's OOM killer) closes its
connections: every other process then fails in its next collective (gloo: "Connection closed by
peer"; NCCL: an error or its timeout) and torchrun sends each a SIGTERM. Left alone, a survivor
printed 60 lines of its own collective's traceback, prefixed `[rank0]:`. Instead each process
records at the start who its peers are (`Peer`: host, pid, start time, gathered by
rloo.runtime.distributed.init), and a survivor looks its peers on the same host up in /proc
(`gone_ranks`), so that its one line names the rank that is gone and how to continue (`lost_line`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rloo.errors import how_to_continue

# Texts of a collective that failed because a peer went away, where torch raises a plain RuntimeError
# (gloo's transport); torch's own DistError subclasses are told apart by class (`collective_failed`)
PEER_FAILURES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo/transport")
# Seconds a survivor waits for a dead peer to show as gone in /proc: a killed process closes its
# sockets (the survivor's collective fails) a moment before the kernel marks it a zombie
GONE_WAIT_S = 2.0


@dataclass(frozen=True)
class Peer:
    """A process of the run: its host, pid and start time (clock ticks after boot, /proc/PID/stat's
    field 22; None where there is no /proc), so that a pid reused by another process is not taken for it."""

    host: str
    pid: int
    started: int | None


def start_time(pid: int) -> int | None:
    """The start time of process `pid`, or None when there is no such process or it is a zombie (dead,
    not yet reaped by torchrun)."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def this_process() -> Peer:
    return Peer(socket.gethostname(), os.getpid(), start_time(os.getpid()))


def is_gone(peer: Peer, host: str) -> bool:
    """Whether `peer` is known to have ended: only peers on this host (`host`) whose start time was
    recorded can be looked up; others count as running."""
    return peer.host == host and peer.started is not None and start_time(peer.pid) != peer.started


def gone_ranks(peers: Sequence[Peer], rank: int, wait_s: float = 0.0) -> list[int]:
    """The ranks of `peers` (indexed by rank) other than `rank` that are gone, looked up for up to
    `wait_s` seconds until one is."""
    host, deadline = socket.gethostname(), time.monotonic() + wait_s
    while True:
        gone = [r for r, p in enumerate(peers) if r != rank and is_gone(p, host)]
        if gone or time.monotonic() >= deadline:
            return gone
        time.sleep(0.05)


def collective_failed(e: BaseException) -> bool:
    """Whether `e` is a collective's failure to reach a peer: torch's DistError family (NCCL errors,
    store and network errors) or gloo's RuntimeError about a closed connection."""
    if any(c.__name__ in ("DistError", "DistBackendError", "DistNetworkError") for c in type(e).__mro__):
        return True
    return isinstance(e, RuntimeError) and any(t in str(e) for t in PEER_FAILURES)


def lost_line(gone: Sequence[int], peers: Sequence[Peer], rank: int, then: str) -> str:
    """`rank 1 of 2 (pid 9712) is gone (...); this process (rank 0) stopped with it; <then>` where
    `then` says how to continue."""
    world = len(peers)
    who = ", ".join(f"rank {r} of {world} (pid {peers[r].pid})" for r in gone)
    verb = "is" if len(gone) == 1 else "are"
    return (
        f"{who} {verb} gone (killed, or it crashed: torchrun's summary says how it ended); "
        f"this process (rank {rank}) stopped with it; {then}"
    )


def unknown_line(e: BaseException, rank: int, world: int, then: str) -> str:
    """A collective failed but no peer on this host is gone (one on another host, say)."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return (
        f"another process of the run stopped: a collective of rank {rank} of {world} failed ({first}); "
        f"torchrun's summary names it; {then}"
    )


def how_to_resume(newest: Path | None) -> str:
    """How a run whose newest complete checkpoint is `newest` (None: none yet) continues."""
    where = f"the newest complete checkpoint is {newest}" if newest is not None else "no checkpoint yet (step 0)"
    return f"{where}; {how_to_continue(True)}"
