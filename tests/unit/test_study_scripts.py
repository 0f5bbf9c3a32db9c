"""The study scripts in benchmarks/ rerun on their committed inputs print what their study quotes: each
output line of agents_seeds.py, compare_check.py and gradient_matrix_table.py's summary is a line of
the study's committed markdown (docs/results/<study>/), so a change to a script or to the code it
imports that changes its numbers or its table fails here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
STUDIES = ROOT / "benchmarks" / "studies"  # one study's scripts; their results stay in RESULTS


def _script(name: str, path: Path | None = None):
    """benchmarks/<name>.py, or the study script at `path`, as a module."""
    spec = importlib.util.spec_from_file_location(name, path or ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unpack(archive: Path, into: Path) -> Path:
    return _script("study_report").unpack(archive, into)


def _missing(printed: str, md: Path) -> list[str]:
    """Printed lines (blank ones aside) that are not lines of `md`."""
    lines = set(md.read_text().splitlines())
    return [ln for ln in printed.splitlines() if ln.strip() and ln not in lines]


def _seed_folders(jsons: list[Path], into: Path) -> list[str]:
    """A run folder per archived seed<S>.json (its summary.json), in seed order."""
    runs = []
    for js in sorted(jsons, key=lambda p: int(p.stem.removeprefix("seed"))):
        run = into / js.stem
        run.mkdir(parents=True)
        (run / "summary.json").write_text(js.read_text())
        runs.append(str(run))
    return runs


# the guess game has no tool: its README leaves out the all-zero tool-calls row
def test_agents_seeds_prints_the_games_seed_table(tmp_path):
    raw = _unpack(RESULTS / "agents-game" / "runs.tar.xz", tmp_path / "raw")
    runs = _seed_folders([raw / f"seed{s}.json" for s in range(3)], tmp_path / "runs")
    mod = _script("agents_seeds")
    printed = mod.table([mod.load(r) for r in runs])
    missing = _missing(printed, RESULTS / "agents-game" / "README.md")
    assert printed.count("\n") >= 7 and [m for m in missing if not m.startswith("| tool calls")] == []


def test_agents_seeds_rows_print_each_calculator_setting(tmp_path):
    """The calculator study archives one folder of seed<S>.json per setting (defaults, CPU kernels,
    threads); `--rows` of each is a table of its README."""
    raw = _unpack(RESULTS / "agents-calculator" / "runs.tar.xz", tmp_path / "raw")
    settings = sorted(p for p in raw.iterdir() if p.is_dir())
    mod = _script("agents_seeds")
    assert len(settings) >= 2
    for setting in settings:
        runs = _seed_folders(list(setting.glob("seed*.json")), tmp_path / setting.name)
        printed = mod.seed_rows([mod.load(r) for r in runs])
        assert printed.count("\n") == len(runs) + 3
        assert _missing(printed, RESULTS / "agents-calculator" / "README.md") == [], setting.name


def test_agents_seeds_tool_pass_is_the_success_among_tool_calls():
    """pass = tool share x tool pass + no-tool share x no-tool pass, solved for the tool pass."""
    tool_pass = _script("agents_seeds").tool_pass
    assert tool_pass({"pass_at_1": 0.25 * 0.7 + 0.75 * 0.01, "no_tool_share": 0.75, "no_tool_pass": 0.01}) == (
        pytest.approx(0.7)
    )
    assert tool_pass({"pass_at_1": 0.5, "no_tool_share": 1.0, "no_tool_pass": 0.5}) is None
    assert tool_pass({"pass_at_1": 0.5}) is None  # a task without a tool
    # every episode called the tool: the evaluation logs no_tool_pass None (AMX seed 12 printed "-")
    assert tool_pass({"pass_at_1": 0.9825, "no_tool_share": 0.0, "no_tool_pass": None}) == 0.9825


def test_compare_check_prints_the_committed_reproduction(capsys):
    committed, rerun = RESULTS / "compare" / "results.json", RESULTS / "compare" / "rerun-seeds345-results.json"
    assert _script("compare_check").main([str(committed), str(rerun)]) == 0  # every rerun mean inside
    printed = capsys.readouterr().out
    assert "48 of 48 rerun means inside" in printed
    assert not _missing(printed, RESULTS / "compare" / "reproduction.md")


def test_compare_check_fails_a_rerun_outside_the_intervals(tmp_path, capsys):
    committed = json.loads((RESULTS / "compare" / "results.json").read_text())
    moved = {
        t: {m: [dict(r, win_rate=r["win_rate"] + 0.5) for r in rs] for m, rs in d.items()} for t, d in committed.items()
    }
    (tmp_path / "rerun.json").write_text(json.dumps(moved))
    assert _script("compare_check").main([str(RESULTS / "compare" / "results.json"), str(tmp_path / "rerun.json")]) == 1
    assert "| NO |" in capsys.readouterr().out


def test_gradient_matrix_table_summarises_the_committed_rows(tmp_path, capsys):
    rows = _unpack(RESULTS / "gradient-matrix" / "rows.tar.xz", tmp_path)
    _script("gradient_matrix_table").main([str(p) for p in sorted(rows.glob("gradient_matrix.*.json"))])
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("3392 combinations") and summary.endswith("failures: 0")
    assert not _missing(summary, RESULTS / "gradient-matrix" / "README.md")


def test_offpolicy_study_report_prints_the_readmes_table():
    """docs/results/offpolicy: the README's two tables are `report` run on the committed results.json.xz
    (arithmetic) and results-demo.json.xz (the demo), cells in the files' order."""
    study = RESULTS / "offpolicy"
    mod = _script("offpolicy_study", STUDIES / "offpolicy_study.py")
    for name, rows in (("results.json.xz", 25), ("results-demo.json.xz", 20)):
        results = mod.load(study / name)
        printed = mod.markdown(mod.report(results, list(results)))
        assert printed.count("\n") >= rows and not _missing(printed, study / "README.md"), name


def test_bench_vllm_table_prints_the_readmes_table_from_its_archive(tmp_path, capsys):
    """docs/results/bench-vllm: the quiet run's table is bench_vllm_table.py run on the bench.json files of
    runs-idle.tar.xz."""
    import tarfile

    study = RESULTS / "bench-vllm"
    with tarfile.open(study / "runs-idle.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    mod = _script("bench_vllm_table", STUDIES / "bench_vllm_table.py")
    files = [tmp_path / f"bench_{s}-{d}.json" for s in "SML" for d in ("float32", "bfloat16")]
    mod.main([str(f) for f in files])
    printed = capsys.readouterr().out.strip()
    assert printed.count("\n") == 19 and not _missing(printed, study / "README.md")


def test_offpolicy_merge_places_new_cells_by_lr_and_lag_and_keeps_committed_seeds():
    """A later session's cells go after the last committed cell of their lr:N, new seeds of a committed
    cell join it in seed order, and a seed both hold keeps the committed numbers (its s/step)."""
    mod = _script("offpolicy_study", STUDIES / "offpolicy_study.py")
    into = {"1e-3:0:paper": {"0": {"s": 1}}, "1e-3:1:tis": {"0": {"s": 2}}, "1e-3:4:tis": {"0": {"s": 3}}}
    new = {"1e-3:1:cispo": {"0": {"s": 4}}, "1e-3:1:tis": {"1": {"s": 5}, "0": {"s": 9}}, "1e-4:1:tis": {"0": {}}}
    got = mod.merge(into, new)
    assert list(got) == ["1e-3:0:paper", "1e-3:1:tis", "1e-3:1:cispo", "1e-3:4:tis", "1e-4:1:tis"]
    assert got["1e-3:1:tis"] == {"0": {"s": 2}, "1": {"s": 5}} and list(got["1e-3:1:tis"]) == ["0", "1"]
