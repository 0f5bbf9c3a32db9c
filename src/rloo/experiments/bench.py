"""`rloo bench`: rloo's RL step against TRL's RLOOTrainer, side by side, on this machine.

Each trainer lives in its own worker process (so each one's peak memory is its own) with the
same Hugging Face-format policy, reference and reward model, the same prompts, k, batch, lengths,
beta, learning rate and AdamW settings. The parent makes them take turns, one step each (the
first mover alternates), so load from elsewhere on the machine hits both alike. After `warmup`
steps each, `steps` steps each are timed. FLOPs executed per step are counted from the step's padded shapes
(rloo.experiments.bench_flops, checked against torch's FLOP counter in the tests); divided by the step time
they give achieved FLOP/s, reported as a fraction of the matmul peak measured here at start in the
run's dtype (on a GPU: its model FLOPs utilisation, MFU).

`dtype=bfloat16`: rloo runs under its own mixed precision (rloo.runtime.precision: bf16 autocast over fp32
master weights on CPU, bf16 weights on CUDA) and TRL with `bf16=True` (autocast over fp32 weights).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import platform
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    TrainerCallback,
)

from rloo.algorithms.rloo import rloo_step
from rloo.config import RLConfig
from rloo.errors import RlooError
from rloo.experiments.bench_assets import SHAPES, Shape, build_assets, load_words, make_prompts
from rloo.experiments.bench_flops import Arch, rloo_step_flops, trl_step_flops
from rloo.runtime.precision import resolve_precision
from rloo.training.common import adamw, check_device, seed_everything
from rloo.training.rl import load_models


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
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        a @ b
        sync()
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 3:
            a @ b
            reps += 1
            sync()
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


# ---------------------------------------------------------------- rloo worker


def _rloo_worker(conn, job: dict) -> None:
    torch.set_num_threads(job["threads"])
    cfg = RLConfig(
        policy=job["policy"],
        reward_model=job["reward"],
        k=job["k"],
        beta=job["beta"],
        lr=job["lr"],
        batch_size=job["batch_size"],
        max_new_tokens=job["max_new_tokens"],
        warmup_steps=0,
        max_prompt_tokens=job["max_prompt_tokens"],
        share_prompt=job["share_prompt"],
        seed=job["seed"],
        gradient_checkpointing=job.get("gradient_checkpointing", False),
        device=job["device"],
        dtype=job["dtype"],
    )
    gen = seed_everything(cfg.seed)
    models = load_models(cfg)
    opt = adamw(models.policy.parameters(), cfg.lr)
    conn.send({"ready": True, "rss_gb": peak_memory_gb(cfg.device)})
    sync = torch.cuda.synchronize if cfg.device.startswith("cuda") else (lambda: None)
    for i, _ in enumerate(iter(conn.recv, "stop")):
        t0 = time.perf_counter()
        batch = job["batches"][i]
        # as `rloo train` runs it: under the stage's precision, rows= as in rloo.runtime.distributed.step_kwargs
        with resolve_precision(cfg.dtype, cfg.device).autocast():
            stats, roll, _ = rloo_step(models, opt, batch, cfg, gen, rows=(0, len(batch) * cfg.k))
        sync()
        conn.send(
            {
                "time": time.perf_counter() - t0,
                "tokens": int(roll.completion_mask.sum()),
                "lengths": roll.completion_mask.sum(-1).tolist(),
                "width": roll.completion_ids.shape[1],
                "rss_gb": peak_memory_gb(cfg.device),
                "phases": {k: v for k, v in stats.items() if k.startswith("time/")},
            }
        )


# ---------------------------------------------------------------- TRL worker


def _trl_worker(conn, job: dict) -> None:
    torch.set_num_threads(job["threads"])
    # optional: TRL (the `bench` extra) and the datasets it trains from, only in this worker
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    class Pace(TrainerCallback):
        """Blocks each step until the parent says go; reports its time, tokens and peak memory."""

        def on_step_begin(self, args, state, control, **kw):
            conn.recv()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if job["device"].startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - self.t0
            m = trainer._metrics["train"]
            conn.send(
                {
                    "time": dt,
                    "tokens": int(round(m["completions/mean_length"][-1] * job["batch_size"] * job["k"])),
                    "width": int(m["completions/max_length"][-1]),
                    "rss_gb": peak_memory_gb(job["device"]),
                    "phases": {},
                }
            )

    n = job["batch_size"] * job["k"]
    args = RLOOConfig(
        output_dir=job["tmp"],
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=job["k"],
        max_completion_length=job["max_new_tokens"],
        beta=job["beta"],
        learning_rate=job["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        num_iterations=1,
        max_steps=len(job["batches"]),
        shuffle_dataset=False,
        seed=job["seed"],
        gradient_checkpointing=False,
        bf16=job["dtype"] == "bfloat16",
        fp16=False,
        use_cpu=not job["device"].startswith("cuda"),
        report_to="none",
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    tok = AutoTokenizer.from_pretrained(job["policy"])
    model = AutoModelForCausalLM.from_pretrained(job["policy"], dtype=torch.float32)
    rm = AutoModelForSequenceClassification.from_pretrained(job["reward"], num_labels=1, dtype=torch.float32)
    data = Dataset.from_dict({"prompt": [p for batch in job["batches"] for p in batch]})
    trainer = RLOOTrainer(
        model=model,
        reward_funcs=rm,
        args=args,
        train_dataset=data,
        processing_class=tok,
        reward_processing_classes=tok,
        callbacks=[Pace()],
    )
    conn.send({"ready": True, "rss_gb": peak_memory_gb(job["device"])})
    trainer.train()
    conn.recv()  # "stop"


# ---------------------------------------------------------------- parent


def _start(target, job):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, job), daemon=True)
    proc.start()
    ready = parent.recv()
    return proc, parent, ready


def _summary(name: str, results: list[dict], peak: float) -> dict:
    times = [r["time"] for r in results]
    med = statistics.median(times)
    flops = statistics.median(r["flops"] for r in results)
    tokens = statistics.median(r["tokens"] for r in results)
    phases = {k: statistics.median(r["phases"][k] for r in results) for k in results[0]["phases"]}
    return {
        "trainer": name,
        "median_s": med,
        "times_s": times,
        "completion_tokens_per_s": tokens / med,
        "median_completion_tokens": tokens,
        "peak_rss_gb": max(r["rss_gb"] for r in results),
        "flops_per_step": flops,
        "achieved_flops": statistics.median(r["flops"] / r["time"] for r in results),
        "achieved_frac_peak": statistics.median(r["flops"] / r["time"] for r in results) / peak,
        "phases_s": phases,
    }


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
    log=print,
) -> dict:
    """Alternate the trainers step by step on one shape; return per-trainer summaries."""
    folder = build_assets(shape, root, seed)
    tok = AutoTokenizer.from_pretrained(folder / "policy")
    arch = Arch.of(AutoConfig.from_pretrained(folder / "policy"))
    total = warmup + steps
    prompts = make_prompts(tok, load_words(folder), shape, total * batch_size, seed)
    job = dict(
        policy=str(folder / "policy"),
        reward=str(folder / "reward"),
        k=k,
        beta=beta,
        lr=lr,
        seed=seed,
        batch_size=batch_size,
        max_new_tokens=shape.max_new_tokens,
        max_prompt_tokens=shape.max_prompt_tokens,
        threads=threads,
        share_prompt=share_prompt,
        tmp=tempfile.mkdtemp(prefix="rloo-bench-"),
        device=device,
        dtype=dtype,
        batches=[prompts[i * batch_size : (i + 1) * batch_size] for i in range(total)],
    )
    targets = {"rloo": _rloo_worker, "trl": _trl_worker}
    workers = {name: _start(targets[name], job) for name in trainers}
    results: dict[str, list[dict]] = {name: [] for name in trainers}
    for i in range(total):
        P = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in job["batches"][i])
        for name in trainers if i % 2 == 0 else trainers[::-1]:
            workers[name][1].send("step")
            r = workers[name][1].recv()
            T = r["width"]
            r["flops"] = (
                rloo_step_flops(arch, batch_size, k, P, T, share_prompt, r["lengths"])
                if name == "rloo"
                else trl_step_flops(arch, batch_size, k, P, T)
            )
            log(
                f"  {shape.name} {name:4s} step {i + 1}/{total}{' (warm-up)' if i < warmup else ''}: "
                f"{r['time']:.2f} s, {r['tokens']} tokens, P={P} T={T}, {r['flops'] / r['time'] / 1e9:.1f} GFLOP/s"
            )
            if i >= warmup:
                results[name].append(r)
    for proc, conn, _ in workers.values():
        conn.send("stop")
        proc.join(timeout=60)
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
        "results": {n: _summary(n, results[n], peak) for n in trainers},
    }
    if {"rloo", "trl"} <= set(trainers):
        r, t = out["results"]["rloo"], out["results"]["trl"]
        out["speedup"] = t["median_s"] / r["median_s"]
        out["memory_ratio"] = r["peak_rss_gb"] / t["peak_rss_gb"]
    return out


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


def format_table(report: dict) -> str:
    lines = [
        f"machine: {report['machine']}; {report.get('device', 'cpu')} {report.get('dtype', 'float32')} "
        f"matmul peak {report['matmul_peak_gflops']:.1f} GFLOP/s",
        "shape trainer  s/step   tok/s  peak GB  GFLOP/step  GFLOP/s  %peak  speedup  mem ratio",
    ]
    for s in report["shapes"]:
        for name, r in s["results"].items():
            gf = r["flops_per_step"] / 1e9 if r["flops_per_step"] else float("nan")
            extra = f"  {s['speedup']:6.2f}x  {s['memory_ratio']:8.2f}" if name == "rloo" and "speedup" in s else ""
            lines.append(
                f"{s['shape']:5s} {name:7s} {r['median_s']:7.2f} {r['completion_tokens_per_s']:7.0f} "
                f"{r['peak_rss_gb']:8.2f} {gf:11.1f} {(r['achieved_flops'] or 0) / 1e9:8.1f} "
                f"{100 * (r['achieved_frac_peak'] or 0):5.1f}%{extra}"
            )
    return "\n".join(lines)


def bench_dtype(name: str, device: str) -> str:
    """The dtype both trainers run in: float32, or bfloat16 (mixed precision) where `name` resolves to it."""
    check_device(device)
    p = resolve_precision(name, device)
    return "bfloat16" if torch.bfloat16 in (p.compute, p.weights) else "float32"


def run_bench(cfg, log=print) -> dict:
    """Run every shape in cfg.shapes; write cfg.output_dir/bench.json; return the report."""
    trainers = ["rloo", "trl"] if cfg.trl else ["rloo"]
    if cfg.trl:
        try:
            import trl  # noqa: F401  (optional: the `bench` extra; checked before any work)
        except ImportError:
            raise RlooError("TRL is not installed: pip install 'rloo[bench]' (or run with trl=false)") from None
    dtype = bench_dtype(cfg.dtype, cfg.device)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak_flops(cfg.threads, dtype=getattr(torch, dtype), device=cfg.device)
    log(f"{dtype} matmul peak: {peak / 1e9:.1f} GFLOP/s on {cfg.device} ({cfg.threads} threads)")
    report = {
        "machine": machine(),
        "threads": cfg.threads,
        "device": cfg.device,
        "dtype": dtype,
        "matmul_peak_gflops": peak / 1e9,
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
                log=log,
            )
        )
        (out / "bench.json").write_text(json.dumps(report, indent=1))
    log(format_table(report))
    return report
