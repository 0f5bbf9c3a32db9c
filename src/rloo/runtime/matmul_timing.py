"""dtype=auto's timing where the CPU's flags cannot tell (another architecture, oneDNN capped:
rloo.runtime.cpukind.auto_bf16 answers None): one matmul in fp32 and in bf16, alternated, medians
compared (rloo.runtime.precision.cpu_bf16_probe runs it once per process and logs the decision)."""

from __future__ import annotations

import math
import statistics
import time

import torch

MIN_SPEEDUP = 1.5
# (tokens, in, out) of the probe's matmul (only where the CPU flags cannot tell): a projection of a
# 512-wide model on 128 tokens, 67 MFLOP: under 1 ms in fp32 at the ~100 GFLOP/s of two modern cores,
# ~70 ms per bf16 try where bf16 is emulated (~1 GFLOP/s), where the probe stops after 3 pairs.
PROBE_SHAPE = (128, 512, 512)
PROBE_REPS = 9


def choose_bf16(fp32_s: float, bf16_s: float, min_speedup: float = MIN_SPEEDUP) -> bool:
    """The probe's rule: bf16 when its matmul takes at most 1/min_speedup of the fp32 time."""
    if not (fp32_s > 0 and bf16_s > 0 and math.isfinite(fp32_s) and math.isfinite(bf16_s)):
        return False
    return fp32_s / bf16_s >= min_speedup


def _time_once(a: torch.Tensor, b: torch.Tensor) -> float:
    t0 = time.perf_counter()
    a @ b
    return time.perf_counter() - t0


def time_matmuls(shape=PROBE_SHAPE, reps: int = PROBE_REPS) -> tuple[float, float]:
    """(fp32 s, bf16 s): the medians of `reps` alternated timings of one (m,k)@(k,n) matmul each (a
    median: one preempted try moves neither). Stops after 3 pairs once bf16's median is slower than
    fp32's (an emulated bf16 takes ~0.3 s a matmul)."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    a16, b16 = a.bfloat16(), b.bfloat16()
    _time_once(a, b), _time_once(a16, b16)  # warm-up: kernel selection, oneDNN's JIT
    fp32, bf16 = [], []
    for i in range(reps):
        pair = ((a, b, fp32), (a16, b16, bf16))
        for x, y, times in pair if i % 2 == 0 else pair[::-1]:
            times.append(_time_once(x, y))
        if i >= 2 and statistics.median(bf16) > statistics.median(fp32):
            break
    return statistics.median(fp32), statistics.median(bf16)
