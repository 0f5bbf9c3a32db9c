"""benchmarks/tuned_vs_untuned.py (the tuned-vs-untuned table in docs/results/compare-tuned): pairing by
seed, the interval, and the refusal when a seed's SFT model differs between the two comparisons."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "tuned_vs_untuned.py"


@pytest.fixture(scope="module")
def tvu():
    spec = importlib.util.spec_from_file_location("tuned_vs_untuned", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runs(**per_method):
    return {"t": {m: [{"seed": s, "win_rate": w, "kl": 1.0} for s, w in enumerate(ws)] for m, ws in per_method.items()}}


def test_paired_by_seed_over_the_common_seeds(tvu):
    tuned = tvu.by_seed([_runs(sft=[0.4, 0.5, 0.6], rloo=[0.7, 0.6, 0.9])])
    # the untuned file has a fourth seed the tuned one lacks: left out of the pairing
    untuned = tvu.by_seed([_runs(sft=[0.4, 0.5, 0.6, 0.3], rloo=[0.6, 0.5, 0.7, 0.0])])
    lines, same = tvu.compare(tuned, untuned)
    assert same and "identical on seeds [0, 1, 2]: yes" in lines[0]
    row = next(ln for ln in lines if ln.startswith("| rloo"))
    # differences 0.1, 0.1, 0.2: mean 0.133, sd 0.0577, t(2) = 4.303 -> half-width 0.143
    assert "| 3 | 0.600 | 0.733 | +0.133 ± 0.143 |" in row


def test_a_different_sft_model_fails_the_check(tvu):
    lines, same = tvu.compare(tvu.by_seed([_runs(sft=[0.4, 0.5])]), tvu.by_seed([_runs(sft=[0.4, 0.51])]))
    assert not same and "NO [1]" in lines[0]


def test_one_file_pairs_its_own_untuned_runs(tvu):
    data = _runs(sft=[0.4, 0.5], rloo=[0.7, 0.6], **{"rloo@untuned": [0.6, 0.6], "ppo@2x2": [0.5, 0.5]})
    lines, same = tvu.compare(*tvu.split_untuned(tvu.by_seed([data])))
    assert same and "identical on seeds [0, 1]: yes" in lines[0]
    # rloo: differences 0.1, 0.0; ppo@2x2 has no untuned run: no row
    assert any(ln.startswith("| rloo | 2 | 0.600 | 0.650 | +0.050") for ln in lines)
    assert not any(ln.startswith(("| ppo@2x2", "| rloo@untuned")) for ln in lines)
