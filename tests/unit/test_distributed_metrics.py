"""Metrics under torchrun: a mean over processes, except an extreme of the rows (is/ratio_max, a
maximum length), which is the extreme over every process's rows, and a standard deviation beside
its mean (adv/std), which is the one over every process's rows: as one process holding the whole
batch would log them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from helpers.child_env import child_env
from rloo.runtime.distributed import _extreme

HELPERS = Path(__file__).parents[1] / "helpers"


def test_extremes_are_named_by_their_last_word():
    assert [_extreme(k) for k in ("is/ratio_max", "is/ratio_min", "completions/max_length", "max")] == [
        "max",
        "min",
        "max",
        "max",
    ]
    assert [_extreme(k) for k in ("is/truncated", "loss/policy", "time/maximize", "reward/minimal")] == [None] * 4


def test_two_processes_combine_means_and_extremes(tmp_path):
    env = child_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone"]
    proc = subprocess.run(
        [*cmd, str(HELPERS / "metrics_worker.py"), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = {"loss": 1.5, "is/ratio_max": 5.0, "is/ratio_min": 0.25, "completions/max_length": 7.0, "is/lag": 2.0}
    want |= {"adv/mean": 1.0, "adv/std": math.sqrt(2.0)}
    for rank in range(2):  # every process logs the same combined metrics
        assert json.loads((tmp_path / f"metrics.{rank}.json").read_text()) == want
