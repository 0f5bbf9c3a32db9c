"""What an rloo output folder holds, and the one way `--overwrite` deletes (every command uses it).

Each command writes a marker, `.rloo-run` (`{"kind": "train"}`), into the folder it creates. A
folder written before markers existed is recognised by its config.yaml (the kind's keys; bench:
its bench.json). `empty_run_folder(folder, kind)` first walks the whole folder without following
links and refuses, with one line and nothing deleted, when
  - the folder is not an rloo run/study of `kind`;
  - any entry, at any depth, is not one rloo writes there (LAYOUTS; a nested run must be one of
    the kind expected at that place): a user's file, folder, or a foreign run;
  - a lock file inside it (a nested stage, a compare cell) is held by a live process.
Only then it deletes, holding those nested locks, so no process starts in them meanwhile; a
symbolic link is unlinked, never its target, and the folder's own lock and marker stay.
The layouts name model files exactly (not `*.json`), so a user's `notes.txt` inside `model/` is
refused too; an unusual tokenizer file name makes `--overwrite` refuse rather than delete.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
from contextlib import ExitStack
from pathlib import Path

from rloo.errors import RlooError, option
from rloo.runtime.runfolder.confine import linked_folder
from rloo.runtime.runfolder.kinds import MARKER, kind_of, run_kind, write_marker  # noqa: F401 (re-exported)
from rloo.runtime.runfolder.lock import LOCK_NAME, hold_existing
from rloo.runtime.runfolder.reading import hard_linked, kind_of_mode, refusal

# files that make a folder neither a run nor a user's: the lock, the marker, their temp names
BOOKKEEPING = {LOCK_NAME, MARKER, f".{MARKER}.tmp", ".config.yaml.tmp"}

FILE, TREE = "file", "tree"  # a file; a folder owned whole (wandb's own layout)
# files written in place (appended to, cut back on resume), not replaced: a hard link to one is refused
IN_PLACE = {"metrics.jsonl"}


def _run(kind: str) -> tuple[str, str]:
    return ("run", kind)


_MODEL_FILES = (
    "config.json generation_config.json model.safetensors model-*-of-*.safetensors model.safetensors.index.json "
    "tokenizer.json tokenizer_config.json special_tokens_map.json added_tokens.json vocab.json vocab.txt "
    "merges.txt tokenizer.model spiece.model chat_template.jinja chat_template.json adapter_config.json "
    "adapter_model.safetensors README.md"  # README.md: the model card PEFT's save_pretrained writes with adapters
).split()
MODEL = dict.fromkeys(_MODEL_FILES, FILE)
_CKPT = {"model": MODEL, "state.pt": FILE, "COMPLETE": FILE, "ring": {"version-*.safetensors": FILE}}
_STAGE = dict.fromkeys(BOOKKEEPING | {"config.yaml", "metrics.jsonl", "cuts.json"}, FILE) | {
    "tensorboard": {"events.out.tfevents.*": FILE},
    "wandb": TREE,
}
_MODELS = {"model": MODEL, "model.tmp": MODEL, "model.old": MODEL}
_CHECKPOINTS = {"checkpoints": {"step-*": _CKPT, ".tmp-step-*": _CKPT, ".old-step-*": _CKPT}}
# cuts.json: what the cell's episode evaluation cut (rloo.experiments.compare.episodes)
_CELL = {LOCK_NAME: FILE, "gradient_variance.json": FILE, "cuts.json": FILE} | {
    "sft": _run("sft"),
    "reward": _run("reward"),
    "weak_sft": _run("sft"),
    "*": _run("train"),  # one folder per method or tuning trial
}
_PLOTS = "frontier.png learning_curves.png ppo_clip_fraction.png overoptimization.png".split()
LAYOUTS: dict[str, dict] = {
    "sft": _STAGE | _MODELS | _CHECKPOINTS | {"result.json": FILE},  # result.json: rloo compare's evaluation of it
    "reward": _STAGE | _MODELS | _CHECKPOINTS | {"pairs.jsonl": FILE, "accuracy.json": FILE},
    "train": _STAGE
    | _MODELS
    | _CHECKPOINTS
    | {
        "plots": dict.fromkeys(["reward.png", "kl.png", "win_rate.png", "judge_score.png"], FILE),
        "result.json": FILE,
    },
    "eval": _STAGE | {"summary.json": FILE, "report.md": FILE, "samples.jsonl": FILE, "results.json": FILE},
    "pipeline": dict.fromkeys(BOOKKEEPING | {"config.yaml", "summary.json"}, FILE)
    | {"sft": _run("sft"), "reward": _run("reward"), "rl": _run("train"), "eval": _run("eval")},
    "compare": dict.fromkeys(BOOKKEEPING | {"config.yaml"}, FILE)
    | {
        "report": dict.fromkeys(["report.md", "results.json", *_PLOTS], FILE),
        "runs": {"*": {"seed-*": _CELL, "variance": {LOCK_NAME: FILE}}},
        "tuning": {"*": {"selection.json": FILE, "seed-*": _CELL}},
    },
    "bench": dict.fromkeys(BOOKKEEPING | {"bench.json"}, FILE)
    | {"assets": {"*": {"policy": MODEL, "reward": MODEL, "words.txt": FILE}}},
}


def is_bookkeeping_only(folder: Path) -> bool:
    """An empty folder, or one holding only a lock and a marker (a run killed as it started)."""
    return all(p.name in BOOKKEEPING for p in Path(folder).iterdir())


def holds_a_run(folder: Path) -> bool:
    """Whether `folder` holds anything of a run that `--resume` could continue: a marker of any kind
    (its kind is checked later), or files; not a missing folder, an empty one or a lone lock."""
    folder = Path(folder)
    return folder.is_dir() and (kind_of(folder) is not None or not is_bookkeeping_only(folder))


def empty_run_folder(folder: Path, kind: str) -> None:
    """`--overwrite`: delete everything in `folder`, an rloo run of `kind`, but its lock file (held by
    the caller) and marker. RlooError (one line, nothing deleted) when it is not one, when anything
    in it is not rloo's, or when a lock inside it is held (see the module's docstring)."""
    folder = Path(folder)
    if kind_of(folder) != kind and not is_bookkeeping_only(folder):
        raise RlooError(
            f"{folder} is not empty and does not hold an rloo {kind} run; choose another output_dir "
            f"(nothing was deleted)"
        )
    locks: list[Path] = []
    _check(folder, LAYOUTS[kind], locks)
    with ExitStack() as stack:
        for lock in locks:
            stack.enter_context(hold_existing(lock))
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name not in (LOCK_NAME, MARKER):
                _remove(Path(entry.path))


def refuse_linked_folders(folder: Path, kind: str) -> None:
    """LinkedFolder (one line) when a folder rloo writes or deletes in, anywhere in the run folder
    `folder` of `kind` (LAYOUTS: plots/, checkpoints/, a checkpoint's ring/, tensorboard/, a
    pipeline's stages, a comparison's cells and report/...), is a symbolic link: its files would be
    written or deleted outside the run (rloo.runtime.runfolder.confine); or is no folder at all; or a
    file of rloo's is a FIFO, device or socket (`_refuse_links`). Checked when a command starts, so
    it is refused before anything is written; entries LAYOUTS does not name are not rloo's, and
    links at file names are replaced, never written through (rloo.runtime.runfolder.atomic)."""
    if Path(folder).is_dir() and kind_of(folder) == kind:
        _refuse_links(Path(folder), LAYOUTS[kind])


def _refuse_links(folder: Path, spec: dict) -> None:
    """Also refused: a FIFO, device or socket where rloo keeps a file (reading it would block or never
    end; rloo.runtime.runfolder.reading), and anything but a folder where rloo keeps one (`plots` as a
    file: the run would train, then fail to write its plots)."""
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        what = _match(entry.name, spec)
        if what is None:
            continue
        if what == FILE:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_symlink() and not stat.S_ISREG(st.st_mode):
                raise refusal(Path(entry.path), kind_of_mode(st.st_mode))
            if entry.name in IN_PLACE and st.st_nlink > 1:
                raise hard_linked(Path(entry.path), st.st_nlink)
            continue
        if entry.is_symlink():
            raise linked_folder(Path(entry.path))
        if not entry.is_dir(follow_symlinks=False):
            raise _not_a_folder(Path(entry.path), entry.stat(follow_symlinks=False).st_mode)
        if what != TREE:
            _refuse_links(Path(entry.path), LAYOUTS[what[1]] if isinstance(what, tuple) else what)


def _not_a_folder(path: Path, mode: int) -> RlooError:
    what = "a file" if stat.S_ISREG(mode) else kind_of_mode(mode)
    return RlooError(
        f"{path} is {what} where rloo keeps a folder of its own (it writes there); move it away and run "
        f"again (nothing was changed)"
    )


def _check(folder: Path, spec: dict, locks: list[Path], top: bool = True) -> None:
    """Refuse anything in `folder` that `spec` does not name; collect the nested lock files."""
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path, what = Path(entry.path), _match(entry.name, spec)
        if what is None:
            raise _not_ours(path)
        if entry.is_symlink() and _match(entry.name, {k: v for k, v in spec.items() if k != "*"}) is None:
            raise _not_ours(path)  # rloo makes no links: one named by a bare "*" (a method's run) is not ours
        if entry.is_symlink() or what == TREE:
            continue  # a link is unlinked, never followed; TREE is deleted whole
        is_dir = entry.is_dir(follow_symlinks=False)
        if what == FILE:
            if is_dir:
                raise _not_ours(path)
            if entry.name == LOCK_NAME and not top:
                locks.append(path)
        elif not is_dir:
            raise _not_ours(path)
        elif isinstance(what, tuple):
            _check_nested_run(path, what[1], locks)
        else:
            _check(path, what, locks, top=False)


def _check_nested_run(path: Path, kind: str, locks: list[Path]) -> None:
    if kind_of(path) == kind:
        _check(path, LAYOUTS[kind], locks, top=False)
    elif is_bookkeeping_only(path):
        locks.extend(p for p in path.iterdir() if p.name == LOCK_NAME)
    else:
        first = min(path.iterdir(), key=lambda p: p.name)
        raise RlooError(
            f"{option('overwrite')} would delete {first}, which rloo did not write: {path} does not hold an "
            f"rloo {kind} run; move it away or choose another output_dir (nothing was deleted)"
        )


def _match(name: str, spec: dict):
    if name in spec:
        return spec[name]
    for pattern, what in spec.items():
        if fnmatch.fnmatchcase(name, pattern):
            return what
    # the temp name of an atomic write (rloo.runtime.runfolder.atomic) of a file named here
    if name.startswith(".") and name.endswith(".tmp") and _match(name[1:-4], spec) == FILE:
        return FILE
    return None


def _not_ours(path: Path) -> RlooError:
    return RlooError(
        f"{option('overwrite')} would delete {path}, which rloo did not write; move it away or choose another "
        f"output_dir (nothing was deleted)"
    )


def _remove(path: Path) -> None:
    # rmtree never follows a link inside the tree (it unlinks it; on Linux it works through file
    # descriptors, so a folder swapped for a link mid-way is not followed either)
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)
