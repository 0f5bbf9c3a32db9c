"""The producer link's address on the network, checked before anything is written
(rl.producer_address, `rloo produce address=`; docs/async.md "Across machines"), and the waits
for the other side, bounded and in Python so SIGINT/SIGTERM stop them at once.

`check_trainer_address` (the trainer's preflight): the name resolves; it is an address of this
machine (the trainer listens there; binding a socket to it sends nothing); the port is free.
`resolve` alone serves the producer, which connects from elsewhere. The checks send nothing but the
name lookup (the system resolver): they only bind local sockets. `wait_for_listener` connects."""

from __future__ import annotations

import errno
import socket
import time

from rloo.config.address import split_address
from rloo.errors import ConfigError, RlooError
from rloo.runtime.tracking.log import say

PROGRESS_S = 60.0  # a "still waiting" line this often while a side waits for the other


class NobodyThere(RlooError):
    """Nothing answered at the address within the time allowed."""


def resolve(address: str, key: str) -> tuple[str, int, int]:
    """(ip, port, family) of `address`, the first the resolver gives; ConfigError (one line) naming `key`."""
    host, port = split_address(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        why = e.strerror if isinstance(e, socket.gaierror) else "not a valid host name"
        raise ConfigError(f"{key}={address}: the host {host!r} does not resolve ({why})") from None
    family, _, _, _, sockaddr = infos[0]
    return sockaddr[0], port, family


def check_trainer_address(address: str, key: str = "producer_address") -> None:
    """The trainer can listen at `address`: it resolves to an address of this machine, and the
    port is free (the rendezvous listens on every interface of this machine at that port)."""
    ip, port, family = resolve(address, key)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:
                raise ConfigError(f"{key}={address}: cannot listen at {ip} ({e.strerror})") from None
            raise ConfigError(
                f"{key}={address}: {ip} is not an address of this machine; the trainer listens at "
                "HOST:PORT, so HOST is one of its own addresses (the producer connects to it)"
            ) from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the rendezvous does
        try:
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError as e:
            what = "is in use on this machine" if e.errno == errno.EADDRINUSE else f"cannot be used ({e.strerror})"
            raise ConfigError(f"{key}={address}: port {port} {what}; choose another port") from None


class Waiting:
    """A bounded wait of `timeout` seconds for `what`, saying every PROGRESS_S how long it has waited."""

    def __init__(self, what: str, timeout: float):
        self.what, self.timeout = what, timeout
        self.start = time.monotonic()
        self.next_note = self.start + PROGRESS_S

    def left(self) -> float:
        return self.timeout - (time.monotonic() - self.start)

    def tick(self, why: str = "") -> None:
        """Between two tries: NobodyThere when the time is up, a progress line now and then, a pause.
        The pause is a plain sleep, so a signal's handler runs at once (SIGTERM stops the command)."""
        now = time.monotonic()
        if self.left() <= 0:
            raise NobodyThere(f"nothing answered within {self.timeout:g} s{f' ({why})' if why else ''}")
        if now >= self.next_note:
            say(f"still waiting for {self.what} ({now - self.start:.0f} s of {self.timeout:g} s)")
            self.next_note += PROGRESS_S
        time.sleep(min(0.2, max(0.0, self.left())))


def wait_for_listener(ip: str, port: int, family: int, wait: Waiting) -> None:
    """Block until something accepts connections at ip:port (the trainer's rendezvous), or NobodyThere.
    Done here rather than by the rendezvous client, whose retries log C++ tracebacks to stderr and
    which does not return to Python (no signal handled) until its own timeout."""
    while True:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(max(0.1, min(1.0, wait.left())))
                s.connect((ip, port))
            return
        except OSError as e:
            wait.tick(e.strerror or str(e) or type(e).__name__)
