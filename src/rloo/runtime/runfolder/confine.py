"""Every path rloo writes or deletes lies inside the run folder it works in, reached through real
folders only.

The kernel follows a symbolic link in any component of a path. O_NOFOLLOW and writing through a
temporary sibling and a rename (rloo.runtime.runfolder.atomic) protect the last component only: with
`<run>/plots` replaced by a link to a user's folder, `<run>/plots/reward.png` is that folder's
file, and pruning `<run>/checkpoints/step-000001` deletes there. So each writer and deleter first
passes its path through `confine`: every component between the run folder and the path must be a
real folder (or not exist yet: it is then created as one), else one line (LinkedFolder, exit 2).

Which run folders: those this process holds (registered by rloo.runtime.runfolder.lock and
rloo.runtime.runfolder.sharedlock when their lock is taken), the outermost one when they nest (a pipeline's
stages, a comparison's cells), so a stage folder replaced by a link is refused too. The run folder
itself may lie under links (an output_dir under a linked home folder): only what lies below it is
checked. A path under no held run folder (a config file the user names) is not checked. The whole
folder is also checked once when a command starts (rloo.runtime.runfolder.layout.refuse_linked_folders),
so a refusal comes before anything is written. A link planted while the run works is not guarded
against (the check and the write are two system calls).
"""

from __future__ import annotations

import os
from pathlib import Path

from rloo.errors import RlooError

_ROOTS: dict[str, int] = {}  # absolute path of a run folder this process holds -> times held


class LinkedFolder(RlooError):
    """A folder inside a run folder is a symbolic link: writing or deleting under it would reach
    outside the run folder."""


def linked_folder(path: Path) -> LinkedFolder:
    """The one-line refusal for `path`, a link where a run folder's own folder should be."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return LinkedFolder(
        f"{path} is a symbolic link{target}; rloo writes and deletes only inside the run folder, never "
        f"through a link: replace it by a folder of its own and run again"
    )


def hold_root(folder) -> tuple[str, ...]:
    """Register `folder` as a run folder this process works in (its lock was just taken); returns
    the keys to hand to `release_root` when its lock goes: the folder as spelled (made absolute
    without following links) and as resolved, since a caller may name a path under it either way."""
    keys = tuple({os.path.abspath(folder), os.path.realpath(folder)})
    for key in keys:
        _ROOTS[key] = _ROOTS.get(key, 0) + 1
    return keys


def release_root(keys: tuple[str, ...]) -> None:
    """Undo one `hold_root` (the folder may have been moved or deleted meanwhile: keys, not it)."""
    for key in keys:
        if _ROOTS.get(key, 0) <= 1:
            _ROOTS.pop(key, None)
        else:
            _ROOTS[key] -= 1


def confine(path, folder: bool = False) -> Path:
    """`path`, once every component between its run folder and it is checked: LinkedFolder for a
    symbolic link among them. `folder`: `path` is a folder to create, fill or delete, so it must
    not be a link either; for a file the last component is the atomic writers' concern (they
    replace a link there, or refuse it, never write through it). Returns `path` unchanged."""
    p = os.path.abspath(path)
    roots = [r for r in _ROOTS if p.startswith(r.rstrip(os.sep) + os.sep)]
    if not roots:
        return Path(path)
    root = min(roots, key=len)
    parts = Path(p).relative_to(root).parts
    current = Path(root)
    for name in parts if folder else parts[:-1]:
        current = current / name
        if current.is_symlink():
            raise linked_folder(current)
    return Path(path)


def make_folder(path) -> Path:
    """`mkdir -p path` inside a run folder, never through a link (`confine`)."""
    path = confine(path, folder=True)
    path.mkdir(parents=True, exist_ok=True)
    return path
