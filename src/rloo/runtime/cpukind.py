"""Which kind of x86 CPU this is, read from its instruction-set flags, and what follows from it:
whether `dtype=auto` computes in bf16 (docs/precision.md) and whether a run with more than one thread
repeats bit for bit (docs/cli.md, "What is deterministic"). Pure rules of a flag set, so tests can
give them any CPU; `cpu_flags()` reads this machine's.

The kinds rloo has been run on: AVX2 only (AMD EPYC without avx512f), AVX-512 with AVX512_BF16 and
no AMX (AMD EPYC), AVX-512 without BF16 (Intel Xeon), AMX-BF16 with AVX512_BF16 (Intel Xeon).
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from pathlib import Path

import torch

from rloo.runtime.threadpolicy import CHOSEN, chosen_by_rloo

CPUINFO = Path("/proc/cpuinfo")
# Settings that cap the instructions oneDNN (which runs CPU bf16 matmuls) may use: with one set the
# flags no longer say what a bf16 matmul runs on, so dtype=auto times it instead.
ONEDNN_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# dtype=auto on AVX512_BF16 without AMX, measured on an AMD EPYC of that kind (docs/precision.md):
# bf16 matmul 1.8-2.5x fp32 (128x512x512, one thread), a training step of a 128-wide model 0.80x its
# fp32 time, of a 256-wide one 0.68x; `make demo` 0.74-0.96x.
AVX512_BF16_MEASURED = "measured on this kind: bf16 matmul ~2x fp32, a training step 0.7-0.8x its fp32 time"


def parse_flags(cpuinfo: str) -> frozenset[str] | None:
    """The flags of the first processor in a /proc/cpuinfo text; None if it lists none."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This CPU's instruction-set flags: /proc/cpuinfo's on Linux; elsewhere on x86 the bf16 ones
    torch's CPU checks report (amx_bf16, avx512_bf16, avx512f); None on other architectures."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        flags = parse_flags(CPUINFO.read_text())
    except OSError:
        flags = None
    if flags is not None:
        return flags
    checks = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}
    checks["avx512f"] = "_is_avx512_supported"
    return frozenset(f for f, name in checks.items() if torch_cpu_check(name))


def torch_cpu_check(name: str) -> bool | None:
    """What torch's private CPU check `torch.cpu.<name>` (e.g. _is_avx512_supported) says, or None
    where this torch has no such check."""
    # getattr: third-party: torch.cpu's private _is_*_supported checks vary by torch version
    check = getattr(torch.cpu, name, None)
    return bool(check()) if callable(check) else None


def cpu_kind(flags: frozenset[str] | None) -> str:
    """One of "amx_bf16", "avx512_bf16", "avx512", "avx2", "older" (x86 by its flags), "unknown" (None)."""
    if flags is None:
        return "unknown"
    for kind in ("amx_bf16", "avx512_bf16"):
        if kind in flags:
            return kind
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "older"


def auto_bf16(flags: frozenset[str] | None, env: Mapping[str, str] | None = None) -> tuple[bool | None, str]:
    """dtype=auto's rule on a CPU: (bf16 autocast?, why), None where the flags cannot tell (another
    architecture, or oneDNN capped by ONEDNN_MAX_CPU_ISA): then a timing decides (precision.py).
    AMX-BF16 -> bf16 (tile matmuls); AVX512_BF16 without AMX -> bf16 (measured, AVX512_BF16_MEASURED);
    neither -> fp32 (bf16 is emulated there, ~0.03x fp32 on the AVX2 kind: docs/bench.md)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    capped = [k for k in ONEDNN_CAPS if environ.get(k)]
    if flags is None or capped:
        why = f"{capped[0]}={environ[capped[0]]} caps oneDNN" if capped else "no x86 flags to read"
        return None, why
    if "amx_bf16" in flags:
        return True, "amx_bf16 in the CPU flags (AMX bf16 tiles)"
    if "avx512_bf16" in flags:
        return True, f"avx512_bf16 without amx_bf16 in the CPU flags: {AVX512_BF16_MEASURED}"
    return False, "neither avx512_bf16 nor amx_bf16 in the CPU flags: bf16 would be emulated"


# Kinds where two identical runs with more than one thread were measured bit for bit equal (with MKL's
# reproducibility mode, MKL_CBWR, which rloo sets; tests/reliability/test_determinism_threads.py);
# one thread repeats on every kind.
THREADS_BITWISE_MEASURED = ("avx512_bf16",)


def exactness_note(threads: int, saved_threads: int | None, kind: str) -> str | None:
    """What a resume with `threads` intra-op threads on a CPU of `kind` can promise against the run it
    continues (which used `saved_threads`, None: not recorded): None when bit for bit, else one line."""
    if saved_threads is not None and saved_threads != threads:
        return (
            f"resuming with {threads} thread(s) where the run used {saved_threads}: reductions split "
            f"differently, so it continues to float rounding, not bit for bit (OMP_NUM_THREADS={saved_threads})"
        )
    if threads == 1 or kind in THREADS_BITWISE_MEASURED:
        return None
    return (
        f"resuming with {threads} threads on a CPU of kind {kind}, where bitwise repeats with more than one "
        "thread are not measured: exact to float rounding, bit for bit only with OMP_NUM_THREADS=1"
    )


def resume_threads(saved: int | None, adopt: bool = True, environ: dict[str, str] | None = None) -> str | None:
    """A resume's thread count and what it promises, as one line to say (None: nothing to say). Where
    rloo chose the count (threadpolicy: the user set no OMP_NUM_THREADS) and `adopt`, torch takes
    the count the run recorded, whatever the load is now, so the continuation stays bit for bit; a
    count the user set is kept, and exactness_note says what it promises."""
    env = os.environ if environ is None else environ
    threads, lines = torch.get_num_threads(), []
    if adopt and saved is not None and saved != threads and chosen_by_rloo(env):
        torch.set_num_threads(saved)
        env["OMP_NUM_THREADS"] = env[CHOSEN] = str(saved)
        threads = saved
        lines.append(f"threads: {saved}, the count the run used (its checkpoint records it), for a bit-for-bit resume")
    note = exactness_note(threads, saved, cpu_kind(cpu_flags()))
    return "; ".join([*lines, *([note] if note else [])]) or None
