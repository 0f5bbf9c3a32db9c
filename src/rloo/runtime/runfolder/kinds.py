"""The kind of rloo run a folder holds: the marker every command writes (`.rloo-run`,
`{"kind": "train"}`), or, for a folder written before markers, its config.yaml (the kind's keys;
bench: its bench.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from rloo.config import (
    BenchConfig,
    CompareConfig,
    EvalConfig,
    PipelineConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    upgrade_saved_config,
)
from rloo.runtime.runfolder.atomic import atomic_write_text

MARKER = ".rloo-run"
CONFIGS = {
    "train": RLConfig,
    "sft": SFTConfig,
    "reward": RewardConfig,
    "eval": EvalConfig,
    "pipeline": PipelineConfig,
    "compare": CompareConfig,
    "bench": BenchConfig,
}
KINDS = {cls.__name__: kind for kind, cls in CONFIGS.items()}


def run_kind(cfg) -> str:
    """The kind of run a config makes ("train" for an RLConfig, ...)."""
    return KINDS[type(cfg).__name__]


def write_marker(folder: Path, kind: str) -> None:
    """Mark `folder` as an rloo run of `kind` (atomically; a planted link is replaced, not followed)."""
    if _marker_kind(Path(folder)) != kind:
        atomic_write_text(Path(folder) / MARKER, json.dumps({"kind": kind}) + "\n")


def kind_of(folder: Path) -> str | None:
    """The kind of rloo run `folder` holds, by its marker or (written before markers) its
    config.yaml; None when it holds none."""
    folder = Path(folder)
    return _marker_kind(folder) or _legacy_kind(folder)


def _marker_kind(folder: Path) -> str | None:
    path = folder / MARKER
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = json.loads(os.read(fd, 4096).decode())
        return data.get("kind") if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _legacy_kind(folder: Path) -> str | None:
    """A folder written before markers: a stage's config.yaml has exactly its config's keys (the
    kinds differ in them); a comparison's loads as one; a bench folder holds bench.json."""
    saved = folder / "config.yaml"
    if saved.is_file() and not saved.is_symlink():
        try:
            held = yaml.safe_load(saved.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            held = None
        if isinstance(held, dict):
            held = upgrade_saved_config(held)
            for kind, cls in CONFIGS.items():
                if set(held) == set(cls.model_fields):
                    return kind
            try:
                CompareConfig(**held)
                return "compare"
            except Exception:  # noqa: BLE001 - any validation failure: not a comparison
                pass
    bench = folder / "bench.json"
    return "bench" if bench.is_file() and not bench.is_symlink() else None
