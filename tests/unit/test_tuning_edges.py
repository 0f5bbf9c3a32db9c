"""benchmarks/studies/tuning_edges.py (that study's grid-edge check): which choices sit
on an edge, the step past it, and the table comparing the two on the tuning seeds."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rloo.config import CompareConfig
from rloo.experiments.tuning import trial_settings

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "studies" / "tuning_edges.py"


@pytest.fixture(scope="module")
def te():
    spec = importlib.util.spec_from_file_location("tuning_edges", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tuning_edges"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules["tuning_edges"]


def test_step_past_continues_the_grid_on_a_log_scale(te):
    assert te.step_past([1e-4, 3e-4, 1e-3], 3e-4) is None  # inside
    side, value = te.step_past([1e-4, 3e-4, 1e-3], 1e-4)
    assert side == "below" and value == pytest.approx(1e-4 / 3)
    side, value = te.step_past([0.25, 0.5, 1.0], 1.0)
    assert side == "above" and value == pytest.approx(2.0)
    assert te.step_past([0.25], 0.25) is None  # one point: no spacing to continue


def _study(tmp_path: Path, chosen: dict[str, int]) -> tuple[CompareConfig, Path]:
    """A finished study of rloo and dpo on summarize: every trial scored 0.50 and 0.51 on the two
    tuning seeds but the chosen one, 0.55 and 0.56."""
    cfg = CompareConfig(
        methods=["rloo", "dpo"],
        tasks=["summarize"],
        tuning={
            "trials": 4,
            "seeds": [100, 101],
            "lr": [1e-4, 1e-3],
            "beta": [0.25, 0.5],
            "grids": {"dpo": {"lr": [1e-4, 1e-3], "beta": [0.1, 0.3]}},
        },
    )
    study = tmp_path / "study"
    for m in cfg.methods:
        for i, t in enumerate(trial_settings(cfg.tuning, m)):
            for s in cfg.tuning.seeds:
                _result(study, s, f"{m}.t{i:02d}", (0.55 if i == chosen[m] else 0.50) + (s - 100) / 100, t)
    return cfg, study


def _result(root: Path, seed: int, name: str, win: float, settings: dict) -> None:
    d = root / "tuning" / "summarize" / f"seed-{seed}" / name
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"win_rate": win, "settings": settings}))


def test_edge_points_until_the_choice_is_inside(te, tmp_path):
    # rloo's trial 0 is lr 1e-4, beta 0.25 (both on the lower edge); dpo's trial 3 is dpo_lr 1e-3,
    # dpo_beta 0.3 (both on the upper edge)
    cfg, study = _study(tmp_path, {"rloo": 0, "dpo": 3})
    out = tmp_path / "edges"
    points = te.edge_points(cfg, "summarize", study, out)
    assert {n: s for n, (_, s) in points.items()} == {
        "rloo.lr-below": {"lr": 1e-5, "beta": 0.25},
        "rloo.beta-below": {"lr": 1e-4, "beta": 0.125},
        "dpo.dpo_lr-above": {"algorithm_settings": {"dpo_lr": 0.01, "dpo_beta": 0.3}},
        "dpo.dpo_beta-above": {"algorithm_settings": {"dpo_lr": 1e-3, "dpo_beta": 0.9}},
    }
    # rloo's lr 1e-5 beats the choice (0.57, 0.56 against 0.55, 0.56); the rest lose
    for name, (_, settings) in points.items():
        for s, w in ((100, 0.57), (101, 0.56)) if name == "rloo.lr-below" else ((100, 0.40), (101, 0.40)):
            _result(out, s, name, w, settings)
    assert te.moved(cfg, study, out, "summarize")["rloo"].name == "rloo.lr-below"
    # the new choice is on the new edge: one more step down; dpo's choice is inside now
    assert te.edge_points(cfg, "summarize", study, out) == {"rloo.lr-below2": ("rloo", {"lr": 1e-6, "beta": 0.25})}
    table = te.report(cfg, study, out)
    row = next(r for r in table.splitlines() if "| lr 1e-05, beta 0.25 |" in r)
    assert row.endswith("| 0.565 | +0.020, +0.000 | YES |")
    assert sum("not run" in r for r in table.splitlines()) == 2  # the next step; rloo's reported runs
    _result(out, 100, "rloo.lr-below2", 0.30, {"lr": 1e-6, "beta": 0.25})
    _result(out, 101, "rloo.lr-below2", 0.30, {"lr": 1e-6, "beta": 0.25})
    assert te.edge_points(cfg, "summarize", study, out) == {}  # inside: 1e-6 < 1e-5 (chosen) < 1e-4


def test_each_edge_gets_its_own_direction(te, tmp_path):
    cfg, study = _study(tmp_path, {"rloo": 3, "dpo": 0})  # rloo: lr 1e-3, beta 0.5 (upper); dpo: lower
    names = set(te.edge_points(cfg, "summarize", study, tmp_path / "edges"))
    assert names == {"rloo.lr-above", "rloo.beta-above", "dpo.dpo_lr-below", "dpo.dpo_beta-below"}
