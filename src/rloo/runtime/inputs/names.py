"""Names a user gives for models, tokenizers and datasets: a local path, or a Hub repository.

A typo in a local path must not turn into minutes of Hub retries. So a value is sorted first:

- path-shaped (`./x`, `../x`, `/x`, `~/x`, `x/`, a file suffix such as `.jsonl`, or a parent folder
  that exists, as `data/nope` when `data/` exists) and missing: an immediate one-line error that
  names the closest existing entries of the nearest existing folder (difflib);
- Hub-shaped (`name` or `org/name`): looked up once, before any library loads it, with the Hub's
  own offline switch (`HF_HUB_OFFLINE`) honoured and no retries; a failure is one line.

Light on purpose (no torch, no transformers): the CLI runs these checks before the heavy imports.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from pathlib import Path

from huggingface_hub import HfApi, constants, scan_cache_dir
from huggingface_hub.errors import CacheNotFound, GatedRepoError, RepositoryNotFoundError

from rloo.errors import RlooError
from rloo.runtime.inputs.objects import held, is_held

# Known suffixes of the files a user names (data, weights, configs); any other short lower-case
# alphabetic suffix counts as a file suffix too (`.jsnl`), while a Hub name's dotted version part
# (`Qwen2.5-0.5B`, `Llama-3.1-8B`) has digits and does not.
FILE_SUFFIXES = (
    ".jsonl",
    ".json",
    ".csv",
    ".parquet",
    ".arrow",
    ".txt",
    ".safetensors",
    ".bin",
    ".pt",
    ".yaml",
    ".yml",
    ".py",
    ".gz",
    ".zip",
)
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def path_shaped(value: str) -> bool:
    """True when `value` can only be meant as a local path (see the module docstring)."""
    if value.startswith(("/", "./", "../", "~")) or value in (".", "..") or value.endswith(("/", os.sep)):
        return True
    suffix = Path(value).suffix.lower()
    if suffix in FILE_SUFFIXES or re.fullmatch(r"\.[a-z]{2,8}", suffix):
        return True
    parent = Path(value).parent
    return str(parent) not in ("", ".") and parent.is_dir()


def closest_entries(value: str, n: int = 3) -> tuple[Path, list[str]]:
    """(nearest existing folder above `value`, up to n of its entries closest to the missing part)."""
    p = Path(value).expanduser()
    missing = p.name
    parent = p.parent
    while not parent.is_dir() and parent != parent.parent:
        missing, parent = parent.name, parent.parent
    entries = list_entries(parent)
    names = {e.rstrip("/"): e for e in entries}
    close = difflib.get_close_matches(missing, list(names), n=n, cutoff=0.4)
    return parent, [names[c] for c in close]


def list_entries(folder: Path) -> list[str]:
    """Visible entries of `folder`, sorted, folders with a trailing slash; [] when unreadable."""
    try:
        return sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir() if not e.name.startswith("."))
    except OSError:
        return []


def missing_path_error(value: str, what: str) -> RlooError:
    """`<what> 'x' does not exist; closest in <folder>: a, b` (or what the folder holds)."""
    folder, close = closest_entries(value)
    where = "the current folder" if str(folder) in ("", ".") else f"{folder}/"
    if close:
        hint = f"closest in {where}: {', '.join(close)}"
    else:
        entries = list_entries(folder)
        hint = (
            f"nothing similar in {where}, which holds: {', '.join(entries[:5])}" + (", ..." if len(entries) > 5 else "")
            if entries
            else f"{where} is empty"
        )
    return RlooError(f"{what} {value!r} does not exist; {hint}")


def check_local(value: str, what: str) -> None:
    """The network-free half of `check_name`: a missing path-shaped value fails; a Hub name passes."""
    if is_held(value):  # an object handed to the Python API (rloo.runtime.inputs.objects)
        held(value)
        return
    if not Path(value).expanduser().exists() and (path_shaped(value) or not _HUB_NAME.match(value)):
        raise missing_path_error(value, what)


def check_name(value: str, what: str, repo_type: str = "model") -> None:
    """Raise one RlooError line unless `value` is an existing path or a Hub repository that can
    be reached (or is cached under HF_HUB_OFFLINE). `what` names the key, e.g. "policy"."""
    if is_held(value):
        held(value)
        return
    if Path(value).expanduser().exists():
        return
    if path_shaped(value) or not _HUB_NAME.match(value):
        raise missing_path_error(value, what)
    problem = hub_problem(value, repo_type)
    if problem is not None:
        _, close = closest_entries(value)
        local = f" (closest local entries: {', '.join(close)})" if close else ""
        raise RlooError(f"{what} {value!r} is not a local path{local} and {problem}")


@functools.lru_cache(maxsize=64)
def hub_problem(repo_id: str, repo_type: str = "model") -> str | None:
    """None when the Hub repository can be used, else why not, in words. One request, no retries;
    under HF_HUB_OFFLINE only the local Hub cache is consulted."""
    if constants.HF_HUB_OFFLINE:
        try:
            cached = {(r.repo_id, r.repo_type) for r in scan_cache_dir().repos}
        except (CacheNotFound, OSError):
            cached = set()
        return (
            None
            if (repo_id, repo_type) in cached
            else "is not in the local Hub cache (HF_HUB_OFFLINE is set, so the Hub is not asked)"
        )

    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except GatedRepoError:
        return None  # exists; the library's own error explains the access request
    except RepositoryNotFoundError:
        return f"no {repo_type} of that name is on the Hub ({constants.ENDPOINT}), or it is private"
    except Exception as e:  # noqa: BLE001 - connection refused, DNS, timeout, proxy: all one line
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (
            f"the Hub ({constants.ENDPOINT}) could not be reached: {type(e).__name__}: {why[:160]}; "
            f"check the name, or set HF_HUB_OFFLINE=1 to use only cached downloads"
        )
    return None
