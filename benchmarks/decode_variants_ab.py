"""One-off A/B of two decode-loop fast paths outside the conditions they were adopted for, on whole RLOO steps.

    python benchmarks/decode_variants_ab.py --variant grouped --shape M --dtype bfloat16 --rounds 8
    python benchmarks/decode_variants_ab.py --variant few_rows --shape M --dtype bfloat16 --rounds 8

grouped: grouped attention (rloo.modeling.kvcache.grouped_pays) forced on below its threshold, in the
sampler only and everywhere, against the default (off at M's prompt lengths). few_rows: the decode
steps' products taken the other way round (rloo.modeling.few_rows), allowed under bf16 autocast and on
this CPU kind, against the default (off). Builds `rloo bench`'s models and batches, alternates whole
steps in one process (the order reversed every round) and prints the medians of the step and its
phases. Not kept in the suite: docs/bench.md quotes its result and names the commit that has it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer

import rloo.modeling.few_rows as few_rows
import rloo.modeling.kvcache as kvcache
import rloo.rollout.sampler as sampler
from rloo.experiments.bench import bench_dtype, bench_job
from rloo.experiments.bench_assets import SHAPES, build_assets
from rloo.experiments.bench_workers import rloo_trainer, timed_rloo_step

PAYS, TAKES, MIN = kvcache.grouped_pays, few_rows.takes_swapped, kvcache.GROUPED_MIN_ELEMENTS


def takes_any(x, weight) -> bool:  # takes_swapped without its fp32 / no-autocast condition
    return x.numel() <= few_rows.MAX_ROWS * x.shape[-1] and not torch.is_grad_enabled() and x.device.type == "cpu"


def setting(min_elements=MIN, pays=PAYS, few_pays=None, takes=TAKES):
    def apply():
        kvcache.GROUPED_MIN_ELEMENTS = min_elements
        sampler.grouped_pays = pays
        sampler.few_rows_pays = few_pays or (lambda *a, **k: False)
        few_rows.takes_swapped = takes

    return apply


VARIANTS = {
    "grouped": {
        "default": setting(),
        "sampler_grouped": setting(pays=lambda cache, k: k > 1),
        "all_grouped": setting(min_elements=1),
    },
    "few_rows": {"off": setting(), "swap": setting(few_pays=lambda *a, **k: True, takes=takes_any)},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    ap.add_argument("--shape", default="M", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    shape, variants = SHAPES[args.shape], VARIANTS[args.variant]
    folder = build_assets(shape, Path(tempfile.mkdtemp(prefix="rloo-decode-ab-")), 0)
    tok = AutoTokenizer.from_pretrained(folder / "policy")
    settings = dict(k=4, beta=0.05, lr=1e-6, seed=0, batch_size=8, threads=2, share_prompt=True)
    settings |= dict(device="cpu", dtype=bench_dtype(args.dtype, "cpu"))
    job = bench_job(folder, shape, tok, len(variants) * args.rounds + args.warmup, settings)
    models, opt, cfg, gen = rloo_trainer(job)
    batches = iter(job["batches"])
    for _ in range(args.warmup):
        timed_rloo_step(models, opt, cfg, gen, next(batches), None)
    res: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            variants[name]()
            out = timed_rloo_step(models, opt, cfg, gen, next(batches), None)
            res[name].append({"time": out["time"], **out["phases"]})
        print(r, {v: round(res[v][-1]["time"], 3) for v in variants}, flush=True)
    setting()()
    for name, rows in res.items():
        print(name, {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
