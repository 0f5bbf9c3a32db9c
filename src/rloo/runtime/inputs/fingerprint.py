"""What a run reads from outside its folder (models, tokenizer, dataset), identified by content.

A resume checks that every input still has the sha256 it had when the run started, so a model
folder replaced between an interrupt and `--resume` is refused instead of silently mixed in.
Hashing reads each input once per run start (about 1-2 s per GB); Hub names and missing paths
are recorded by name only. A reward *function*'s code is deliberately not fingerprinted: fixing
a reward that raised and resuming is the documented way to continue.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rloo.config.dataset import DatasetSettings
from rloo.errors import RlooError, option
from rloo.runtime.inputs.objects import held, is_held

# config keys that name an input path, by config kind (absent keys are skipped)
INPUT_KEYS = ("policy", "reward_model", "model", "tokenizer", "sft_model", "baseline", "reference_model")


def input_paths(cfg) -> dict[str, str]:
    """{config key: path} of the inputs `cfg` reads (dataset as `dataset.path`)."""
    fields = dict(cfg)  # a stage config (pydantic) iterates over its (field, value) pairs
    # an empty path names nothing (sft_model's default when the reward stage is handed model=): as
    # Path("") it would be the working folder, every file of which was hashed
    out = {k: str(fields[k]) for k in INPUT_KEYS if fields.get(k) not in (None, "")}
    ds = fields.get("dataset")
    if isinstance(ds, DatasetSettings) and ds.path:
        out["dataset.path"] = str(ds.path)
    return out


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_sha(path: str) -> str | None:
    """sha256 of a file, or of a folder's manifest (relative path, size, sha256 of every file);
    None when `path` is not local (a Hub name); a handed object's own (rloo.runtime.inputs.objects)."""
    if is_held(path):
        return held(path).sha
    p = Path(path)
    if p.is_file():
        return _file_sha(p)
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        h.update(f"{f.relative_to(p)}\0{f.stat().st_size}\0{_file_sha(f)}\n".encode())
    return h.hexdigest()


def fingerprints(cfg) -> dict[str, list]:
    """{config key: [path, sha256 or None]} of every input of `cfg`."""
    return {k: [p, content_sha(p)] for k, p in input_paths(cfg).items()}


def check_inputs_unchanged(saved: dict | None, current: dict) -> None:
    """Refuse a resume whose inputs differ in content from the run's start (one line naming them)."""
    if not saved:  # a checkpoint from before fingerprints were recorded
        return
    changed = [k for k in saved if k in current and saved[k][1] != current[k][1]]
    if changed:
        what = "; ".join(
            f"{k}={current[k][0]} is not the same {_kind(current[k][0])} "
            f"the run started with (sha256 {str(saved[k][1])[:12]} then, {str(current[k][1])[:12]} now)"
            for k in changed
        )
        raise RlooError(
            f"cannot resume: {what}; restore the original, or pass {option('overwrite')} to start a new run"
        )


def _kind(path: str) -> str:
    return "object" if is_held(path) else "file" if Path(path).is_file() else "folder"


def refuse_inputs_inside(cfg, out: Path) -> None:
    """--overwrite deletes `out`: refuse when an input of the run lies inside it."""
    root = Path(out).resolve()
    inside = [
        f"{k}={p}" for k, p in input_paths(cfg).items() if Path(p).exists() and Path(p).resolve().is_relative_to(root)
    ]
    if inside:
        raise RlooError(
            f"{option('overwrite')} would delete {', '.join(inside)}: it lies inside {out}; move it "
            f"out or choose another output_dir (nothing was deleted)"
        )
