"""Round five (issue 58): a dataset is read as written or refused in one line naming the file and
line (or row), before any output folder. Before: one Latin-1 line among UTF-8 ones in a JSON-lines
file was a 30-40-line UnicodeDecodeError (in a CSV or JSON file, pyarrow's message without a line);
a CSV whose first row has more fields than its header was silently misread (pandas made the extra
leading fields the index, so every row trained on the wrong columns); a row with fewer fields was
"expected text in the dataset, got NoneType"; a Parquet file holding bytes that are not UTF-8
was a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from rloo.config import DatasetSettings
from rloo.data.datasets import read_records

from .test_bad_input import _cli, _one_line

UTF8 = '{"prompt": "caf\u00e9 au lait", "completion": " ok"}\n'.encode()
LATIN1 = '{"prompt": "caf\u00e9 noir", "completion": " ok"}\n'.encode("latin-1")

FILES = {
    "latin1.jsonl": (UTF8 * 3 + LATIN1 + UTF8, "line 4 is not UTF-8 text (byte 0xe9 at column 16)"),
    "latin1.json": (b"[" + UTF8.strip() + b",\n" + LATIN1.strip() + b"]", "line 2 is not UTF-8 text (byte 0xe9"),
    "latin1.csv": (b"prompt,completion\na,b\ncaf\xe9,x\n", "line 3 is not UTF-8 text (byte 0xe9 at column 4)"),
    "wide-first.csv": (b"prompt,completion\nextra,cols,a,b\nc,d\n", "line 2 has 4 fields, the header has 2"),
    "wide-later.csv": (b"prompt,completion\na,b\n\nc,d,e\n", "line 4 has 3 fields, the header has 2"),
    "narrow.csv": (b"prompt,completion\na,b\nc\n", "line 3 has 1 field, the header has 2"),
}


def _parquet_not_utf8(path: Path) -> None:
    """A Parquet file whose second prompt holds the Latin-1 byte 0xe9 (pyarrow writes it unchecked)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data, offsets = b"a" + b"caf\xe9", pa.array([0, 1, 5], pa.int32()).buffers()[1]
    bad = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(data)])
    pq.write_table(pa.table({"prompt": bad, "completion": pa.array([" b", " c"])}), path)


@pytest.mark.parametrize("name", [*FILES, "latin1.parquet"])
def test_data_not_as_its_header_or_encoding_says_is_refused_with_its_line(name, tiny_model_dir, tmp_path, capsys):
    data = tmp_path / name
    if name.endswith(".parquet"):
        _parquet_not_utf8(data)
        needle = "row 2 holds text that is not UTF-8"
    else:
        raw, needle = FILES[name]
        data.write_bytes(raw)
    out = tmp_path / "out"
    rc, err = _cli(["sft", f"model={tiny_model_dir}", f"output_dir={out}", f"dataset.path={data}"], capsys)
    _one_line(rc, err, "rloo sft: error: ", f"dataset {str(data)!r} ", needle)
    assert not out.exists()


def test_valid_csv_and_utf8_are_read_as_written(tmp_path):
    """Control: quoted commas, a quoted line break, blank lines and non-ASCII UTF-8 are accepted, and
    read as the plain csv module reads them."""
    data = tmp_path / "ok.csv"
    data.write_text('prompt,completion\n"a, with comma",b\n\n"two\nlines",caf\u00e9\n', encoding="utf-8")
    recs = read_records(DatasetSettings(path=str(data)), ("prompt", "completion"))
    assert [(r.prompt, r.completion) for r in recs] == [("a, with comma", "b"), ("two\nlines", "caf\u00e9")]
    jsonl = tmp_path / "ok.jsonl"
    jsonl.write_bytes(UTF8 * 2)
    assert [r.prompt for r in read_records(DatasetSettings(path=str(jsonl)), ("prompt", "completion"))] == [
        "caf\u00e9 au lait"
    ] * 2
