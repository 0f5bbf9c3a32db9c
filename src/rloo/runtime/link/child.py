"""A helper process that lives exactly as long as its parent (the asynchronous rollout producer,
rloo.rollout.producer; docs/async.md).

Every exit path of the parent ends the child:
  - normal return, an exception, SIGINT/SIGTERM (the loop's checkpoint-and-stop): `close()`, called
    from a `finally` by the trainer, plus `atexit` and multiprocessing's own reaping of daemon children;
  - SIGKILL of the parent (no Python code runs): the child asked Linux for SIGKILL on the parent's
    death (prctl PR_SET_PDEATHSIG) and, where prctl is missing, notices os.getppid() changing while
    it polls (`parent_alive`), at least every POLL_S seconds.
Death of the child is noticed by the parent within POLL_S while it waits (`get`), as ChildDied.
"""

from __future__ import annotations

import atexit
import ctypes
import io
import os
import pickle
import queue as queue_module
import signal
import types

import torch
import torch.multiprocessing as mp

from rloo.errors import RlooError
from rloo.runtime.inputs.user_code import importable_by_name

POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ChildDied(RlooError):
    """The helper process ended while the parent needed it."""


def die_with_parent(parent_pid: int) -> None:
    """In the child, first thing: be SIGKILLed when the parent dies, and leave if it already has.
    Also ignore SIGINT and SIGHUP: a Ctrl-C or a closed terminal reaches the whole process group,
    and the parent decides when the child stops (after its checkpoint)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the getppid polling below still ends the child
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


class ChildProcess:
    """`target(parent_pid, stop, out_queue, *args)` in a spawned process, with a bounded queue back."""

    def __init__(self, target, args: tuple, name: str, queue_size: int):
        ctx = mp.get_context("spawn")  # fork would copy the trainer's threads and locks
        self.name = name
        self.queue = ctx.Queue(maxsize=queue_size)
        self.stop = ctx.Event()
        self.proc = ctx.Process(target=target, args=(os.getpid(), self.stop, self.queue, *args), daemon=True)
        self.proc.start()
        atexit.register(self.close)

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def get(self):
        """The next item from the child; ChildDied (one line) if it ended first."""
        while True:
            try:
                return self.queue.get(timeout=POLL_S)
            except queue_module.Empty:
                if not self.proc.is_alive():
                    raise self._died() from None
            except (ConnectionError, EOFError, OSError):
                # torch shares a queued tensor through the sender's process: an item put just before
                # the child died cannot be received any more
                self.proc.join(5.0)
                if self.proc.is_alive():
                    raise
                raise self._died() from None

    def _died(self) -> ChildDied:
        return ChildDied(f"the {self.name} (pid {self.pid}) {_how_it_ended(self.proc.exitcode)}")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the child and wait for it; kill it if it does not stop in `timeout` seconds."""
        if self.proc.pid is None or self.proc.exitcode is not None:
            return
        self.stop.set()
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.queue.cancel_join_thread()


def put_until(q, item, stop, parent_pid: int) -> bool:
    """In the child: put `item`, waiting while the queue is full; False if told to stop or orphaned."""
    while not stop.is_set() and parent_alive(parent_pid):
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue_module.Full:
            continue
    return False


def wait_until(ready, stop, parent_pid: int) -> bool:
    """In the child: poll `ready()` until it holds; False if told to stop or orphaned."""
    while not stop.is_set() and parent_alive(parent_pid):
        if ready():
            return True
        stop.wait(0.002)
    return False


def can_send(obj) -> bool:
    """Can `obj` be an argument of a spawned ChildProcess? Its tensors always can (shared memory); a
    function or class goes by its module's name, which the child must be able to import: not so
    for one loaded from path/to/file.py or typed into an interactive session, nor for a lambda."""
    try:
        _TensorsAside(io.BytesIO()).dump(obj)
    except Exception:  # noqa: BLE001 - any reason it cannot be pickled
        return False
    return True


class _TensorsAside(pickle.Pickler):
    """Pickles everything but tensors (checking those here would move them into shared memory)."""

    def persistent_id(self, obj):
        if isinstance(obj, (types.FunctionType, type)) and not importable_by_name(obj.__module__):
            raise pickle.PicklingError(f"{obj.__qualname__} of {obj.__module__} cannot be imported by name")
        return id(obj) if isinstance(obj, torch.Tensor) else None
