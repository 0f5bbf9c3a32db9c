"""Writing files so that a crash, a kill or a full disk never leaves a half-written one behind.

Pattern: write into a temporary sibling, fsync, then `os.replace` it over the final name (atomic on
POSIX file systems), then fsync the parent folder so the rename itself survives a power loss.
Every path written or deleted here is first checked by rloo.runtime.runfolder.confine: a folder above it
inside the run folder that is a link is refused (the rename protects only the last component).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path

from rloo.errors import RlooError
from rloo.runtime.runfolder.confine import confine
from rloo.runtime.runfolder.reading import hard_linked, is_regular, kind_of_mode, refusal


class WriteError(RlooError):
    """Saving failed (full disk, quota, permissions); the previous copy is untouched."""


def describe_write_failure(e: BaseException, folder: Path) -> str:
    """What went wrong while saving, in one line. A full disk does not always arrive as an
    OSError(ENOSPC): safetensors reports it as SafetensorError("... os error 28") and torch.save
    as RuntimeError("unexpected pos ..."), so the free space of `folder` is checked too."""
    text = (
        (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).splitlines()[0]
        if str(e)
        else type(e).__name__
    )
    if isinstance(e, OSError) and e.errno == errno.EROFS:  # it reports no free space too: say what it is
        return f"read-only file system ({text}); choose an output_dir on a writable one"
    full = (
        (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT))
        or "os error 28" in str(e)
        or "No space left" in str(e)
        or _nearly_full(folder)
    )
    if full:
        return f"no space left on device ({text}); free space or choose another output_dir"
    return f"{type(e).__name__}: {text}"


def _nearly_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < (1 << 20)
    except OSError:
        return False


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some file systems do not let a folder be opened; the rename still happened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """This process's umask (Linux: read from /proc, which leaves it untouched; elsewhere set and
    restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def modes_as_umask_allows(folder: Path) -> None:
    """Give every file under the freshly written `folder` the mode a plain `open` would (0o666 less
    the umask): safetensors writes its files 0o600 whatever the umask, so a model saved in a run
    folder shared with a group could not be loaded by the others, unlike every other file there."""
    mode = 0o666 & ~current_umask()
    for f in Path(folder).rglob("*"):
        if f.is_file() and not f.is_symlink() and (f.stat().st_mode & 0o777) != mode:
            os.chmod(f, mode)


def sync_and_hash(folder: Path) -> dict[str, list]:
    """fsync every file under `folder` and return {relative path: [size, sha256]}: the manifest a
    reader checks before trusting the folder (a truncated or corrupted file changes both)."""
    manifest = {}
    for f in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
            os.fsync(fh.fileno())
        manifest[str(f.relative_to(folder))] = [f.stat().st_size, h.hexdigest()]
    return manifest


def check_manifest(folder: Path, manifest: dict[str, list]) -> str | None:
    """None when every file of `manifest` is present with its size and hash, else the first problem."""
    for rel, (size, digest) in manifest.items():
        f = Path(folder) / rel
        if not is_regular(f):  # a link, FIFO or device planted there is never read (a FIFO would block)
            return f"{rel} is missing" if not f.is_symlink() and not f.exists() else f"{rel} is not a regular file"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, expected {size} (truncated?)"
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != digest:
            return f"{rel} does not match its checksum (corrupted)"
    return None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = confine(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # a link planted at the temp name is removed, never written through ("x": O_EXCL, which
        # also refuses to follow a link created in between)
        tmp.unlink(missing_ok=True)
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        why = describe_write_failure(e, path.parent)
        tmp.unlink(missing_ok=True)
        raise WriteError(f"could not write {path}: {why}") from e


def _not_a_link(path: Path) -> WriteError:
    return WriteError(
        f"could not write {path}: it is a link (rloo writes its own files in a run folder, never "
        f"through a link: remove it and run again)"
    )


def _open_own(path: Path, flags: int) -> int:
    """`path` opened with `flags` for writing, never through a link (O_NOFOLLOW), never blocking on a
    planted FIFO (O_NONBLOCK: its open fails or returns at once), and only when it is a regular file
    with no other name: a hard link elsewhere (someone's file) would be appended to or cut too."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _not_a_link(path) from e
        if e.errno == errno.ENXIO:  # a FIFO with no reader: O_NONBLOCK refuses the open instead of waiting
            raise refusal(path, "a FIFO (named pipe)") from e
        raise WriteError(f"could not write {path}: {describe_write_failure(e, path.parent)}") from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refusal(path, kind_of_mode(st.st_mode))
        raise WriteError(str(hard_linked(path, st.st_nlink)))
    return fd


def open_append(path: Path):
    """`path` opened for appending text, never through a link: a link planted where a run folder's
    log should be (to someone's file) is refused in one line instead of being written through; a
    FIFO, device or hard-linked file likewise (`_open_own`)."""
    path = confine(path)
    fd = _open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a")


def truncate_file(path: Path, nbytes: int) -> None:
    """Cut `path` back to `nbytes` (a resumed run's log to its checkpoint), never through a link:
    os.truncate would cut the file a planted link points to (a hard link's too: `_open_own`)."""
    path = confine(path)
    try:
        fd = _open_own(path, os.O_WRONLY)
    except WriteError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            return
        raise
    try:
        if os.fstat(fd).st_size > nbytes:
            os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)


def atomic_savefig(fig, path: Path, **kwargs) -> Path:
    """matplotlib's `fig.savefig` through a temporary sibling and a rename, like atomic_write_text:
    a reader (another compare process) never sees half an image, a planted link is replaced, not
    written through."""
    path = confine(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        with open(tmp, "xb") as fh:
            fig.savefig(fh, format=path.suffix.lstrip(".") or "png", **kwargs)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise WriteError(f"could not write {path}: {describe_write_failure(e, path.parent)}") from e
    return path


def remove_tree(path: Path) -> None:
    """Delete a folder (rmtree never follows a link inside it; `confine`: nor one above it)."""
    shutil.rmtree(confine(path), ignore_errors=True)


def remove_tree_reporting(path: Path) -> str | None:
    """Delete a folder; None when it is gone, else the first error (left for the caller to report)."""
    confine(path)
    errors: list[str] = []
    shutil.rmtree(path, onerror=lambda fn, p, exc: errors.append(f"{exc[0].__name__}: {exc[1]}"))
    return errors[0] if errors else None
