"""benchmarks/study_report.py: a study's committed report is what `rloo compare`'s report code makes from the
study's one archive (docs/results/compare-tuned-all/cells.tar.xz), byte for byte in report.md and
results.json; packing is deterministic and keeps only what the report reads."""

from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

import pytest

from rloo.errors import RlooError

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "docs" / "results" / "compare-tuned-all"


@pytest.fixture(scope="module")
def sr():
    spec = importlib.util.spec_from_file_location("study_report", ROOT / "benchmarks" / "study_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_report_is_regenerated_from_the_archive(sr, tmp_path):
    made = sr.report(STUDY / "cells.tar.xz", tmp_path / "study")
    for name in sr.COMPARED:
        assert (made / name).read_bytes() == (STUDY / "report" / name).read_bytes(), name
    assert {p.name for p in made.glob("*.png")} == {p.name for p in (STUDY / "report").glob("*.png")}


def _study(root: Path) -> Path:
    """A fake study folder: what the report reads, and what it must not be packed with."""
    for rel, text in {
        "config.yaml": "tasks: [t]\n",
        "tuning/t/selection.json": "{}",
        "tuning/t/seed-100/rloo.t00/result.json": "{}",
        "runs/t/seed-0/sft/result.json": "{}",
        "runs/t/seed-0/rloo/result.json": "{}",
        "runs/t/seed-0/rloo/metrics.jsonl": '{"step": 1}\n',
        "runs/t/seed-0/sft/model/model.safetensors": "weights",
        "runs/t/seed-0/.rloo.lock": "",
        "report/results.json": "{}",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_pack_keeps_only_the_reports_inputs_and_is_deterministic(sr, tmp_path):
    study = _study(tmp_path / "study")
    assert sr.pack(study, tmp_path / "a.tar.xz") == 6
    (study / "runs/t/seed-0/rloo/result.json").touch()  # a later mtime: the archive's bytes do not change
    sr.pack(study, tmp_path / "b.tar.xz")
    assert (tmp_path / "a.tar.xz").read_bytes() == (tmp_path / "b.tar.xz").read_bytes()
    with tarfile.open(tmp_path / "a.tar.xz") as tar:
        names = tar.getnames()
    assert names == sorted(names) and not any("model" in n or "lock" in n or n.startswith("report") for n in names)


def test_report_refuses_a_folder_that_is_not_empty(sr, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("x")
    with pytest.raises(RlooError, match="is not empty"):
        sr.report(STUDY / "cells.tar.xz", tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


@pytest.mark.parametrize("name", ["../outside.json", "/abs.json", "link"])
def test_unpack_refuses_a_member_that_could_write_outside(sr, name, tmp_path):
    archive = tmp_path / "bad.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        info = tarfile.TarInfo(name)
        if name == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(RlooError, match="not a plain file under its folder"):
        sr.unpack(archive, tmp_path / "out" / "study")
    assert not (tmp_path / "out").exists() and not (tmp_path / "outside.json").exists()
