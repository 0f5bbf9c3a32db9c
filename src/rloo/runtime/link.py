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
import socket
import time

import torch
import torch.distributed as dist

from rloo.config.base import split_address
from rloo.errors import RlooError

# A wait longer than this is an error: the trainer's update, eval and checkpoint between two
# weight versions, or the producer's batch, must fit in it (a peer that died is seen at once).
WAIT = datetime.timedelta(hours=1)


class LinkClosed(RlooError):
    """The other process went away (or never came)."""


def wait_for_listener(host: str, port: int, timeout: float) -> None:
    """Block until something accepts connections at host:port (the trainer's store), or LinkClosed.
    Done here rather than by the store's client, whose retries log C++ tracebacks to stderr."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise LinkClosed(f"nothing answered within {timeout:g} s: {e.strerror or e}") from e
            time.sleep(0.2)


class Link:
    def __init__(self, address: str, rank: int, connect_timeout: float):
        host, port = split_address(address)
        self.address, self.peer = address, 1 - rank
        if rank != 0:
            wait_for_listener(host, port, connect_timeout)
        try:
            self.store = dist.TCPStore(
                host,
                port,
                2,
                rank == 0,
                timeout=datetime.timedelta(seconds=connect_timeout),
                wait_for_workers=True,
            )
            self.group = dist.ProcessGroupGloo(self.store, rank, 2, WAIT)
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
