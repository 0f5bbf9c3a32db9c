"""`rloo bench` end to end on a tiny shape, rloo only (TRL is an optional extra): the worker
process, the step's timing and phases, and the FLOP count of its bucketed passes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rloo.experiments import bench
from rloo.experiments.bench import bench_shape
from rloo.experiments.bench_assets import Shape
from rloo.experiments.bench_flops import Arch, rloo_step_flops

TINY = Shape(
    name="T",
    tokenizer="char",
    vocab_size=0,
    hidden=32,
    layers=2,
    heads=2,
    intermediate=64,
    prompt_tokens=(6, 12),
    max_new_tokens=8,
)


def test_bucketed_flops_never_exceed_the_padded_count():
    a = Arch(hidden=64, layers=2, intermediate=128, vocab=100)
    lengths = [32, 3, 17, 32, 1, 9, 30, 32]
    padded = rloo_step_flops(a, 4, 2, 20, 32)
    bucketed = rloo_step_flops(a, 4, 2, 20, 32, lengths=lengths)
    assert bucketed < padded
    # all rows full length: one bucket, the same count as the padded formula
    assert rloo_step_flops(a, 4, 2, 20, 32, lengths=[32] * 8) == padded


@pytest.mark.slow  # the worker's job: test_bench_times_rloo_at_each_staleness_beside_trl
def test_checkpointing_memory_benchmark_runs_on_a_tiny_shape(tmp_path):
    """benchmarks/checkpointing_memory.py (the numbers in docs/bench.md) drives the same worker as
    `rloo bench`; run here on a tiny shape so that a change to the worker's job cannot break it unseen."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "checkpointing_memory.py"
    spec = importlib.util.spec_from_file_location("checkpointing_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    r = module.run_shape(TINY, tmp_path, steps=1, warmup=0, k=2, batch_size=2)
    assert r["shape"] == "T" and r["dtype"] == "float32"
    for lab in ("off", "on"):
        assert len(r[lab]["times_s"]) == 1 and r[lab]["peak_rss_gb"] > 0


def test_percent_of_peak_under_cpu_mixed_precision_is_of_the_faster_dtype(monkeypatch):
    """On an AVX2-only CPU bf16 matmuls run at ~1 GFLOP/s and fp32 at ~150: a bf16-autocast step (whose
    attention and norms run in fp32) would read as ~500% of a bf16 peak; it is reported against fp32's."""
    import torch

    rates = {torch.bfloat16: 1.2e9, torch.float32: 1.66e11}
    monkeypatch.setattr(bench, "matmul_peak_flops", lambda threads, dtype=torch.float32, device="cpu": rates[dtype])
    assert bench.reference_peak("bfloat16", "cpu", 2, log=lambda _: None) == 1.66e11
    assert bench.reference_peak("float32", "cpu", 2, log=lambda _: None) == 1.66e11
    assert bench.reference_peak("bfloat16", "cuda", 2, log=lambda _: None) == 1.2e9  # a GPU: its bf16 peak (MFU)
    rates[torch.bfloat16] = 4.2e11  # AVX512_BF16: bf16 is the peak
    assert bench.reference_peak("bfloat16", "cpu", 2, log=lambda _: None) == 4.2e11


def test_matmul_peak_skips_sizes_that_would_outlast_its_budget():
    """The peak probe tries square sizes 512, 1024, 2048; a size whose one multiply, at the best rate so
    far, would take longer than its share of the budget is not tried (on an AVX2-only CPU bf16's 2048
    matmul alone takes 14 s, and the probe took 125 s). With a budget of 1 us only 512 can run."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from rloo.experiments.bench_machine import matmul_peak_flops

    sizes = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default:
                sizes.add(args[0].shape[0])
            return func(*args, **(kwargs or {}))

    with Record():
        peak = matmul_peak_flops(1, seconds=1e-6)
    assert peak > 0 and sizes == {512}, sizes


def test_bench_times_rloo_at_each_staleness_beside_trl(tmp_path):
    """`rloo bench staleness=[0,2]` on a tiny shape (the worker processes, the step's timing and phases,
    the FLOP count of its bucketed passes): one rloo trainer per max_staleness (its producer in a process of its
    own), a row and a ratio to TRL for each, and N = 0's step over N > 0's. No timing asserts. TRL runs
    when installed (the `bench` extra); the rows and N = 0 ratios are checked either way. N = 1 (a
    third trainer and producer, a third of this test's time) is benchmarks/gpu_check.py's async_steps
    timing, whose dry run (tests/integration/test_gpu_check.py) checks its lags of 1."""
    trl = importlib.util.find_spec("trl") is not None
    lines = []
    out = bench_shape(
        TINY,
        root=tmp_path,
        warmup=0,
        steps=2,
        k=2,
        batch_size=2,
        beta=0.05,
        lr=1e-6,
        seed=0,
        threads=2,
        peak=1e11,
        trainers=["rloo", "trl"] if trl else ["rloo"],
        staleness=[0, 2],
        log=lines.append,
    )
    res = out["results"]
    assert set(res) == {"rloo", "rloo-n2"} | ({"trl"} if trl else set())
    assert out["warmup"] == 3  # the queue fills (N_max + 1 steps) before any step is timed
    for name, n in (("rloo", 0), ("rloo-n2", 2)):
        r = res[name]
        assert r["max_staleness"] == n and len(r["times_s"]) == 2 and r["median_s"] > 0
        assert 0 < r["median_completion_tokens"] <= 2 * 2 * TINY.max_new_tokens
        assert r["flops_per_step"] > 0 and r["peak_rss_gb"] > 0
        if n:  # the batch lags by N updates; the trainer's wait for it is part of the step
            assert r["lags"] == [n, n], r["lags"]
            assert "time/trainer_wait" in r["phases_s"]
            assert out["async_speedups"][name] > 0
        else:  # the plain step's phases, as `rloo bench` without staleness times them
            assert set(r["phases_s"]) == {"time/rollout", "time/score", "time/update"}
    if trl:
        assert set(out["speedups"]) == {"rloo", "rloo-n2"} and out["speedup"] == out["speedups"]["rloo"]
        table = bench.format_table({"machine": {}, "matmul_peak_gflops": 1.0, "shapes": [out]})
        assert "rloo-n2" in table and "N=0's step" in table
    assert len(lines) == len(res) * 5 and "(warm-up)" in lines[0]


def test_a_worker_that_dies_before_it_is_ready_raises_instead_of_hanging():
    """A worker that fails before it says ready (here `int(conn, job)`: a TypeError in the child) must
    end the bench with an error. _start kept the worker's end of the pipe open in the parent too, so
    recv() never saw the EOF and the bench hung (it did, with a daemon worker that could not start
    the rollout producer)."""
    import threading

    from rloo.experiments.bench_workers import _start

    box = []

    def start():
        try:
            _start(int, {})
        except EOFError as e:
            box.append(e)

    t = threading.Thread(target=start, daemon=True)
    t.start()
    t.join(90)
    assert box, "_start still waiting for a worker that died"
