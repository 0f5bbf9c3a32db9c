"""benchmarks/gpu_bench.py (gpu_check's bench part) and gpu_check_profile.py (its profile part): the decode bound's
arithmetic, the time budgets (a case's rounds, a hung case), and their CPU dry run with every trainer."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.child_env import child_env
from rloo.experiments import bench
from rloo.experiments.bench_assets import SHAPES, llama_config
from rloo.experiments.bench_flops import Arch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_bench  # noqa: E402


@pytest.mark.parametrize("tied", [True, False])
def test_decode_bound_reads_bf16_weights_and_every_rows_keys_and_values(tied):
    """The 1B shape, counted by hand: 16 layers of q, k, v, o (2048 x 2048 each: 8 heads of 256, no grouped
    keys), a 3-matrix MLP of 5472 and two norms, a final norm, and an 8192 x 2048 embedding read as the head
    when tied (an untied input embedding is only indexed: its bytes are not read; the head is)."""
    h, layers, inter, vocab = 2048, 16, 5472, 8192
    params = layers * (4 * h * h + 3 * h * inter + 2 * h) + h + vocab * h
    config = llama_config(SHAPES["1B"], vocab, tied=tied)
    rows, prompt, width, rate = 32, 40.0, 64, 3e12
    kv_token = 2 * layers * h * 2  # keys and values, every layer, bf16
    out = gpu_bench.decode_bound(config, rows, prompt, width, rate)
    assert out["weight_bytes"] == 2 * params
    assert out["kv_bytes"] == rows * kv_token * (prompt + (width + 1) / 2)
    assert out["bound_ms"] == pytest.approx(1e3 * (2 * params + out["kv_bytes"]) / rate, rel=1e-12)


def test_rloo_phase_flops_add_up_to_the_step():
    from rloo.experiments.bench_flops import rloo_phase_flops, rloo_step_flops

    a = Arch(hidden=64, layers=2, intermediate=128, vocab=100)
    lengths = [32, 3, 17, 32, 1, 9, 30, 32]
    phases = rloo_phase_flops(a, 4, 2, 20, lengths)
    assert sum(phases.values()) == pytest.approx(rloo_step_flops(a, 4, 2, 20, 32, lengths=lengths), rel=1e-12)
    assert all(v > 0 for v in phases.values())


class _Worker:
    """A worker's end of the pipe: each step takes `seconds` and reports a 4-token completion."""

    def __init__(self, seconds: float):
        self.seconds, self.steps = seconds, 0

    def send(self, _msg):
        self.steps += 1

    def recv(self):
        time.sleep(self.seconds)
        return {"time": self.seconds, "tokens": 8, "width": 4, "lengths": [4, 4], "rss_gb": 1.0, "phases": {}}


def _alternate(deadline_in: float | None, steps: int = 6):
    workers = {"a": (None, _Worker(0.2), {}), "b": (None, _Worker(0.2), {})}
    job = {"batch_size": 1, "k": 2, "share_prompt": True, "batches": [["p"]] * steps}
    shape = SimpleNamespace(name="fake")
    tok = lambda text, add_special_tokens: {"input_ids": [0] * 5}  # noqa: E731
    deadline = None if deadline_in is None else time.perf_counter() + deadline_in
    arch = Arch(hidden=8, layers=1, intermediate=16, vocab=10)
    lines = []
    res = bench._alternate(workers, job, tok, arch, shape, (1, deadline, {}), lines.append, {"a": 0, "b": 0})
    return res, lines


def test_a_case_stops_its_rounds_at_its_budget_after_one_timed_round():
    """Rounds of 0.4 s, a budget of 1.0 s: the warm-up round, one timed round (always), and no round that
    would end past the budget; without a budget every round runs."""
    res, lines = _alternate(1.0)
    assert [len(v) for v in res.values()] == [1, 1], lines
    assert "another would end past its time budget" in lines[-1]
    res, lines = _alternate(None)
    assert [len(v) for v in res.values()] == [5, 5] and "budget" not in lines[-1]


def test_a_case_past_its_hard_limit_is_stopped_and_the_next_still_runs(tmp_path, monkeypatch):
    """The H200 run of 2026-12-04 was killed inside its last shape and its JSON held none of the shapes it had
    timed: each case is saved as it finishes, and a case that outlasts budget + HARD_SLACK_S is stopped with
    an error while the cases after it still run."""

    def run_case(case, *_a, **_k):
        if case.name == "slow":
            time.sleep(30)  # stopped by its alarm
        return {"case": case.name, "results": {}}

    cases = {n: gpu_bench.Case(n, "tiny", 1, 2, budget_s=1) for n in ("fast", "slow", "after")}
    monkeypatch.setattr(gpu_bench, "DRY_CASES", cases)
    monkeypatch.setattr(gpu_bench, "HARD_SLACK_S", 1)
    monkeypatch.setattr(gpu_bench, "run_case", run_case)
    monkeypatch.setattr(gpu_bench, "bound_fractions", lambda *a: None)
    monkeypatch.setattr(gpu_bench, "copy_bandwidth", lambda device: 1e9)
    monkeypatch.setattr(gpu_bench, "matmul_peak", lambda device: 1e9)
    saved, report = [], {}
    save = lambda: saved.append([c["case"] for c in report["cases"]])  # noqa: E731
    t0 = time.perf_counter()
    gpu_bench.bench_part(list(cases), "cpu", False, tmp_path, 60, lambda _: None, report, save)
    assert time.perf_counter() - t0 < 15
    assert saved[-3:] == [["fast"], ["fast", "slow"], ["fast", "slow", "after"]]
    assert "timed out" in report["cases"][1]["error"] and "error" not in report["cases"][2]


@pytest.mark.slow
def test_gpu_bench_and_profile_dry_run(tmp_path):
    """`gpu_check.py --dry-run --parts bench,profile` on the CPU: both cases (the wide one in micro-batches),
    rloo eager and captured (and TRL where installed) with their sampling ms per decode step, decode bound and
    fraction; the profile's three phases with operators and bounds."""
    trl = importlib.util.find_spec("trl") is not None
    out = tmp_path / "gpu_check.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--parts", "bench,profile",
           "--budget", "1500", "--out", str(out), "--assets", str(tmp_path / "assets")]  # fmt: skip
    cmd += [] if trl else ["--no-trl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    bench_part = report["bench"]
    assert bench_part["copy_gb_per_s"] > 0 and bench_part["matmul_peak_gflops"] > 0
    trainers = {"rloo-eager", "rloo-captured"} | ({"trl"} if trl else set())
    assert [c["case"] for c in bench_part["cases"]] == ["tiny", "tiny-wide"]
    for case in bench_part["cases"]:
        assert "error" not in case, case["error"]
        assert set(case["results"]) == trainers
        settings = case["rloo_settings"]
        assert (
            settings["rloo-eager"]["captured_decode"] == "off" and settings["rloo-captured"]["captured_decode"] == "on"
        )
        for r in case["results"].values():
            assert r["median_s"] > 0 and r["sampling_ms_per_decode_step"] > 0
            assert r["decode_bound"]["bound_ms"] > 0 and r["fraction_of_bound"] > 0
        if trl:  # what TRL ran, seen: fp32 weights, its generate path, bf16 autocast inside generation
            seen = case["trl_setup"]
            assert seen["policy_param_dtype"] == "torch.float32" and seen["generate_path"] == "generate"
            assert seen["generation_linear_out_dtype"] == "torch.bfloat16"
    assert bench_part["cases"][1]["rloo_settings"]["rloo-eager"]["micro_batch_size"] == 2
    if trl:
        assert bench_part["cases"][1]["trl_setup"]["gradient_accumulation_steps"] == 2
    assert report["parts"]["profile"]["ok"], report["parts"]["profile"]
    profile = report["profile"]
    assert profile["rl"] == {"captured_decode": "on"}
    for phase in ("rollout", "score", "update"):
        ph = profile["phases"][phase]
        assert ph["wall_ms"] > 0 and ph["top_ops"] and ph["bound_ms"] > 0 and ph["of_bound"] > 0
