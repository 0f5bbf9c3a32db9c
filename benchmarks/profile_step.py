"""Where one rloo step's time goes, step by step from the first: wall time and the step's phases for every
step, and torch.profiler's top operators for the steps asked for (docs/bench.md, "What bounds each phase").

    python benchmarks/profile_step.py --shape M --dtype bfloat16 --threads 2 --steps 6 --profile 1,5 --json F
    python benchmarks/profile_step.py --device cuda --shape 1B --dtype bfloat16 --steps 8 --profile 0,1,6 --json F

The models, prompts and settings are `rloo bench`'s (rloo.experiments.bench_assets, bench_job; k 4, batch 8,
beta 0.05, lr 1e-6), built under --assets; the step is the bench worker's (rloo.experiments.bench_workers:
rloo_step under the stage's precision, CUDA synchronised). No step is left out: step 0 is the cold one, so a
warm-up that lasts several steps (rloo on CUDA, docs/results/gpu-check) shows as the steps it takes. A
profiled step runs under torch.profiler (which slows it; its wall time is marked `profiled`): the --top
operators by self CPU time, and on CUDA by self device time, each with its calls and total ms.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from rloo.experiments.bench import bench_dtype, bench_job
from rloo.experiments.bench_assets import SHAPES, build_assets
from rloo.experiments.bench_workers import rloo_trainer, timed_rloo_step


def top_ops(prof, key: str, n: int) -> list[dict]:
    """The n operators with the largest `key` (self_cpu_time_total or self_device_time_total), in ms."""
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0.0), reverse=True)[:n]
    return [
        {
            "op": e.key,
            "calls": e.count,
            "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3),
            "cpu_total_ms": round(e.cpu_time_total / 1e3, 3),
            "self_device_ms": round(getattr(e, "self_device_time_total", 0.0) / 1e3, 3),
        }
        for e in rows
    ]


PHASES = {
    "sample_rollout": "rollout",
    "score_rollout": "score",
    "policy_gradient_update": "update",
    "guarded_step": "update",
}
"""rloo.algorithms.rloo's functions -> the phase (time/*) they are part of, each run under a profiler label."""


@contextlib.contextmanager
def phase_labels(sync=None):
    """rloo_step's phase functions run under torch.profiler.record_function("phase:<name>") (here only);
    `sync()` (a device synchronisation, benchmarks/gpu_check_profile.py) before each label closes."""
    module = importlib.import_module("rloo.algorithms.rloo")
    saved = {name: getattr(module, name) for name in PHASES}

    def labelled(fn, label):
        def call(*a, **kw):
            with torch.profiler.record_function(f"phase:{label}"):
                out = fn(*a, **kw)
                if sync is not None:
                    sync()
                return out

        return call

    for name, fn in saved.items():
        setattr(module, name, labelled(fn, PHASES[name]))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)


def phase_ops(prof, n: int) -> dict[str, list[dict]]:
    """Per phase, the n operators with the largest self CPU time among everything its label ran."""
    per: dict[str, dict[str, list[float]]] = {}
    for ev in prof.events():
        if not ev.name.startswith("phase:"):
            continue
        acc = per.setdefault(ev.name.removeprefix("phase:"), {})
        stack = list(ev.cpu_children)
        while stack:
            child = stack.pop()
            stack.extend(child.cpu_children)
            row = acc.setdefault(child.name, [0, 0.0])
            row[0] += 1
            row[1] += child.self_cpu_time_total / 1e3
    top = lambda acc: sorted(acc.items(), key=lambda kv: -kv[1][1])[:n]  # noqa: E731
    return {
        ph: [{"op": k, "calls": c, "self_cpu_ms": round(ms, 3)} for k, (c, ms) in top(acc)] for ph, acc in per.items()
    }


def profiled(fn, device: str, n: int) -> tuple[dict, dict]:
    """fn() under torch.profiler: (its result, the top-n operators by self CPU time, overall and per
    phase, and on CUDA by self device time)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    acts += [torch.profiler.ProfilerActivity.CUDA] if device.startswith("cuda") else []
    with phase_labels(), torch.profiler.profile(activities=acts) as prof:
        out = fn()
    ops = {"by_self_cpu": top_ops(prof, "self_cpu_time_total", n), "by_phase": phase_ops(prof, n)}
    if device.startswith("cuda"):
        ops["by_self_device"] = top_ops(prof, "self_device_time_total", n)
    return out, ops


def run(args) -> dict:
    shape = SHAPES[args.shape]
    folder = build_assets(shape, args.assets, args.seed)
    tok = AutoTokenizer.from_pretrained(folder / "policy")
    settings = dict(k=4, beta=0.05, lr=1e-6, seed=args.seed, batch_size=8, threads=args.threads, share_prompt=True)
    settings |= dict(device=args.device, dtype=bench_dtype(args.dtype, args.device))
    job = bench_job(folder, shape, tok, args.steps, settings)
    t0 = time.perf_counter()
    models, opt, cfg, gen = rloo_trainer(job)
    report = {
        "shape": shape.name,
        "device": args.device,
        "dtype": settings["dtype"],
        "threads": args.threads,
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__},
        "load_s": round(time.perf_counter() - t0, 3),
        "steps": [],
    }
    for i, batch in enumerate(job["batches"]):
        step = lambda batch=batch: timed_rloo_step(models, opt, cfg, gen, batch, None)  # noqa: E731
        r, ops = profiled(step, args.device, args.top) if i in args.profile else (step(), None)
        row = {
            "step": i,
            "time": round(r["time"], 4),
            "width": r["width"],
            "tokens": r["tokens"],
            "profiled": ops is not None,
        }
        row["phases"] = {k.removeprefix("time/"): round(v, 4) for k, v in r["phases"].items()}
        if ops is not None:
            row["ops"] = ops
        report["steps"].append(row)
        print(f"step {i}: {r['time']:.3f} s {'(profiled) ' if ops else ''}{row['phases']}", flush=True)
        if args.json:  # after every step: a run stopped by a time limit keeps what it measured
            Path(args.json).write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="M", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 2)))
    ap.add_argument("--steps", type=int, default=6, help="steps from the first, every one timed")
    ap.add_argument("--profile", default="1", help="comma-separated step indices run under torch.profiler")
    ap.add_argument("--top", type=int, default=25, help="operators kept per profiled step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--assets", type=Path, default=None, help="where the models are built (default: a temp folder)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.profile = {int(s) for s in args.profile.split(",") if s.strip()}
    args.assets = args.assets or Path(tempfile.mkdtemp(prefix="rloo-profile-"))
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
