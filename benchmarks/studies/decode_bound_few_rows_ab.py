"""rloo's whole RLOO step with the decode steps' linear products swapped or not (rloo.modeling.few_rows),
alternated step by step in one process on `rloo bench`'s models and prompts (docs/bench.md).

    python benchmarks/studies/decode_bound_few_rows_ab.py [--shape M] [--steps 12] [--threads 2] [--json FILE]

Both variants run on every machine (`few_rows_pays` forced either way), the order reversed every
other pair; the first pair is a warm-up. Prints the median step and phase times of each, the ratio,
and in how many pairs the swapped step was the faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import rloo.rollout.sampler as sampler
from rloo.algorithms.rloo import rloo_step
from rloo.config import RLConfig
from rloo.experiments.bench_assets import SHAPES, build_assets, load_words, make_prompts
from rloo.training.common import adamw, seed_everything
from rloo.training.rl import load_models


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--shape", default="M", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=12, help="timed steps of each variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    folder = build_assets(shape, Path(tempfile.mkdtemp(prefix="rloo-few-rows-")))
    cfg = RLConfig(
        policy=str(folder / "policy"), reward_model=str(folder / "reward"), k=4, beta=0.05, lr=1e-6,
        batch_size=8, max_new_tokens=shape.max_new_tokens, warmup_steps=0,
        max_prompt_tokens=shape.max_prompt_tokens, seed=0, dtype="float32",
    )  # fmt: skip
    gen = seed_everything(cfg.seed)
    models = load_models(cfg)
    opt = adamw(models.policy.parameters(), cfg.lr)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder / "policy")
    n = 2 * (args.steps + 1)
    prompts = make_prompts(tok, load_words(folder), shape, n * cfg.batch_size, cfg.seed)
    times: dict[bool, list[dict]] = {False: [], True: []}
    for i in range(n):
        on = (i % 2 == 0) == ((i // 2) % 2 == 0)  # pairs alternate their order: on/off, off/on, ...
        sampler_rule = sampler.few_rows_pays
        sampler.few_rows_pays = lambda device, on=on: on
        try:
            batch = prompts[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            t0 = time.perf_counter()
            stats = rloo_step(models, opt, batch, cfg, gen, rows=(0, len(batch) * cfg.k)).stats
            took = time.perf_counter() - t0
        finally:
            sampler.few_rows_pays = sampler_rule
        if i >= 2:  # the first pair warms up
            times[on].append({"step_s": took} | {k: float(v) for k, v in stats.items() if k.startswith("time/")})
    med = {on: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for on, rs in times.items()}
    wins = sum(a["step_s"] < b["step_s"] for a, b in zip(times[True], times[False], strict=True))
    res = {
        "shape": shape.name, "threads": args.threads, "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "pairs": args.steps,
        "plain": med[False], "swapped": med[True], "step_ratio": med[True]["step_s"] / med[False]["step_s"],
        "pairs_swapped_faster": wins, "raw": {"plain": times[False], "swapped": times[True]},
    }  # fmt: skip
    for name, m in (("plain", med[False]), ("swapped", med[True])):
        print(f"{shape.name} {name:8s}: " + ", ".join(f"{k} {v:.3f}" for k, v in m.items()))
    print(f"step ratio swapped / plain {res['step_ratio']:.3f}; swapped faster in {wins}/{args.steps} pairs")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
