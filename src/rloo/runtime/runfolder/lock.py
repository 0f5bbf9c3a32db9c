"""One process per run folder: an OS file lock (`flock`) on `<run>/.rloo.lock`, held for the whole stage.

The kernel releases a `flock` when its holder exits, however it exits (`kill -9` included), so a
lock file left by a dead process is never "held": the next run takes it over and says whose it
was. The file records the holder's PID, host and command, so a refused process can name it.

A stage wraps its body in `run_folder(out)`: the lock is taken at once when `out` already
exists (before a resume reads any checkpoint), else by `prepare_output_dir` right after it
creates the folder, so a run refused for bad input never creates a folder just for its lock.
The lock file is removed when the stage ends, leaving the folder as the run left it.
Re-entrant within a process (the pipeline's stages, `rloo compare`'s cells).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import ParamSpec, TypeVar, cast

from rloo.errors import RlooError
from rloo.runtime.runfolder.confine import confine, hold_root, release_root

LOCK_NAME = ".rloo.lock"
P = ParamSpec("P")  # a stage's parameters and result type, which holds_run_folder keeps
R = TypeVar("R")


class RunFolderBusy(RlooError):
    """Another live process holds the run folder's lock."""


class LockFileUnsafe(RlooError):
    """The lock file is a symbolic link, a hard link or not a regular file: rloo never writes through it."""


# O_NOFOLLOW: a `.rloo.lock` planted as a link to someone's file must never be truncated and
# overwritten with the lock record; O_NONBLOCK: a fifo planted there must not hang the open.
_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_lock_file(path: Path, flags: int) -> int:
    """Open a lock file without following a link; LockFileUnsafe (one line naming it) for a
    symbolic link, a hard-linked file or anything but a regular file."""
    try:
        fd = os.open(path, flags | _SAFE, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP and Path(path).is_symlink():  # is_symlink: lstat of the lock itself
            raise _unsafe(path, "a symbolic link") from None
        if e.errno == errno.ELOOP:  # the lock is no link: a folder above it loops
            raise RlooError(
                f"output_dir {str(Path(path).parent)!r} cannot be used: it is or lies under a symbolic link "
                "loop; remove the link or choose another output_dir"
            ) from None
        raise
    st = os.fstat(fd)
    why = "not a regular file" if not stat.S_ISREG(st.st_mode) else "hard-linked" if st.st_nlink > 1 else None
    if why:
        os.close(fd)
        raise _unsafe(path, why)
    return fd


def _unsafe(path: Path, what: str) -> LockFileUnsafe:
    return LockFileUnsafe(
        f"the lock file {path} is {what}; rloo never writes through it (it could overwrite another file): "
        f"remove it and rerun (nothing was changed)"
    )


class _Lock:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None
        self.roots: tuple[str, ...] = ()  # its keys in rloo.runtime.runfolder.confine while held

    def acquire(self) -> None:
        """Take the lock or raise RunFolderBusy naming the holder; never waits. A run folder inside
        one this process holds (a pipeline's stage) must not be a link (rloo.runtime.runfolder.confine)."""
        confine(self.folder, folder=True)
        while self.fd is None:
            fd = open_lock_file(self.path, os.O_RDWR | os.O_CREAT)
            if not try_flock(fd, fcntl.LOCK_EX):
                os.close(fd)
                raise _busy(self.folder, self.path)
            # The previous holder may have removed the file between our open and our flock: then we
            # hold a lock on a deleted file that nobody else can see. Retry on the current file.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.fd = fd
        self.roots = hold_root(self.folder)
        stale = _read_holder(self.path, wait=0)
        if stale is not None and _fields(stale).get("pid") != os.getpid():
            print(f"note: took over the lock of {_describe(stale)}, which is no longer running", file=sys.stderr)
        record = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.time(),
                "command": " ".join(sys.argv[:2])[:200],
            }
        )
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, record.encode(), 0)

    def release(self) -> None:
        if self.fd is None:
            return
        # unlink while still holding it: a waiting process then retries on a fresh file (see acquire)
        with suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None
        release_root(self.roots)


def try_flock(fd: int, mode: int, tries: int = 10) -> bool:
    """Non-blocking flock, retried for ~0.2 s: a probe (refuse_if_busy) holds the lock for
    microseconds, which must not look like a run holding it."""
    for i in range(tries):
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if i + 1 < tries:
                time.sleep(0.02)
    return False


def _busy(folder: Path, path: Path) -> RunFolderBusy:
    return RunFolderBusy(
        f"{folder} is in use by {_describe(_read_holder(path))}; wait for it to finish or choose another output_dir"
    )


def _read_holder(path: Path, wait: float = 1.0) -> object | None:
    """The holder's record as parsed (any JSON value: the file is anyone's to edit), UNREADABLE when
    it holds text that is not JSON, None when empty or missing; a holder that has just taken the
    lock may not have written it yet, so an empty or partial record is read again for `wait` s."""
    deadline = time.monotonic() + wait
    while True:
        raw = b""
        try:
            fd = os.open(path, os.O_RDONLY | _SAFE)  # never read through a planted link
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
            if raw.strip():
                return json.loads(raw.decode())
        except (OSError, ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deep
            pass
        if time.monotonic() >= deadline:
            return UNREADABLE if raw.strip() else None
        time.sleep(0.05)


UNREADABLE = object()  # a lock record that is not JSON


def describe_holder(folder) -> str:
    """Who holds `folder`'s lock, in words ("process 4242 on host-a (rloo train, started ...)")."""
    return _describe(_read_holder(Path(folder) / LOCK_NAME))


def _describe(holder: object | None) -> str:
    """The holder in words. Whether it is live is the kernel's flock, never this record: a record
    that is not the object rloo writes is named as unreadable, not guessed from."""
    if holder is None:
        return "another process (it has not recorded its PID yet)"
    fields = _fields(holder)
    if not fields:
        return "a process whose lock record is unreadable"
    return f"process {fields['pid']} on {fields['host']} ({fields['command']}, started {fields['started']})"


def _fields(holder: object) -> dict:
    """{pid, host, command, started (local time, in words)} of a record as rloo writes it, {} for
    anything else (a list, a number, a string pid, a start time no clock can show, ...)."""
    if not isinstance(holder, dict):
        return {}
    pid, host, started = holder.get("pid"), holder.get("host"), holder.get("started")
    command = holder.get("command", "rloo")
    if not (type(pid) is int and isinstance(host, str) and isinstance(command, str)):
        return {}
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        return {}
    try:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    except (OverflowError, OSError, ValueError):  # 1e300, -1e20, NaN: no date
        return {}
    # whitespace (a newline in a hand-edited host) would break the one-line message
    return {"pid": pid, "host": " ".join(host.split()), "command": " ".join(command.split())[:200], "started": when}


_ACTIVE: dict[str, list] = {}  # resolved folder -> [lock, nesting depth]


def _key(folder) -> str:
    return str(Path(folder).resolve())


@contextmanager
def run_folder(folder, enabled: bool = True):
    """Hold `folder`'s lock for the body (taken now if the folder exists, else by `lock_now`).
    `enabled=False` (torchrun processes other than rank 0) makes it a no-op."""
    if not enabled:
        yield
        return
    key = _key(folder)
    entry = _ACTIVE.get(key)
    if entry is not None:  # this process already holds it (a pipeline stage, a compare cell)
        entry[1] += 1
    else:
        entry = _ACTIVE[key] = [_Lock(Path(folder)), 1]
    try:
        if Path(folder).is_dir():
            entry[0].acquire() if entry[0].fd is None else None
        yield
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].release()
            del _ACTIVE[key]


def holds_run_folder(stage: Callable[P, R]) -> Callable[P, R]:
    """Decorator: `stage(cfg, ...)` runs holding `cfg.output_dir` (rank 0 only under torchrun)."""

    @functools.wraps(stage)
    def wrapper(cfg, *args, **kwargs):  # the arguments passed on as they came (`cfg` read from them)
        with run_folder(cfg.output_dir, enabled=os.environ.get("RANK", "0") == "0"):
            return cast("Callable[..., R]", stage)(cfg, *args, **kwargs)

    return wrapper


def lock_now(folder) -> None:
    """Take `folder`'s lock (it exists now). Outside `run_folder` it is held until the process exits."""
    key = _key(folder)
    entry = _ACTIVE.setdefault(key, [_Lock(Path(folder)), 1])
    if entry[0].fd is None:
        entry[0].acquire()


def refuse_if_busy(folder) -> None:
    """Probe only (the CLI calls it before its slow imports, so a second process is told at once):
    RunFolderBusy when a live process holds `folder`'s lock. The stage still takes the lock itself."""
    if is_busy(folder):
        raise _busy(Path(folder), Path(folder) / LOCK_NAME)


def is_busy(folder) -> bool:
    """Whether a live process holds `folder`'s lock exclusively (a running stage or compare cell)."""
    path = Path(folder) / LOCK_NAME
    try:
        fd = open_lock_file(path, os.O_RDONLY)
    except OSError:
        return False  # no lock file, or not a folder: the stage reports it in its own words
    try:
        if not try_flock(fd, fcntl.LOCK_SH):  # shared: probes never block each other
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@contextmanager
def hold_existing(path: Path):
    """Hold the existing lock file `path` (of a folder inside one about to be emptied), so that no
    process starts in that folder meanwhile; RunFolderBusy when a live process holds it. A link or
    a missing file holds nothing (the caller deletes it without following it)."""
    try:
        fd = open_lock_file(path, os.O_RDWR)
    except (OSError, LockFileUnsafe):
        yield
        return
    try:
        if not try_flock(fd, fcntl.LOCK_EX):
            raise _busy(path.parent, path)
        yield
    finally:
        os.close(fd)
