"""`rloo bench`: rloo's RL step against TRL's RLOOTrainer, side by side, on this machine.

Each trainer lives in its own worker process (rloo.experiments.bench_workers: so each one's peak
memory is its own) with the same Hugging Face-format policy, reference and reward model, the same
prompts, k, batch, lengths, beta, learning rate and AdamW settings. The parent makes them take
turns, one step each (the first mover alternates), so load from elsewhere on the machine hits both
alike. After `warmup` steps each, `steps` steps each are timed. FLOPs executed per step are counted
from the step's padded shapes (rloo.experiments.bench_flops, checked against torch's FLOP counter in
the tests); divided by the step time they give achieved FLOP/s, reported as a fraction of the matmul
peak measured here at start in the run's dtype (on a GPU: its model FLOPs utilisation, MFU; on a
CPU under bf16 mixed precision, of the faster of bf16 and fp32: `reference_peak`).

`dtype=bfloat16`: rloo runs under its own mixed precision (rloo.runtime.precision: bf16 autocast over fp32
master weights, on CUDA too) and TRL with `bf16=True` (autocast over fp32 weights): the same scheme.

`staleness=[0,1,2]`: one rloo trainer per rl.max_staleness N (named "rloo" at N = 0, "rloo-nN" above),
each beside TRL's synchronous step (TRL's RLOOTrainer has no asynchronous mode). At N > 0 a step's time
is the trainer's, its wait for the producer's batch included (rloo.experiments.bench_workers); the
first max(warmup, N_max + 1) steps, while the producer's queue fills, are not timed.

`generation=vllm`: a third kind of trainer, "rloo-vllm": rloo's step with rl.generation=vllm (vLLM's engine
in the worker's process, its weights reloaded after each update), on the same batches, beside "rloo"
(its own sampler) and TRL; its ratio to "rloo" says what vLLM's decode buys on this machine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from rloo.errors import RlooError
from rloo.experiments.bench_assets import SHAPES, Shape, build_assets, load_words, make_prompts
from rloo.experiments.bench_flops import Arch, rloo_step_flops, trl_step_flops
from rloo.experiments.bench_machine import (  # noqa: F401 - the peak memory functions re-exported
    machine,
    matmul_peak_flops,
    peak_memory_gb,
    peak_rss_gb,
)
from rloo.experiments.bench_report import format_table, ratios, summary
from rloo.experiments.bench_trl import _trl_worker
from rloo.experiments.bench_workers import _ready, _rloo_worker, _spawn
from rloo.modeling.few_rows import few_rows_pays
from rloo.rollout.vllm_engine import INSTALL
from rloo.runtime.precision import DTYPES, resolve_precision
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.lock import run_folder
from rloo.training.common import check_device, prepare_plain_folder


def reference_peak(dtype: str, device: str, threads: int, log=print) -> float:
    """The matmul rate (FLOP/s) "% of peak" refers to: the best square matmul in the run's dtype, or on
    a CPU under bf16 mixed precision the faster of bf16 and fp32 (autocast runs attention, norms and
    more in fp32; on an AVX2-only CPU, whose bf16 is emulated at ~1 GFLOP/s, the step measured 5x the
    bf16 "peak")."""
    peak = matmul_peak_flops(threads, dtype=DTYPES[dtype], device=device)
    log(f"{dtype} matmul peak: {peak / 1e9:.1f} GFLOP/s on {device} ({threads} threads)")
    if dtype != "float32" and device == "cpu":
        fp32 = matmul_peak_flops(threads, device=device)
        peak = max(peak, fp32)
        log(f"float32 matmul peak: {fp32 / 1e9:.1f} GFLOP/s; % of peak below is of {peak / 1e9:.1f}")
    return peak


def rloo_variants(staleness) -> dict[str, int]:
    """rloo's trainer names -> their max_staleness: "rloo" at N = 0, "rloo-n1", "rloo-n2", ... above."""
    return {("rloo" if n == 0 else f"rloo-n{n}"): n for n in staleness}


def bench_shape(
    shape: Shape,
    *,
    root: Path,
    warmup: int,
    steps: int,
    k: int,
    batch_size: int,
    beta: float,
    lr: float,
    seed: int,
    threads: int,
    peak: float,
    trainers: list[str],
    share_prompt: bool = True,
    device: str = "cpu",
    dtype: str = "float32",
    staleness=(0,),
    log=print,
    rloo_settings: dict[str, dict] | None = None,
    extra: dict | None = None,
    budget_s: float | None = None,
) -> dict:
    """Alternate the trainers step by step on one shape; return per-trainer summaries. `trainers`:
    "rloo" (one worker per value in `staleness`, or with `rloo_settings` one per name there, on-policy, with
    those RLConfig keys), "rloo-vllm" (generation=vllm) and/or "trl". `extra`: job keys for every worker
    (release_memory, trl_micro_rows). `budget_s`: after the warm-up and one timed round, no round starts
    that would end past budget_s from the assets' being ready (the steps timed are in each times_s)."""
    named = rloo_variants(staleness) if rloo_settings is None else dict.fromkeys(rloo_settings, 0)
    variants = named if "rloo" in trainers else {}
    variants |= {"rloo-vllm": 0} if "rloo-vllm" in trainers else {}  # generation=vllm, on-policy
    warmup = max(warmup, max(variants.values(), default=0) + 1) if any(variants.values()) else warmup
    load = os.getloadavg()[0]  # the machine's 1-minute load before and after: what else ran beside it
    folder = build_assets(shape, root, seed)
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    tok = AutoTokenizer.from_pretrained(folder / "policy")
    arch = Arch.of(AutoConfig.from_pretrained(folder / "policy"))
    shared = dict(k=k, beta=beta, lr=lr, seed=seed, batch_size=batch_size, threads=threads)
    shared |= dict(share_prompt=share_prompt, device=device, dtype=dtype) | (extra or {})
    job = bench_job(folder, shape, tok, warmup + steps, shared)
    jobs = _worker_jobs(job, variants, "trl" in trainers, rloo_settings or {})
    seen: dict = {}
    results = _run_workers(jobs, job, tok, arch, shape, (warmup, deadline, seen), log, variants)
    out = {
        "shape": shape.name,
        "device": device,
        "dtype": dtype,
        "prompt_tokens": shape.prompt_tokens,
        "max_new_tokens": shape.max_new_tokens,
        "k": k,
        "batch_size": batch_size,
        "warmup": warmup,
        "steps": steps,
        "beta": beta,
        "lr": lr,
        "load_avg": [load, os.getloadavg()[0]],
        "results": {n: summary(n, results[n], peak, variants.get(n)) for n in results},
    }
    out |= {"rloo_settings": rloo_settings} if rloo_settings else {}
    out |= {"trl_setup": seen["trl"]} if "trl" in seen else {}  # what TRL ran (rloo.experiments.bench_trl)
    return out | ratios(out["results"], variants)


def bench_job(folder: Path, shape: Shape, tok, total: int, settings: dict) -> dict:
    """What every worker is given: `settings` (k, beta, lr, seed, batch_size, threads, share_prompt,
    device, dtype), the models in `folder`, the shape's lengths and `total` batches of prompts."""
    batch_size = settings["batch_size"]
    prompts = make_prompts(tok, load_words(folder), shape, total * batch_size, settings["seed"])
    return settings | dict(
        policy=str(folder / "policy"),
        reward=str(folder / "reward"),
        max_new_tokens=shape.max_new_tokens,
        max_prompt_tokens=shape.max_prompt_tokens,
        tmp=tempfile.mkdtemp(prefix="rloo-bench-"),
        batches=[prompts[i * batch_size : (i + 1) * batch_size] for i in range(total)],
    )


def _worker_jobs(job: dict, variants: dict[str, int], trl: bool, rloo_settings: dict[str, dict]) -> dict:
    """Trainer name -> (worker function, its job): one rloo worker per variant (its max_staleness,
    generation=vllm for "rloo-vllm", its RLConfig keys from `rloo_settings`), and TRL's with `trl`."""
    gen = {"rloo-vllm": "vllm"}
    jobs = {
        n: (
            _rloo_worker,
            job | {"max_staleness": v, "generation": gen.get(n, "sampler"), "rl": rloo_settings.get(n, {})},
        )
        for n, v in variants.items()
    }
    return jobs | ({"trl": (_trl_worker, job)} if trl else {})


def _run_workers(jobs: dict, job: dict, tok, arch: Arch, shape: Shape, pace: tuple, log, variants: dict) -> dict:
    """Start every worker (loading at once, except beside vLLM's engine, whose memory profiling must not
    see another load), alternate them (_alternate), and stop them all, even after an error (a time limit:
    then without waiting for a step in flight)."""
    started, workers, wait = {}, {}, 60
    try:
        for name, (target, worker_job) in jobs.items():
            started[name] = _spawn(target, worker_job)
            if "rloo-vllm" in jobs:
                workers[name] = _ready(started[name])
        workers |= {name: _ready(p) for name, p in started.items() if name not in workers}
        return _alternate(workers, job, tok, arch, shape, pace, log, variants)
    except BaseException:
        wait = 5
        raise
    finally:  # a worker that died (its error is what propagates) cannot take the message
        for proc, conn in started.values():
            with contextlib.suppress(OSError):
                conn.send("stop")
            proc.join(timeout=wait)
            if proc.is_alive():  # not a daemon (at max_staleness > 0): it must not outlive the bench
                proc.kill()


def _alternate(workers: dict, job: dict, tok, arch: Arch, shape: Shape, pace: tuple, log, variants: dict) -> dict:
    """Send each batch to every trainer, the order rotating every step (so none always runs first
    on a warm cache); log each step and keep the timed ones, with their FLOPs counted from the shape.
    `pace`: (warm-up rounds, the deadline no timed round may be expected to overrun or None, a dict
    that gets what a worker saw of its setup)."""
    warmup, deadline, seen = pace
    trainers = list(workers)
    batch_size, k, share_prompt = job["batch_size"], job["k"], job["share_prompt"]
    total = len(job["batches"])
    results: dict[str, list[dict]] = {name: [] for name in trainers}
    for i in range(total):
        t_round = time.perf_counter()
        P = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in job["batches"][i])
        for name in trainers[i % len(trainers) :] + trainers[: i % len(trainers)]:
            workers[name][1].send("step")
            r = workers[name][1].recv()
            seen |= {name: r.pop("setup")} if "setup" in r else {}
            T, r["prompt_width"] = r["width"], P
            r["flops"] = (
                rloo_step_flops(arch, batch_size, k, P, T, share_prompt, r["lengths"], not variants[name])
                if name in variants
                else trl_step_flops(arch, batch_size, k, P, T)
            )
            log(
                f"  {shape.name} {name:9s} step {i + 1}/{total}{' (warm-up)' if i < warmup else ''}: "
                f"{r['time']:.2f} s, {r['tokens']} tokens, P={P} T={T}, {r['flops'] / r['time'] / 1e9:.1f} GFLOP/s"
            )
            if i >= warmup:
                results[name].append(r)
        now = time.perf_counter()
        if deadline is not None and warmup <= i < total - 1 and now + (now - t_round) > deadline:
            log(f"  {shape.name}: stopped after step {i + 1}/{total}: another would end past its time budget")
            break
    return results


def bench_dtype(name: str, device: str) -> str:
    """The dtype both trainers run in: float32, or bfloat16 (mixed precision) where `name` resolves to it."""
    check_device(device)
    p = resolve_precision(name, device)
    return "bfloat16" if torch.bfloat16 in (p.compute, p.weights) else "float32"


def run_bench(cfg, log=print, overwrite: bool = False) -> dict:
    """Run every shape in cfg.shapes; write cfg.output_dir/bench.json; return the report. The folder
    is held (one process) and, with `overwrite`, emptied first (its assets are rebuilt)."""
    with run_folder(cfg.output_dir):
        return _run_bench(cfg, log, overwrite)


def _run_bench(cfg, log, overwrite: bool) -> dict:
    trainers = ["rloo"] + (["rloo-vllm"] if cfg.generation == "vllm" else []) + (["trl"] if cfg.trl else [])
    if cfg.generation == "vllm" and importlib.util.find_spec("vllm") is None:  # before any work, as TRL's
        raise RlooError(f"generation=vllm needs vLLM, which is not installed: {INSTALL} (or generation=sampler)")
    if cfg.trl:
        try:
            import trl  # noqa: F401  (optional: the `bench` extra; checked before any work)
        except ImportError:
            raise RlooError("TRL is not installed: pip install 'rloo[bench]' (or run with trl=false)") from None
    dtype = bench_dtype(cfg.dtype, cfg.device)
    out = prepare_plain_folder(Path(cfg.output_dir), "bench", overwrite)
    peak = reference_peak(dtype, cfg.device, cfg.threads, log)
    report = {
        "machine": machine(),
        "threads": cfg.threads,
        "device": cfg.device,
        "dtype": dtype,
        "matmul_peak_gflops": peak / 1e9,
        "decode_few_rows": few_rows_pays(cfg.device, cfg.threads),  # rloo's decode products swapped (few_rows)
        "staleness": cfg.staleness,
        "generation": cfg.generation,
        "shapes": [],
    }
    for name in cfg.shapes:
        steps = cfg.steps if cfg.steps is not None else (5 if name == "L" else 10)
        report["shapes"].append(
            bench_shape(
                SHAPES[name],
                root=out / "assets",
                warmup=cfg.warmup,
                steps=steps,
                k=cfg.k,
                batch_size=cfg.batch_size,
                beta=cfg.beta,
                lr=cfg.lr,
                seed=cfg.seed,
                threads=cfg.threads,
                peak=peak,
                trainers=trainers,
                share_prompt=cfg.share_prompt,
                device=cfg.device,
                dtype=dtype,
                staleness=cfg.staleness,
                log=log,
            )
        )
        atomic_write_text(out / "bench.json", json.dumps(report, indent=1))
    log(format_table(report))
    return report
