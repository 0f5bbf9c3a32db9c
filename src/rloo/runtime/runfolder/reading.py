"""Reading a run folder's own files (config.yaml, metrics.jsonl, a checkpoint's COMPLETE, a
comparison's JSON files) so that something planted at their name is refused, never blocked on.

A plain `open` of a FIFO waits for a writer that never comes (`--resume` hung forever on a FIFO at
metrics.jsonl, config.yaml or COMPLETE); a character device such as /dev/zero reads without end;
a symbolic link reads someone else's file. So every such read opens with O_NOFOLLOW (a link at the
name fails with ELOOP) and O_NONBLOCK (a FIFO opens at once), then checks with fstat, on the file
it opened, that it is a regular file. Anything else is one line (NotARegularFile, exit 2) naming
the path and what it is; nothing was read or changed. A file that does not exist raises
FileNotFoundError as `open` would: callers decide what a missing file means.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rloo.errors import RlooError

# O_NONBLOCK only matters for the open of a FIFO: on a regular file reads never block anyway
_SAFE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotARegularFile(RlooError):
    """A run folder's own file is a link, FIFO, device, socket or folder: rloo neither reads through
    it nor blocks on it."""


def kind_of_mode(mode: int) -> str:
    """What a file of st_mode `mode` is, for a message ("a FIFO (named pipe)", ...)."""
    kinds = {
        stat.S_ISDIR: "a folder",
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISSOCK: "a socket",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISLNK: "a symbolic link",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def refusal(path, what: str) -> NotARegularFile:
    """The one-line refusal of `path`, which is `what` ("a FIFO (named pipe)", ...)."""
    return NotARegularFile(
        f"{path} is {what}, not a regular file; rloo reads and writes only its own regular files in a run "
        f"folder (never through a link, never blocking on a pipe or device): remove it and run again "
        f"(nothing was changed)"
    )


def hard_linked(path, names: int) -> RlooError:
    """The one-line refusal of a file rloo writes in place (appends to, cuts back) that has other
    names: writing it would change the file under those names too."""
    return RlooError(
        f"could not write {path}: it is hard-linked ({names} names), so writing it would change the other "
        f"name's file too; remove it (or copy it to a file of its own) and run again (nothing was changed)"
    )


def open_regular(path, flags: int = 0) -> int:
    """A file descriptor of `path`, opened with `flags` added to a non-blocking, no-follow read-only
    open; NotARegularFile for anything but a regular file. The descriptor is left non-blocking
    (which changes nothing for a regular file)."""
    try:
        fd = os.open(path, _SAFE_READ | flags)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):  # islink: the last component, not a loop above
            raise refusal(path, "a symbolic link") from None
        if e.errno == errno.EISDIR:
            raise refusal(path, "a folder") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise refusal(path, kind_of_mode(mode))
    return fd


def read_bytes(path) -> bytes:
    """The bytes of the regular file `path` (see the module's docstring)."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def read_text(path) -> str:
    """The text of the regular file `path`, as UTF-8 (UnicodeDecodeError for other bytes: callers
    that read a file a user may have edited catch ValueError, as for a parse error)."""
    return read_bytes(path).decode("utf-8")


def check_regular(path) -> None:
    """NotARegularFile unless `path` is a regular file or does not exist (lstat: a link is refused,
    not followed). For files read by a library that opens them itself (torch.load, safetensors)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise refusal(path, kind_of_mode(mode))


def is_regular(path) -> bool:
    """`path` exists and is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(Path(path)).st_mode)
    except OSError:
        return False
