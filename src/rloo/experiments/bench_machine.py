"""What `rloo bench` measures of the machine: peak memory of a process, the matmul peak, and the
machine's description (CPU, cores, memory, versions) written into the report."""

from __future__ import annotations

import multiprocessing as mp
import platform
import resource
import time
from pathlib import Path

import torch


def peak_rss_gb() -> float:
    """This process's peak resident memory (VmHWM), GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def peak_memory_gb(device: str) -> float:
    """Peak memory of this process on `device`: GPU memory allocated by torch, or resident memory."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 1e9
    return peak_rss_gb()


def matmul_peak_flops(
    threads: int, seconds: float = 2.0, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> float:
    """Best matmul rate (FLOP/s) over a few square sizes in `dtype`: the machine's practical peak."""
    torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = 0.0
    for n in (512, 1024, 2048) if device == "cpu" else (2048, 4096, 8192):
        if best and 2 * n**3 / best > seconds / 3:
            # one multiply of this size would outlast its share of the budget (emulated bf16 on an
            # AVX2-only CPU: ~1 GFLOP/s, 14 s per 2048 matmul, 125 s for the sizes): stop at the best so far
            break
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        a @ b
        sync()
        reps, t0 = 0, time.perf_counter()
        while reps == 0 or time.perf_counter() - t0 < seconds / 3:  # at least one timed multiply
            a @ b
            reps += 1
            sync()
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def release_cache(job: dict) -> None:
    """With job["release_memory"] on CUDA, hand the allocator's cached blocks back after a step, outside its
    time: several 1B trainers share one GPU (benchmarks/gpu_bench.py), and each one's cache held after its
    turn would add up past an H100's 80 GB. The next step allocates afresh (cudaMalloc), in every trainer alike."""
    if job.get("release_memory") and job["device"].startswith("cuda"):
        torch.cuda.empty_cache()


def machine() -> dict:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": mp.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "mem_gb": round(int(Path("/proc/meminfo").read_text().split()[1]) / 1e6, 1),
    }
