"""A model folder's tokenizer and safetensors files, checked before any loader opens them: an empty, cut-off or
garbled file is one line naming it (safetensors itself raised `header too small` or `incomplete
metadata` from deep inside transformers). Reads each file's header only (8 bytes + a JSON header).

Layout (the safetensors format): 8 bytes little-endian header length n, n bytes of JSON mapping
each tensor to its dtype, shape and [begin, end) byte offsets into the data after the header.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

from rloo.errors import RlooError
from rloo.runtime.runfolder.reading import kind_of_mode

MAX_HEADER = 100 * 2**20  # safetensors' own limit on the JSON header


def safetensors_problem(f: Path) -> str | None:
    """Why `f` is not a whole safetensors file, or None."""
    size = f.stat().st_size
    if size < 8:
        return "is empty" if size == 0 else f"has {size} bytes, too few for a safetensors header"
    with f.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > MAX_HEADER or 8 + n > size:
            return f"is cut off or not a safetensors file (its header says {n} bytes; the file has {size})"
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "has a garbled header (not JSON)"
    if not isinstance(header, dict):
        return "has a garbled header (not a JSON object)"
    ends = [v.get("data_offsets", [0, 0])[1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    need = 8 + n + max(ends, default=0)
    if need > size:
        return f"is cut off: its tensors need {need} bytes, the file has {size}"
    return None


def check_model_files(path: str, what: str) -> None:
    """One RlooError line for an entry of the local model folder `path` that is neither a file nor a
    folder once links are followed (a FIFO, device or socket): every command hung on a FIFO at
    config.json (its first reader waits for a writer), and one at model.safetensors was "empty".
    Links are followed: a Hugging Face cache folder is links into its blobs."""
    folder = Path(path)
    if not folder.is_dir():
        return
    for f in sorted(folder.iterdir()):
        try:
            mode = os.stat(f).st_mode
        except OSError:  # a dangling link: the loader says what is missing
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise RlooError(
                f"{what} {path!r}: {f.name} is {kind_of_mode(mode)}, not a regular file; put the file itself "
                "there (rloo never waits on a pipe or reads a device as a model file)"
            )


def check_weight_files(path: str, what: str) -> None:
    """One RlooError line for the first broken *.safetensors file in the local folder `path`."""
    folder = Path(path)
    if not folder.is_dir():
        return
    for f in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(f)
        if problem is not None:
            raise RlooError(
                f"{what} {path!r}: weights file {f.name} {problem}; copy the model again "
                "(an interrupted download or copy leaves such a file)"
            )


# The files a Hugging Face tokenizer is read from: one of them is in every saved tokenizer (the fast
# tokenizer's tokenizer.json, or the config and vocabulary of a slow one).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def check_tokenizer_files(path: str, what: str) -> None:
    """One RlooError line when the local folder `path` holds no tokenizer: every stage loads the
    tokenizer from each model's folder (rloo.modeling.loading), and without one `rloo pipeline`
    made its run folder and failed 20 s later with transformers' text."""
    folder = Path(path)
    if not folder.is_dir() or any((folder / name).is_file() for name in TOKENIZER_FILES):
        return
    raise RlooError(
        f"{what} {path!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES[:2])}, ...); save the model's "
        "tokenizer into the folder (tokenizer.save_pretrained(folder)) or copy it from where the model came from"
    )
