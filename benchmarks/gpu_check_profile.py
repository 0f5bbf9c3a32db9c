"""gpu_check's profile part (benchmarks/gpu_check.py --parts profile; run by gpu_check_parts.py in its own
process): what bounds each phase of one rloo step, captured decode, at the 1B shape (8 prompts x k=4, 64 new
tokens, bf16 autocast) on CUDA; a tiny shape on the CPU in the dry run.

After WARMUP steps, one step runs under torch.profiler, its phases labelled (benchmarks/profile_step.py's
PHASES: sampling = rloo's `sample_rollout`, scoring = `score_rollout`, update = `policy_gradient_update` and
`guarded_step`), the device synchronised at the end of each phase so that its kernels finish inside it.
Per phase: its wall time; the device time of the kernels its operators launched (a CUDA graph's replay
counts under the operator that launched it); the top operators by self device time (self CPU time on a
CPU) and the top kernels; and its bound: sampling at the HBM rate (benchmarks/gpu_bench.decode_bound per
decode step, over the device-to-device copy rate measured here, plus the prompt pass at the matmul peak),
scoring and the update at the bf16 matmul peak measured here (their FLOPs: bench_flops.rloo_phase_flops).
`of_bound`: bound / wall time (1.0 is the bound).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from gpu_bench import copy_bandwidth, decode_bound, matmul_peak, tiny_shape  # beside this file
from profile_step import phase_labels

WARMUP = 2  # the captured step's capture and the allocator's first growth stay out of the profiled step
TOP = 15


def synced_phase_labels(device: str):
    """profile_step.phase_labels with the device synchronised before each label closes."""
    return phase_labels(torch.cuda.synchronize if device.startswith("cuda") else None)


def _subtree(ev) -> list:
    out, stack = [], list(ev.cpu_children)
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(child.cpu_children)
    return out


def _top(acc: dict[str, float]) -> list[dict]:
    return [{"name": k[:160], "ms": round(v, 3)} for k, v in sorted(acc.items(), key=lambda kv: -kv[1])[:TOP]]


def phase_table(prof, device: str) -> dict[str, dict]:
    """Per phase label: wall ms, device ms, kernel count, top operators and top kernels (module docstring)."""
    cuda = device.startswith("cuda")
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    per: dict[str, dict] = {}
    for ev in prof.events():
        if not ev.name.startswith("phase:"):
            continue
        ph = per.setdefault(ev.name.removeprefix("phase:"), {"wall_ms": 0.0, "ops": {}, "kernels": {}})
        ph["wall_ms"] += ev.time_range.elapsed_us() / 1e3
        for node in _subtree(ev):
            t = getattr(node, key, 0.0) / 1e3
            if t > 0:
                ph["ops"][node.name] = ph["ops"].get(node.name, 0.0) + t
            for kern in getattr(node, "kernels", []):
                ph["kernels"][kern.name] = ph["kernels"].get(kern.name, 0.0) + kern.duration / 1e3
    return {
        name: {
            "wall_ms": round(ph["wall_ms"], 3),
            ("device_ms" if cuda else "cpu_self_ms"): round(sum(ph["ops"].values()), 3),
            "kernel_ms": round(sum(ph["kernels"].values()), 3),
            "kernels": len(ph["kernels"]),
            "top_ops": _top(ph["ops"]),
            "top_kernels": _top(ph["kernels"]),
        }
        for name, ph in per.items()
    }


def phase_bounds(config, step: dict, rows: tuple[int, int], bandwidth: float, peak: float) -> dict[str, float]:
    """ms each phase needs at least: decode at the copy rate (per decode step: weights + keys/values), the
    prompt pass, scoring and the update at the matmul peak."""
    from rloo.experiments.bench_flops import Arch, rloo_phase_flops

    B, K = rows
    P, lengths = step["prompt_width"], step["lengths"]
    flops = rloo_phase_flops(Arch.of(config), B, K, P, lengths)
    width = step["width"]
    per_step = decode_bound(config, B * K, P, width, bandwidth)["bound_ms"]
    prompt_ms = 1e3 * Arch.of(config).forward(B, P, P, B) / peak
    return {"rollout": prompt_ms + per_step * width, "score": 1e3 * flops["scoring"] / peak,
            "update": 1e3 * flops["update"] / peak}  # fmt: skip


def profile(device: str, dry: bool, assets: Path) -> dict:
    from transformers import AutoConfig, AutoTokenizer

    from rloo.config import RLConfig
    from rloo.experiments.bench import bench_dtype, bench_job
    from rloo.experiments.bench_assets import SHAPES, build_assets
    from rloo.experiments.bench_workers import rloo_trainer, timed_rloo_step

    shape = tiny_shape() if dry else SHAPES["1B"]
    folder = build_assets(shape, assets / "bench", 0)  # the bench part's models when it ran before
    tok = AutoTokenizer.from_pretrained(folder / "policy")
    B, K = (2, 2) if dry else (8, 4)
    rl = {"captured_decode": "on"} if "captured_decode" in RLConfig.model_fields else {}
    settings = dict(k=K, beta=0.05, lr=1e-6, seed=0, batch_size=B, threads=min(16, os.cpu_count() or 1),
                    share_prompt=True, device=device, dtype=bench_dtype("bfloat16", device), rl=rl)  # fmt: skip
    job = bench_job(folder, shape, tok, WARMUP + 1, settings)
    models, opt, cfg, gen = rloo_trainer(job)
    warm = [timed_rloo_step(models, opt, cfg, gen, job["batches"][i], None)["time"] for i in range(WARMUP)]
    acts = [torch.profiler.ProfilerActivity.CPU]
    acts += [torch.profiler.ProfilerActivity.CUDA] if device.startswith("cuda") else []
    batch = job["batches"][WARMUP]
    with synced_phase_labels(device), torch.profiler.profile(activities=acts) as prof:
        step = timed_rloo_step(models, opt, cfg, gen, batch, None)
    step["prompt_width"] = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in batch)
    bandwidth, peak = copy_bandwidth(device), matmul_peak(device)
    config = AutoConfig.from_pretrained(folder / "policy")
    phases = phase_table(prof, device)
    for name, bound in phase_bounds(config, step, (B, K), bandwidth, peak).items():
        if name in phases:
            phases[name] |= {"bound_ms": round(bound, 3), "of_bound": bound / phases[name]["wall_ms"]}
    return {"shape": shape.name, "rows": B * K, "rl": rl, "warmup_s": warm, "profiled_step_s": step["time"],
            "width": step["width"], "prompt_width": step["prompt_width"], "copy_gb_per_s": bandwidth / 1e9,
            "matmul_peak_gflops": peak / 1e9, "phases": phases,
            "ok": set(phases) == {"rollout", "score", "update"}}  # fmt: skip
