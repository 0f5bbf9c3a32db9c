"""A folder several processes work in at once (an `rloo compare` study) and its shared lock.

Each process holds a shared flock on `<folder>/.rloo.lock` for its whole run, so a stage (which
takes the same file exclusively, rloo.runtime.runfolder.lock) cannot start there meanwhile, and a process
that is to empty the folder (`--overwrite`) holds it exclusively first: it never deletes under a
live process.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rloo.runtime.runfolder.confine import hold_root, release_root
from rloo.runtime.runfolder.lock import LOCK_NAME, RunFolderBusy, open_lock_file, try_flock


class SharedFolder:
    """A folder several processes work in at once (an `rloo compare` study): each holds a shared
    flock on `<folder>/.rloo.lock` for its whole run. The first process holds it exclusively while
    it sets the folder up (its marker and config: one writer, `exclusive` is then True), later ones
    join once that is done; one that is to empty the folder (`overwrite`) must hold it exclusively,
    so it never deletes under a live process. The last process to close removes the file (while
    holding it exclusively, as rloo.runtime.runfolder.lock does); one that took a file removed
    meanwhile takes the new one instead."""

    JOIN_TRIES = 1500  # x 0.02 s: a joining process waits up to 30 s for the first one's set-up

    def __init__(self, folder, overwrite: bool):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.fd = -1
        while self.fd < 0:
            self.created = not os.path.lexists(self.path)
            fd = open_lock_file(self.path, os.O_RDWR | os.O_CREAT)
            self.exclusive = try_flock(fd, fcntl.LOCK_EX, tries=10 if overwrite else 1)
            if not self.exclusive and (overwrite or not try_flock(fd, fcntl.LOCK_SH, tries=self.JOIN_TRIES)):
                others = _holders(fd)
                os.close(fd)
                who = f"process {', '.join(map(str, others))}" if others else "another process"
                raise RunFolderBusy(
                    f"{self.folder} is in use by {who} (rloo compare); wait for it to finish or choose another "
                    f"output_dir (nothing was deleted)"
                )
            if _same_file(fd, self.path):  # else the last holder removed it meanwhile: take the new one
                self.fd = fd
            else:
                os.close(fd)
        self.roots = hold_root(self.folder)

    def share(self) -> None:
        """Let other processes join (after an exclusive start)."""
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def close(self, refused: bool = False) -> None:
        """Release; the lock file goes when no other process holds it (a finished study left it
        behind); when `refused` (the folder was not taken), only if this process made it just now."""
        if self.created if refused else try_flock(self.fd, fcntl.LOCK_EX):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        release_root(self.roots)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _holders(fd: int) -> list[int]:
    """PIDs that hold a flock on fd's file, from /proc/locks (Linux; [] elsewhere)."""
    ino = os.fstat(fd).st_ino
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        parts = [x for x in line.split() if x != "->"]  # "->": a waiter
        if "FLOCK" in parts and len(parts) >= 6 and parts[5].rsplit(":", 1)[-1] == str(ino):
            pids.append(int(parts[4]))
    return sorted({p for p in pids if p != os.getpid()})
