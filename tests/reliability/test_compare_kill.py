"""Two `rloo compare` processes on one folder, one of them killed (SIGKILL) at a random point, then
the command rerun: the final results.json equals an uninterrupted single-process run's, cell by
cell (every number but the seconds a run took). Each schedule seed draws which process dies and
after which of its metrics records (`kill-log@n`: inside an SFT, reward-model or RL run of
whichever cell it holds then). Every process runs with one torch thread (reliability._runner), so
the runs compare exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rloo.config import save_config

from ._runner import run_cli, start_cli
from .conftest import tiny_study_config

SETTINGS = {"seeds": [0, 1]}  # two cells for two processes, and the variance cell, which reads seed 0's models


def _results(out: Path) -> dict:
    """results.json without the wall-clock seconds of each run."""
    data = json.loads((out / "report" / "results.json").read_text())
    return {
        task: {m: [{k: v for k, v in r.items() if k != "seconds"} for r in runs] for m, runs in methods.items()}
        for task, methods in data.items()
    }


def _config(tmp_path: Path, out: Path) -> str:
    path = tmp_path / f"{out.name}.yaml"
    save_config(tiny_study_config(out, **SETTINGS), path)
    return str(path)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmp-ref")
    out = tmp / "ref"
    rc, log = run_cli(["compare", "--config", _config(tmp, out)], tmp / "ref.log", timeout=1800)
    assert rc == 0, log
    return _results(out)


@pytest.mark.slow  # three tiny comparisons per schedule: minutes
# schedule seeds drawn so that the kills fall in different stages: 1 kills seed 1's holder in its RL
# run (record 7); 3 and 7 kill seed 0's holder at the end of (record 2, before the model is saved)
# and inside (record 1) its SFT, so the survivor's gradient variance, which reads seed 0's models,
# finds them missing and makes the cell itself, over the half-made SFT folder
@pytest.mark.parametrize("schedule", [1, 3, 7])
def test_killed_compare_process_then_rerun_equals_uninterrupted(schedule, uninterrupted, tmp_path):
    rng = random.Random(f"compare-kill/{schedule}")
    out = tmp_path / "cmp"
    argv = ["compare", "--config", _config(tmp_path, out)]
    victim, n = rng.randrange(2), rng.randint(1, 8)  # each process writes 8+ records in its first cell
    procs = [start_cli(argv, tmp_path / f"p{i}.log", fault=f"kill-log@{n}" if i == victim else None) for i in range(2)]
    for p in procs:
        p.join(1800)
    logs = [(tmp_path / f"p{i}.log").read_text() for i in range(2)]
    assert procs[victim].exitcode == -9, logs[victim]  # it was killed mid-way, not done before
    assert procs[1 - victim].exitcode == 0, logs[1 - victim]
    rc, log = run_cli(argv, tmp_path / "rerun.log", timeout=1800)
    assert rc == 0, log
    assert _results(out) == uninterrupted, f"process {victim} killed after its record {n}; logs:\n" + "\n".join(logs)
