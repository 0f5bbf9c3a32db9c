"""benchmarks/gpu_check.py's CPU dry run (tiny shapes, gloo), so the prepared GPU run cannot rot unnoticed.
The quick test skips the train/resume part (two `rloo train` runs; the CLI's own tests cover it on CPU) and
the async_steps part (an asynchronous `rloo train` and an N = 0/1 `rloo bench`, half the dry run's time: the
quick suite covers both: tests/reliability/test_async_processes.py runs the producer in its own process, and
test_bench_run.py's staleness test the bench at N = 0 and 2). The bench
and profile parts' dry run: tests/integration/test_gpu_bench.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


QUICK_PARTS = "update_fraction,collectives,logprobs,guard_memory,cuda_tests"


def _dry_run(tmp_path, *extra):
    out = tmp_path / "out" / "gpu_check.json"
    out.parent.mkdir()
    env = child_env()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--dry-run",
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


def _check(report, parts):
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
    if "async_steps" in report["parts"]:  # max_staleness=1, producer in its own process: is/* logged, lag 1
        train, timing = report["parts"]["async_steps"]["train"], report["parts"]["async_steps"]["timing"]
        assert train["lags"][1:] == [1.0] * (len(train["lags"]) - 1) and train["producer_process"], train
        assert timing["step_s_n0"] > 0 and timing["step_s_n1"] > 0 and timing["lags_n1"] == [1.0, 1.0], timing
    tests = report["cuda_tests"]["tests"]
    # the CUDA tests were collected (not silently missing) and, without a GPU, skipped
    assert any("test_precision" in name for name in tests), tests
    assert set(tests.values()) <= {"skipped", "passed"}


def test_gpu_check_dry_run_rloo_only(tmp_path):
    # the CUDA tests of one file: the part's child pytest, its JUnit outcomes and the skip without a GPU
    # are the same, and the default suite itself collects every test module (the slow test below: all)
    tests = ["--tests", str(ROOT / "tests" / "equivalence" / "test_precision.py")]
    _check(_dry_run(tmp_path, "--no-trl", "--parts", QUICK_PARTS, *tests), QUICK_PARTS)


@pytest.mark.slow
def test_gpu_check_dry_run_default_parts(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import DEFAULT_PARTS

    report = _dry_run(tmp_path)
    _check(report, ",".join(DEFAULT_PARTS))
    assert report["parts"]["train_resume"]["ok"]
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # said, not a tier of skips counted as passed
        assert "not_run" in report["parts"]["vllm_tests"] and report["versions"]["vllm"] == "missing"
