"""Round five (issue 58): what `rloo compare` reads back from a finished study is of the shape it
writes, or the rerun stops at once with one line naming the file (exit 2, nothing changed). Before:
a result.json holding `{}`, NaN or null numbers was a 27-30-line KeyError/TypeError in
compare/plots.py after the study had run; a gradient_variance.json that was not JSON, or `[]`, was
27-36 lines from compare/tables.py. And a study copied or moved elsewhere was refused as "a
comparison with other settings" although only its output_dir differed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rloo.cli import main
from rloo.experiments.compare.folder import _dump

from .conftest import tiny_study_config
from .test_bad_input import _files, _one_line

CELL = Path("runs") / "summarize" / "seed-0"


def _rerun(out: Path, config: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["compare", "--config", str(config), f"output_dir={out}"])
    return rc, capsys.readouterr().err.strip()


def _nan_kl(text: str) -> str:
    return json.dumps(json.loads(text) | {"kl": float("nan")})  # json writes NaN, and reads it back


def _all_null(text: str) -> str:
    return json.dumps(dict.fromkeys(json.loads(text)))


@pytest.mark.parametrize(
    "rel, damage, needle",
    [
        (CELL / "rloo" / "result.json", lambda t: "{}", "cannot be used: it has no 'win_rate'"),
        (CELL / "rloo" / "result.json", _nan_kl, "cannot be used: its 'kl' is nan, not a finite number"),
        (CELL / "sft" / "result.json", _all_null, "cannot be used: its 'win_rate' is None, not a finite number"),
        (CELL / "gradient_variance.json", lambda t: t[: len(t) // 2], "cannot be used: it is not valid JSON"),
        (CELL / "gradient_variance.json", lambda t: "[]", "it is not an object with 'sft' and 'weak' measurements"),
    ],
    ids=["result-empty", "result-nan", "result-null", "variance-cut", "variance-list"],
)
def test_a_rerun_refuses_a_study_file_of_the_wrong_shape(rel, damage, needle, tiny_study, tmp_path, capsys):
    out = tmp_path / "cmp"
    shutil.copytree(tiny_study, out)
    (out / "config.yaml").write_text(_dump(tiny_study_config(out)))  # its own place (a moved study: below)
    (out / rel).write_text(damage((out / rel).read_text()))
    before = _files(out)
    rc, err = _rerun(out, out / "config.yaml", capsys)
    _one_line(rc, err, "rloo compare: error: ", str(out / rel), needle)
    assert _files(out) == before, "the study folder was changed"


def test_a_moved_study_is_the_same_study(tiny_study, tmp_path, capsys):
    """Only output_dir differs from the saved settings: the rerun rebuilds the report, trains nothing."""
    out = tmp_path / "moved" / "cmp"
    shutil.copytree(tiny_study, out)
    results = {p: p.read_bytes() for p in out.glob("runs/*/*/*/result.json")}
    (out / "report" / "report.md").unlink()
    rc, err = _rerun(out, out / "config.yaml", capsys)
    assert rc == 0, err
    assert (out / "report" / "report.md").exists()
    assert {p: p.read_bytes() for p in results} == results, "a finished run was made again"
