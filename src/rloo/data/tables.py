"""Reading one split of a dataset as a `datasets.Dataset`: a Hub dataset, a local JSONL / JSON / CSV /
Parquet file, or a `save_to_disk` folder; any loading failure is one RlooError line."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from rloo.data.textcheck import check_text_file
from rloo.errors import RlooError
from rloo.runtime.inputs.names import check_name
from rloo.runtime.inputs.objects import held_table, is_held

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_table(path: str, name: str | None, split: str):
    """Rows of one split as a `datasets.Dataset` (one handed to the Python API: rloo.runtime.inputs.objects);
    any loading failure is one RlooError line."""
    if is_held(path):
        return held_table(path, split)
    with _quiet_datasets(local=Path(path).exists()):
        return _load_table_loud(path, name, split)


@contextmanager
def _quiet_datasets(local: bool):
    """datasets logs a traceback of its own before raising on a malformed file, and shows a
    progress bar for building a local file's cache: both would bury our one-line error."""
    import datasets  # lazily: a 1-3 s import (pyarrow, pandas), needed only with a `dataset:` section

    level = datasets.logging.get_verbosity()
    bars = datasets.utils.are_progress_bars_disabled()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    if local:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if local and not bars:
            datasets.enable_progress_bars()


def _root_cause(e: BaseException) -> str:
    """The innermost message: datasets wraps a parse error in 'An error occurred while generating'."""
    while (inner := e.__cause__ or e.__context__) is not None and str(inner).strip():
        e = inner
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _load_table_loud(path: str, name: str | None, split: str):
    import datasets  # lazily: a 1-3 s import (pyarrow, pandas), needed only with a `dataset:` section

    p = Path(path)
    try:
        if p.is_dir() and ((p / "dataset_dict.json").exists() or (p / "state.json").exists()):
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise RlooError(f"dataset {path!r} has no split {split!r} (splits: {', '.join(map(str, ds))})")
                ds = ds[split]
            return ds
        if p.is_file():
            if p.stat().st_size == 0:
                raise RlooError(f"dataset {path!r} split {split!r} is empty")
            builder = FILE_BUILDERS.get(p.suffix.lower())
            if builder is None:
                raise RlooError(f"dataset file {path!r}: unknown type {p.suffix!r} (use .jsonl, .json, .csv, .parquet)")
            check_text_file(p, builder)  # not UTF-8, or a CSV row of another width: refused, not misread
            return datasets.load_dataset(builder, data_files=str(p), split="train")
        check_name(path, "dataset.path", repo_type="dataset")  # a typo fails here, not after Hub retries
        return datasets.load_dataset(path, name, split=split)
    except RlooError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types; the user needs the message
        what = "cannot be read" if p.exists() else "could not be loaded"
        cause = (_jsonl_problem(p) if p.is_file() and p.suffix.lower() == ".jsonl" else None) or _root_cause(e)
        raise RlooError(f"dataset {path!r} (split {split!r}) {what}: {cause}") from e


def _jsonl_problem(p: Path) -> str | None:
    """The first line of a JSON-lines file that is not one JSON object ("line 3: ..."); datasets'
    own message gives a byte position in a chunk, not a line."""
    with open(p, encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                return f"line {n} is not valid JSON ({e.msg}, column {e.colno})"
            if not isinstance(row, dict):
                return f"line {n} is a JSON {type(row).__name__}, expected an object"
    return None
