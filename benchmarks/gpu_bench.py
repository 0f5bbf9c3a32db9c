"""gpu_check's bench part (benchmarks/gpu_check.py --parts bench): rloo's step, eager and captured, beside TRL's
RLOOTrainer on one CUDA GPU, in one device call of at most ~7 minutes, every case saved as it finishes.

Trainers, alternating step by step as `rloo bench` runs them (rloo.experiments.bench, one worker process each):
  rloo-eager     rl.captured_decode=off: today's eager decode loop
  rloo-captured  rl.captured_decode=on: the captured decode step (rloo.rollout.captured; where it cannot
                 serve, it says so in one line and runs the eager loop)
  trl            TRL's RLOOTrainer, its default `generate` path, fp32 weights under bf16 autocast
                 (rloo.experiments.bench_trl; each case's `trl_setup` says what was seen)
Cases, the most wanted first (a time limit keeps the ones before it):
  1B      the 1B shape (Pythia-1B-sized Llama), 8 prompts x k=4 = 32 rows, 64 new tokens
  1B-256  the same model, 32 prompts x k=8 = 256 rows, 256 new tokens; the update in micro-batches of 32 rows
          (rloo: rl.micro_batch_size=4 prompts; TRL: gradient accumulation over 32 rows), one optimizer step
  M, L    as in docs/results/gpu-check (8 prompts x k=4; M 64 new tokens, L ~450-token prompts and 32)
Per case and trainer: s/step (median of the timed steps), the sampling phase's ms per decode step
(rloo.experiments.bench_report.sampling_ms_per_decode_step), the memory-bandwidth bound per decode step
(`decode_bound`: bf16 weights + keys and values read, over the device-to-device copy rate measured here),
and the fraction of it reached (bound / measured; 1.0 is the bound).

Budgets: the steps per case come from the H200 run of 2026-12-04 (docs/results/gpu-check: 1B warm steps
1.2-3.7 s for rloo, 1.2-1.3 s for TRL, a first step of 12-19 s; M and L steps ~0.5-1.5 s). Each case has a
time budget: after its warm-up and one timed round, no round starts that would end past it; a hard limit
(budget + HARD_SLACK_S) stops a case that hangs, and the next case still runs. The budgets (90 + 140 + 35 + 35 s)
and the models' builds fit the part's BENCH_LIMIT_S; with the wheels' install and the imports the call stays
under ~7.5 minutes (an estimate: this layout has not run on a GPU yet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import statistics
import time
from pathlib import Path

import torch

# the trainers: their rl.* keys (rloo.experiments.bench's rloo_settings)
VARIANTS = {"rloo-eager": {"captured_decode": "off"}, "rloo-captured": {"captured_decode": "on"}}
TRL_AS_RUN = (  # what the trl rows are (each case's trl_setup: what its worker saw)
    "TRL's RLOOTrainer on its default generation path (model.generate: use_vllm and "
    "use_transformers_continuous_batching off), its policy loaded in fp32, bf16=True (accelerate's autocast "
    "over the fp32 weights, in generation too)"
)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: str  # rloo.experiments.bench_assets.SHAPES
    batch_size: int  # prompts
    k: int
    max_new_tokens: int | None = None  # None: the shape's
    micro_prompts: int | None = None  # rl.micro_batch_size; TRL accumulates over micro_prompts * k rows
    warmup: int = 2
    steps: int = 6  # at most; the budget decides how many run
    budget_s: float = 60.0
    # a GPU with less memory (GB) leaves rloo-eager out of this case: three 1B trainers at 256 rows hold ~63 GB
    # between their steps (fp32 weights, AdamW, reference and reward model each; the captured step's static
    # cache) and one step's ~15 GB more would crowd an H100's 80; eager's ms per decode step is the 1B case's
    eager_needs_gb: float = 0.0


CASES = {
    c.name: c
    for c in (
        Case("1B", "1B", 8, 4, budget_s=90),
        # a round of three trainers at 256 rows: ~6 s of eager decoding (256 steps of ~25 ms) and ~3 s of update
        # each: warm-up 1, then as many as fit
        Case(
            "1B-256",
            "1B",
            32,
            8,
            max_new_tokens=256,
            micro_prompts=4,
            warmup=1,
            steps=4,
            budget_s=140,
            eager_needs_gb=100,
        ),
        # M and L last: 1 warm-up (their first step is the cold one: docs/results/gpu-check), then what fits
        Case("M", "M", 8, 4, warmup=1, budget_s=35),
        Case("L", "L", 8, 4, warmup=1, budget_s=35),
    )
}
# CPU, tiny: the same code paths (micro-batches too); a CPU shared with others is slow: the budgets only stop a hang
DRY_CASES = {
    "tiny": Case("tiny", "tiny", 2, 2, warmup=1, steps=1, budget_s=300),
    "tiny-wide": Case("tiny-wide", "tiny", 4, 2, max_new_tokens=12, micro_prompts=2, warmup=1, steps=1, budget_s=300),
}
HARD_SLACK_S = 60  # past its budget: one round in flight, the workers' stop
BENCH_LIMIT_S = 380  # the part's limit (gpu_check.PART_LIMITS): the four cases' budgets, their assets, the bounds


def tiny_shape():
    from rloo.experiments.bench_assets import Shape

    return Shape(name="tiny", tokenizer="char", vocab_size=0, hidden=32, layers=2, heads=2,
                 intermediate=64, prompt_tokens=(6, 12), max_new_tokens=8)  # fmt: skip


def _timed(fn, device: str, reps: int) -> float:
    """Median seconds of fn() over `reps` runs after 3 warm-ups (CUDA events on a GPU)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device: str, nbytes: int | None = None) -> float:
    """Bytes/s of a device-to-device copy of a large buffer, counting bytes read plus bytes written
    (the decode bound's rate: METHOD.md's 'measure the ceilings once'). Random data, not zeros."""
    nbytes = nbytes or (1 << 30 if device.startswith("cuda") else 1 << 26)
    src = torch.rand(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _timed(lambda: dst.copy_(src), device, 20)


def matmul_peak(device: str, n: int | None = None) -> float:
    """FLOP/s of one large bf16 matrix product (8192^3 on a GPU; 512^3 on a CPU), random inputs."""
    n = n or (8192 if device.startswith("cuda") else 512)
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    return 2 * n**3 / _timed(lambda: a @ b, device, 10)


def decode_bound(config, rows: int, prompt: float, width: float, bandwidth: float) -> dict:
    """The fewest bytes one decode step must read, over `bandwidth`: the weights in bf16 (every parameter
    but an untied input embedding, of which a step reads only its rows; a tied one is read as the head),
    and each row's keys and values in bf16 at the mean length over the steps, prompt + (width + 1) / 2
    (every row's own cache, as TRL's generate keeps it; rloo's shared prompt could read its part once
    per group, so at long prompts this bound is the looser one)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    if not getattr(config, "tie_word_embeddings", False):
        params -= model.get_input_embeddings().weight.numel()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    kv_per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * 2
    weights, kv = 2 * params, rows * kv_per_token * (prompt + (width + 1) / 2)
    return {"weight_bytes": weights, "kv_bytes": kv, "bound_ms": 1e3 * (weights + kv) / bandwidth}


def bound_fractions(case: dict, config, bandwidth: float) -> None:
    """Per trainer of a finished case: its decode bound and the fraction reached (bound / measured ms)."""
    rows = case["batch_size"] * case["k"]
    for r in case["results"].values():
        bound = decode_bound(config, rows, r["median_prompt_width"], r["median_completion_width"], bandwidth)
        ms = r["sampling_ms_per_decode_step"]
        r["decode_bound"] = bound
        r["fraction_of_bound"] = bound["bound_ms"] / ms if ms else None


@contextlib.contextmanager
def hard_limit(seconds: float):
    """SIGALRM after `seconds`: TimeoutError in this (the parent) process; the workers are stopped by the bench."""

    def alarm(*_):
        raise TimeoutError(f"timed out after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, int(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_case(case: Case, shape, trainers: list[str], device: str, root: Path, peak: float, log, gpu_gb: float) -> dict:
    """One case through rloo.experiments.bench.bench_shape (its bounds are added by the caller)."""
    from rloo.experiments.bench import bench_shape

    if case.max_new_tokens is not None:  # the same name: the same model folder (its length is the prompts')
        shape = dataclasses.replace(shape, max_new_tokens=case.max_new_tokens)
    micro = {"micro_batch_size": case.micro_prompts} if case.micro_prompts else {}
    left_out = ["rloo-eager"] if gpu_gb and gpu_gb < case.eager_needs_gb else []
    variants = {n: s | micro for n, s in VARIANTS.items() if n not in left_out}
    extra = {"release_memory": True} | ({"trl_micro_rows": case.micro_prompts * case.k} if case.micro_prompts else {})
    res = bench_shape(shape, root=root, warmup=case.warmup, steps=case.steps, k=case.k, batch_size=case.batch_size,
                      beta=0.05, lr=1e-6, seed=0, threads=min(16, os.cpu_count() or 1), peak=peak, trainers=trainers,
                      device=device, dtype="bfloat16", log=log, rloo_settings=variants, extra=extra,
                      budget_s=case.budget_s)  # fmt: skip
    why = f"{left_out}: this GPU's {gpu_gb:.0f} GB < the {case.eager_needs_gb:.0f} GB three trainers need here"
    return {"case": case.name, "budget_s": case.budget_s} | ({"left_out": why} if left_out else {}) | res


def bench_part(names: list[str], device: str, trl: bool, root: Path, limit: float, log, report: dict, save) -> None:
    """The cases `names` in order into `report` (the caller's, `save`d after each case): the machine's two
    ceilings first, then each case within its budget and the part's `limit`."""
    from transformers import AutoConfig

    from rloo.experiments.bench_assets import SHAPES
    from rloo.experiments.bench_machine import machine

    t0 = time.perf_counter()
    dry = not device.startswith("cuda")
    cases = DRY_CASES if dry else CASES
    bandwidth, peak = copy_bandwidth(device), matmul_peak(device)
    trainers = ["rloo-eager", "rloo-captured"] + ["trl"] * trl
    report |= {"machine": machine(), "device": device, "dtype": "bfloat16", "trainers": trainers, "variants": VARIANTS,
               "trl": TRL_AS_RUN if trl else None, "copy_gb_per_s": bandwidth / 1e9,
               "matmul_peak_gflops": peak / 1e9, "cases": []}  # fmt: skip
    gpu_gb = torch.cuda.mem_get_info()[1] / 1e9 if device.startswith("cuda") else 0.0
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # the measurements' ~2.4 GB, not held beside the trainers
        report["gpu"] = {"name": torch.cuda.get_device_name(0), "memory_gb": gpu_gb}
    log(f"bench: copy {bandwidth / 1e9:.0f} GB/s, bf16 matmul {peak / 1e12:.1f} TFLOP/s on {device}")
    save()
    for name in names:
        case, left = cases[name], limit - (time.perf_counter() - t0)
        if left < 20:
            report["cases"].append({"case": name, "error": "not run: the part's time was spent"})
            save()
            continue
        t_case = time.perf_counter()
        shape = tiny_shape() if dry else SHAPES[case.shape]
        try:
            with hard_limit(min(case.budget_s + HARD_SLACK_S, left)):
                res = run_case(case, shape, ["rloo"] + ["trl"] * trl, device, root, peak, log, gpu_gb)
        except Exception as e:  # noqa: BLE001 - a case out of memory or out of time must not lose the next
            res = {"case": name, "error": f"{type(e).__name__}: {e}"}
        else:
            try:  # the timings stand without it
                bound_fractions(res, AutoConfig.from_pretrained(root / shape.name / "policy"), bandwidth)
            except Exception as e:  # noqa: BLE001
                res["bound_error"] = f"{type(e).__name__}: {e}"
        res["seconds"] = time.perf_counter() - t_case
        report["cases"].append(res)
        log(json.dumps({k: v for k, v in res.items() if k != "results"}, default=str)[:1500])
        save()
    log(table(report))


def table(report: dict) -> str:
    """One line per case and trainer: the numbers the README's table takes."""
    lines = ["case    trainer        s/step  ms/decode-step  bound ms  of bound  TRL's s/step over this"]
    for c in report["cases"]:
        for n, r in c.get("results", {}).items():
            ms, f = r["sampling_ms_per_decode_step"], r.get("fraction_of_bound")
            bound = r.get("decode_bound", {}).get("bound_ms")
            speed = c.get("speedups", {}).get(n)
            lines.append(
                f"{c['case']:7s} {n:14s} {r['median_s']:6.3f}  {ms if ms is not None else float('nan'):14.3f}"
                f"  {bound if bound is not None else float('nan'):8.3f}  {f if f is not None else float('nan'):8.3f}"
                + (f"  {speed:.2f}x" if speed else "")
            )
        if "error" in c:
            lines.append(f"{c['case']:7s} error: {c['error'][:200]}")
    return "\n".join(lines)
