"""benchmarks/studies/offpolicy_fresh_seed.py: the README's prediction-interval tables are `predict` on the
committed results files, and `check`'s verdict is the distribution-free interval of the committed seeds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "docs" / "results" / "offpolicy"  # the study's README and results files
SCRIPTS = ROOT / "benchmarks" / "studies"
CELLS = {
    "results.json.xz": ["1e-3:0:paper,1e-3:16:tis,1e-3:16:topr"],
    "results-demo.json.xz": ["1e-3:0:paper,1e-3:1:tis,1e-3:1:clipped_surrogate", "1e-3:0:paper,1e-3:4:tis,1e-3:4:topr"],
}


@pytest.fixture(scope="module")
def fresh():
    sys.path.insert(0, str(SCRIPTS))  # offpolicy_fresh_seed imports offpolicy_study from beside it
    try:
        spec = importlib.util.spec_from_file_location("offpolicy_fresh_seed", SCRIPTS / "offpolicy_fresh_seed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPTS))


def test_predict_prints_the_readmes_interval_tables(fresh):
    readme = set((STUDY / "README.md").read_text().splitlines())
    for name, cell_sets in CELLS.items():
        results = fresh.study.load(STUDY / name)
        for cells in cell_sets:
            rows = "\n".join(fresh.predict(results, cells.split(","))).splitlines()
            assert len(rows) == 2 + 3 + 1 + 2 + 3, rows  # two tables: 3 differences, 3 cells
            assert [r for r in rows if r and r not in readme] == [], (name, cells)


def test_check_verdict_is_the_committed_seeds_range(fresh):
    results = fresh.study.load(STUDY / "results.json.xz")
    cells = ["1e-3:0:paper", "1e-3:16:tis"]
    xs = fresh.diffs(results, cells[1], cells[0])
    lo, hi = min(xs), max(xs)  # 10 seeds: the range, a 9/11 interval
    paper = 0.2
    inside = fresh.verdicts(results, cells, {cells[0]: paper, cells[1]: paper + (lo + hi) / 200})
    below = fresh.verdicts(results, cells, {cells[0]: paper, cells[1]: paper + (lo - 1) / 100})
    assert inside[0]["inside"] and not below[0]["inside"]
    assert inside[0]["coverage"] == pytest.approx(9 / 11, abs=1e-4) and inside[0]["lo"] == pytest.approx(lo, abs=0.01)


def test_collapse_is_below_half_the_sft_score(fresh):
    assert fresh.collapsed(0.16, "pass@1") and not fresh.collapsed(0.17, "pass@1")
    assert fresh.collapsed(0.20, "win_rate") and not fresh.collapsed(0.21, "win_rate")


def test_the_readmes_fresh_seed_table_is_the_committed_log(fresh):
    """fresh-seeds.jsonl (check's log of the seeds run for issue 57) printed by `table` is a table
    of the README, and each record's interval is the committed seeds' (not a later one)."""
    import json

    for log in ("fresh-seeds.jsonl", "fresh-seeds-31-35.jsonl"):
        _check_log(fresh, [json.loads(x) for x in (STUDY / log).read_text().splitlines() if x.strip()])


def _check_log(fresh, records: list[dict]) -> None:
    results = fresh.study.load(STUDY / "results.json.xz")
    for r in records:
        a, b = r["difference"].split(" - ")
        pi = fresh.order_prediction(fresh.diffs(results, a, b))
        assert (r["lo"], r["hi"]) == (round(pi.lo, 2), round(pi.hi, 2))
        assert r["value"] == round(100 * (r["scores"][a] - r["scores"][b]), 2)
        assert r["inside"] == pi.holds(100 * (r["scores"][a] - r["scores"][b]))
    readme = set((STUDY / "README.md").read_text().splitlines())
    assert [row for row in fresh.log_table(records) if row not in readme] == []
