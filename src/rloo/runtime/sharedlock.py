"""A folder several processes work in at once (an `rloo compare` study) and its shared lock.

Each process holds a shared flock on `<folder>/.rloo.lock` for its whole run, so a stage (which
takes the same file exclusively, rloo.runtime.runlock) cannot start there meanwhile, and a process
that is to empty the folder (`--overwrite`) holds it exclusively first: it never deletes under a
live process.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rloo.runtime.runlock import LOCK_NAME, RunFolderBusy, open_lock_file, try_flock


class SharedFolder:
    """A folder several processes work in at once (an `rloo compare` study): each holds a shared
    flock on `<folder>/.rloo.lock` for its whole run; one that is to empty the folder
    (`--overwrite`) holds it exclusively first, so it never deletes under a live process. The file
    is left in place (other processes may hold it)."""

    def __init__(self, folder, exclusive: bool):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.created = not os.path.lexists(self.path)
        self.fd = open_lock_file(self.path, os.O_RDWR | os.O_CREAT)
        if not try_flock(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH):
            others = _holders(self.fd)
            os.close(self.fd)
            who = f"process {', '.join(map(str, others))}" if others else "another process"
            raise RunFolderBusy(
                f"{self.folder} is in use by {who} (rloo compare); wait for it to finish or choose another "
                f"output_dir (nothing was deleted)"
            )

    def share(self) -> None:
        """Let other processes join (after an exclusive start)."""
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def close(self, refused: bool = False) -> None:
        """Release; `refused`: the folder was not taken, so a lock file made just now goes again."""
        if refused and self.created:
            self.path.unlink(missing_ok=True)
        os.close(self.fd)


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
