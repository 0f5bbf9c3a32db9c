"""benchmarks/gpu_check.py's CPU dry run (tiny shapes, gloo), so the prepared GPU run cannot rot unnoticed.
The quick test skips the train/resume part (two `rloo train` runs; the CLI's own tests cover it on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


QUICK_PARTS = "update_fraction,collectives,logprobs,guard_memory,async_steps,cuda_tests,bench"


def _dry_run(tmp_path, *extra):
    out = tmp_path / "out" / "gpu_check.json"
    out.parent.mkdir()
    env = child_env()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--dry-run",
            "--steps",
            "1",
            "--test-timeout",
            "900",
            "--budget",  # the GPU run's 540 s are for an H200; a shared CPU runs the parts slower
            "1500",
            "--out",
            str(out),
            "--assets",
            str(tmp_path / "assets"),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.name for p in out.parent.iterdir()] == ["gpu_check.json"]  # assets built elsewhere
    return json.loads(out.read_text())


def _check(report, trainers, parts):
    assert report["dry_run"] and report["versions"]["torch"] and report["ok"]
    assert list(report["parts"]) == parts.split(",")
    for name, part in report["parts"].items():
        assert "error" not in part, (name, part["error"])
    assert report["parts"]["update_fraction"]["fraction"] == report["parts"]["update_fraction"]["fp32"]
    assert report["parts"]["collectives"]["backend"] == "gloo"
    assert report["parts"]["collectives"]["fsdp_autocast_logits_dtype"] == "torch.float32"
    # the wrapped path (PEFT LoRA, B = 0) keeps the LM head in fp32 under bf16 autocast: the plain pass's
    # bits, a step-0 KL of exactly 0 (before issue 34's wrapped fix: bf16-rounded logits, KL != 0)
    assert report["parts"]["logprobs"]["lora_step0_kl_max_abs"] == 0.0, report["parts"]["logprobs"]
    # max_staleness=1 with the producer in its own process: finished, is/* logged, lag 1, both step times
    train, timing = report["parts"]["async_steps"]["train"], report["parts"]["async_steps"]["timing"]
    assert train["lags"][1:] == [1.0] * (len(train["lags"]) - 1) and train["producer_process"], train
    assert timing["step_s_n0"] > 0 and timing["step_s_n1"] > 0 and timing["lags_n1"] == [1.0, 1.0], timing
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
    # the CUDA tests of one file: the part's child pytest, its JUnit outcomes and the skip without a GPU
    # are the same, and the default suite itself collects every test module (the slow test below: all)
    tests = ["--tests", str(ROOT / "tests" / "equivalence" / "test_precision.py")]
    _check(_dry_run(tmp_path, "--no-trl", "--parts", QUICK_PARTS, *tests), ["rloo"], QUICK_PARTS)


@pytest.mark.slow
def test_gpu_check_dry_run_every_part_with_trl(tmp_path):
    pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import PART_LIMITS

    report = _dry_run(tmp_path)
    _check(report, ["rloo", "trl"], ",".join(PART_LIMITS))
    assert report["parts"]["train_resume"]["ok"]
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # said, not a tier of skips counted as passed
        assert "not_run" in report["parts"]["vllm_tests"] and report["versions"]["vllm"] == "missing"


def test_a_bench_stopped_at_its_time_limit_keeps_the_shapes_it_finished(tmp_path, monkeypatch):
    """The H200 run of 2026-12-04 was killed in the bench's third shape and its JSON held none of the two
    shapes it had timed (they were only in the log): each shape is now saved as it finishes, and the time
    limit stops the bench (it was caught as one shape's error, and the next shape ran on past it)."""
    import time
    from types import SimpleNamespace

    import rloo.experiments.bench as rb
    import rloo.experiments.bench_machine as bm

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    def shape_run(shape, **_):
        if shape.name == "slow":
            time.sleep(30)  # stopped by the alarm
        return {"shape": shape.name, "results": {}}

    monkeypatch.setattr(rb, "bench_shape", shape_run)
    monkeypatch.setattr(bm, "matmul_peak_flops", lambda **_: 1e9)
    saved = []
    report: dict = {}
    with pytest.raises(TimeoutError), gpu_check._time_limit(2):
        shapes = [SimpleNamespace(name=n) for n in ("fast", "slow", "after")]
        save = lambda: saved.append([s["shape"] for s in report["shapes"]])  # noqa: E731
        gpu_check.bench(shapes, "cpu", "float32", False, 1, 1, tmp_path, lambda _: None, report, save)
    assert saved == [["fast"]] and [s["shape"] for s in report["shapes"]] == ["fast"]
