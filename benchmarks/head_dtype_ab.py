"""One-off A/B: what the fp32 LM head (docs/precision.md) costs rloo's bf16 step, against autocast's bf16 head.

    python benchmarks/head_dtype_ab.py --shape M --dtype bfloat16 --rounds 8 --json F

Builds `rloo bench`'s models and batches for the shape, then alternates whole RLOO steps in one process,
the order reversed every round, with `rloo.core.logprobs.fp32_linear` as it is (fp32 operands, autocast
off) and replaced by autocast's product (`F.linear(...).float()`: bf16 operands, the logits rounded to bf16
and then widened). Prints each pair and the medians of the step and its phases. Not kept in the suite:
docs/bench.md quotes its result and names the commit that has it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch.nn.functional as F
from transformers import AutoTokenizer

import rloo.core.logprobs as logprobs
import rloo.modeling.forward as forward
import rloo.modeling.fp32_head as fp32_head
from rloo.experiments.bench import bench_dtype, bench_job
from rloo.experiments.bench_assets import SHAPES, build_assets
from rloo.experiments.bench_workers import rloo_trainer, timed_rloo_step

FP32 = logprobs.fp32_linear


def bf16_linear(x, weight, bias):
    return F.linear(x, weight, bias).float()


def use(fn) -> None:
    for module in (logprobs, forward, fp32_head):  # each imported the function by name
        module.fp32_linear = fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="M", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    shape = SHAPES[args.shape]
    folder = build_assets(shape, Path(tempfile.mkdtemp(prefix="rloo-head-ab-")), 0)
    tok = AutoTokenizer.from_pretrained(folder / "policy")
    settings = dict(k=4, beta=0.05, lr=1e-6, seed=0, batch_size=8, threads=2, share_prompt=True)
    settings |= dict(device="cpu", dtype=bench_dtype(args.dtype, "cpu"))
    job = bench_job(folder, shape, tok, 2 * args.rounds + args.warmup, settings)
    models, opt, cfg, gen = rloo_trainer(job)
    batches = iter(job["batches"])
    for _ in range(args.warmup):
        timed_rloo_step(models, opt, cfg, gen, next(batches), None)
    variants = {"fp32_head": FP32, "bf16_head": bf16_linear}
    res: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            use(variants[name])
            out = timed_rloo_step(models, opt, cfg, gen, next(batches), None)
            res[name].append({"time": out["time"], **out["phases"]})
        print(r, {v: round(res[v][-1]["time"], 3) for v in variants}, flush=True)
    use(FP32)
    for name, rows in res.items():
        print(name, {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]})
    wins = sum(a["time"] > b["time"] for a, b in zip(res["fp32_head"], res["bf16_head"], strict=True))
    print(f"bf16 head faster in {wins} of {args.rounds}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
