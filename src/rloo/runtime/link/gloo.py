"""A two-process link over torch.distributed (Gloo, TCP) for the rollout producer on another machine
(rl.producer_address, rloo.rollout.remote; docs/async.md "Across machines").

Rank 0 (the trainer) hosts the rendezvous store at HOST:PORT and waits for rank 1 (`rloo produce
HOST:PORT`) to join; then both hold a Gloo process group of two, apart from the default group (so
it does not collide with torchrun's). What travels: tensors as they are (`send_tensors`, received
in place), and objects as torch.save bytes in a uint8 tensor after their length (`send_object`).
Sends are asynchronous: the caller settles them (waits) before it changes their tensors, at a
point where the peer is known to have received them; Gloo matches a pair's messages of one tag
in order. A peer that dies closes its sockets: the other side's
next wait raises `LinkClosed` at once (one line), not after the timeout.
"""

from __future__ import annotations

import datetime
import io

import torch
import torch.distributed as dist

from rloo.errors import RlooError
from rloo.runtime.link.address import NobodyThere, Waiting, resolve, wait_for_listener
from rloo.runtime.threads import call_all

# A wait longer than this is an error: the trainer's update, eval and checkpoint between two
# weight versions, or the producer's batch, must fit in it (a peer that died is seen at once).
WAIT = datetime.timedelta(hours=1)


class LinkClosed(RlooError):
    """The other process went away (or never came)."""


class LinkTimeout(LinkClosed):
    """Nobody came at the address within the time allowed."""


class LinkTaken(RlooError):
    """The trainer at the address already has its producer (a second `rloo produce` for one run)."""


JOINED = "rloo/producer-joined"  # the store key the producer adds 1 to on joining
# A listener that accepts but does not answer as a rendezvous within this (or connect_timeout, if
# shorter) is refused; so is a peer that joined but does not complete the group.
HANDSHAKE_S = 30.0


class Link:
    """The link's two ends: rank 0 listens at `address` and waits up to `connect_timeout` seconds for
    rank 1, which waits as long for rank 0 to listen. Every wait runs in Python (bounded; a signal
    stops it at once); the native rendezvous calls run in a helper thread with a deadline, since they
    return to Python only at their own timeout (a listener that never answers: never)."""

    def __init__(self, address: str, rank: int, connect_timeout: float):
        self.address, self.peer = address, 1 - rank
        ip, port, family = resolve(address, "producer_address" if rank == 0 else "address")
        wait = Waiting(f"the {'rollout producer' if rank == 0 else 'trainer'} at {address}", connect_timeout)
        try:
            if rank != 0:
                wait_for_listener(ip, port, family, wait)
            handshake = min(HANDSHAKE_S, connect_timeout)
            self.store = _bounded(lambda: _store(ip, port, rank == 0, connect_timeout), handshake)
            if rank == 0:
                while not self.store.check([JOINED]):
                    wait.tick()
            elif self.store.add(JOINED, 1) > 1:
                raise LinkTaken(f"the trainer at {address} already has its rollout producer (one per run)")
            self.group = _bounded(lambda: dist.ProcessGroupGloo(self.store, rank, 2, WAIT), handshake)
        except NobodyThere as e:
            raise LinkTimeout(str(e)) from None
        except (RuntimeError, OSError) as e:  # DistStoreError is a RuntimeError
            raise LinkClosed(_reason(e)) from e

    def send_tensors(self, tensors: list[torch.Tensor], tag: int) -> list:
        """Start sending `tensors`; the sends (each holds its tensor), to `settle` before the tensors
        change. A send settles once the peer has received it (Gloo reports it done only on wait)."""
        return [self._call(self.group.send, [t], self.peer, tag) for t in tensors]

    def recv_tensors(self, into: list[torch.Tensor], tag: int) -> None:
        for t in into:
            self._wait(self._call(self.group.recv, [t], self.peer, tag))

    def send_object(self, obj, tag: int) -> list:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)
        return self.send_tensors([torch.tensor([payload.numel()]), payload], tag)

    def recv_object(self, tag: int):
        size = torch.zeros(1, dtype=torch.long)
        self.recv_tensors([size], tag)
        payload = torch.empty(int(size), dtype=torch.uint8)
        self.recv_tensors([payload], tag)
        return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)

    def settle(self, sends: list) -> None:
        """Wait until `sends` have reached the peer (LinkClosed if it went away)."""
        for work in sends:
            self._wait(work)

    def _call(self, op, *args):
        try:
            return op(*args)
        except RuntimeError as e:
            raise LinkClosed(_reason(e)) from e

    def _wait(self, work) -> None:
        try:
            work.wait()
        except RuntimeError as e:
            raise LinkClosed(_reason(e)) from e


def _reason(e: Exception) -> str:
    """Gloo's and the store's messages, shortened to what happened."""
    text = " ".join(str(e).split())
    for known, said in (
        ("connection closed by peer", "the connection was closed by the other side"),
        ("connection reset", "the connection was reset"),
        ("timed out", "timed out"),
        ("connection refused", "nothing listens there"),
        ("address already in use", "the port is in use"),
    ):
        if known in text.lower():
            return said
    return text[:200]


def _store(ip: str, port: int, listen: bool, timeout: float):
    """The rendezvous store at ip:port, hosted here (`listen`) or joined; no worker counting (the
    trainer waits for JOINED itself, in Python)."""
    return dist.TCPStore(ip, port, None, listen, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)


def _bounded(fn, timeout: float):
    """fn() in a helper thread, waited for at most `timeout` s (a signal interrupts the wait); a call
    still running then is left behind (it holds no lock of ours) and NobodyThere raised."""
    status, value = call_all([fn], timeout)[0]
    if status == "raised":
        raise value  # type: ignore[misc]
    if status == "timeout":
        raise NobodyThere(f"something listens there but did not answer as an rloo rendezvous within {timeout:g} s")
    return value
