"""benchmarks/gpu_check.py's CPU dry run (tiny shape), so the prepared GPU run cannot rot unnoticed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path, *extra):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--dry-run",
            "--steps",
            "1",
            "--test-timeout",
            "900",
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _check(report, trainers):
    assert report["dry_run"] and report["versions"]["torch"]
    tests = report["cuda_tests"]["tests"]
    # the CUDA tests were collected (not silently missing) and, without a GPU, skipped
    assert any("test_precision" in name for name in tests), tests
    assert set(tests.values()) <= {"skipped", "passed"}
    bench = report["bench"]
    assert bench["device"] == "cpu" and bench["dtype"] == "bfloat16" and bench["matmul_peak_gflops"] > 0
    (shape,) = bench["shapes"]
    assert "error" not in shape, shape.get("error")
    assert set(shape["results"]) == set(trainers)
    for r in shape["results"].values():
        assert r["median_s"] > 0 and r["completion_tokens_per_s"] > 0 and r["peak_rss_gb"] > 0
        assert 0 < r["achieved_frac_peak"]


def test_gpu_check_dry_run_rloo_only(tmp_path):
    _check(_dry_run(tmp_path, "--no-trl"), ["rloo"])


@pytest.mark.slow
def test_gpu_check_dry_run_with_trl(tmp_path):
    pytest.importorskip("trl")
    _check(_dry_run(tmp_path), ["rloo", "trl"])
