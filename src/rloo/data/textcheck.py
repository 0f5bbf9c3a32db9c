"""Local dataset files read as written, or refused in one line naming the file and line.

`datasets` reads a JSON-lines, JSON or CSV file through pyarrow or pandas, which
  - accept bytes that are not UTF-8 (one Latin-1 line among UTF-8 ones) and fail later, when a row
    is turned into Python text, with a 40-line UnicodeDecodeError that names no file or line;
  - read a CSV row with more fields than the header by making its first fields the index (every
    row then trains on the wrong columns, without a word), and one with fewer as missing values.
So a local text file is checked before `datasets` sees it: every line decodes as UTF-8, and every
CSV record (Python's csv module: the same quoting rules as pandas' default) has as many fields as
the header. Rows of other sources (Parquet, a `save_to_disk` folder, the Hub) are checked as they
are read (`rows`): text that is not UTF-8 there names the row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rloo.errors import RlooError


def check_utf8(path: Path) -> None:
    """RlooError naming the first line of `path` that is not UTF-8 (streamed: one line in memory)."""
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RlooError(
                    f"dataset {str(path)!r} line {n} is not UTF-8 text (byte 0x{line[e.start]:02x} at column "
                    f"{e.start + 1}); save the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
                ) from None


def check_csv_fields(path: Path) -> None:
    """RlooError naming the first record of CSV file `path` whose field count differs from its
    header's (blank lines are skipped, as pandas does). A record's line is where it starts (a quoted
    field may span lines)."""
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header, start = None, 1
        for record in reader:
            if record:  # [] is a blank line
                if header is None:
                    header = record
                elif len(record) != len(header):
                    fields = f"{len(record)} field" + ("s" if len(record) != 1 else "")
                    raise RlooError(
                        f"dataset {str(path)!r} line {start} has {fields}, the header has {len(header)} "
                        f"({', '.join(header)[:80]}); quote a field that holds a comma, or fix the row"
                    )
            start = reader.line_num + 1


def check_text_file(path: Path, builder: str) -> None:
    """The checks of a local file before `datasets` reads it with `builder` ("json", "csv", ...)."""
    if builder in ("json", "csv"):
        check_utf8(path)
    if builder == "csv":
        check_csv_fields(path)


def rows(table: Iterable[Any], path: str) -> Iterator[dict]:
    """The rows (dicts; `datasets` types its `__iter__` loosely, hence Any) of a `datasets` table;
    text that is not UTF-8 in one (pyarrow decodes it only now) is one RlooError naming the row
    (counted from 1)."""
    n = 0
    try:
        for row in table:
            yield row
            n += 1
    except UnicodeDecodeError as e:
        raise RlooError(
            f"dataset {path!r} row {n + 1} holds text that is not UTF-8 ({e.reason} at byte {e.start}); "
            f"save the data as UTF-8"
        ) from None
