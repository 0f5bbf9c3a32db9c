"""Peak memory of one RL step as k and the prompt length grow: rloo (prompt shared per group),
rloo with share_prompt=false, and TRL's RLOOTrainer, each in its own process (the L model:
hidden 512, 6 layers, 8192-token BPE, 8 prompts, 32 new tokens). Results: docs/bench.md.

    python benchmarks/memory_sweep.py [--no-trl] [--out runs/bench/memory.json]
"""

import argparse
import dataclasses
import json
from pathlib import Path

from rloo.experiments.bench import bench_shape
from rloo.experiments.bench_assets import SHAPES
from rloo.experiments.bench_machine import matmul_peak_flops

POINTS = [(2, (400, 460)), (4, (400, 460)), (8, (400, 460)), (4, (40, 60)), (4, (200, 230))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--out", default="runs/bench/memory.json")
    ap.add_argument("--root", default="runs/bench/assets")
    args = ap.parse_args()
    peak = matmul_peak_flops(2, seconds=0.5)
    rows = []
    for k, prompt in POINTS:
        shape = dataclasses.replace(SHAPES["L"], prompt_tokens=prompt)
        row = {"k": k, "prompt_tokens": prompt}
        runs = [("rloo", True), ("rloo-plain", False)] + ([] if args.no_trl else [("trl", True)])
        for label, share in runs:
            trainer = "trl" if label == "trl" else "rloo"
            res = bench_shape(
                shape,
                root=Path(args.root),
                warmup=0,
                steps=1,
                k=k,
                batch_size=8,
                beta=0.05,
                lr=1e-6,
                seed=0,
                threads=2,
                peak=peak,
                trainers=[trainer],
                share_prompt=share,
                log=lambda *_: None,
            )
            r = res["results"][trainer]
            row[label] = {"peak_rss_gb": r["peak_rss_gb"], "s_per_step": r["median_s"]}
            print(f"k={k} prompt={prompt} {label}: peak {r['peak_rss_gb']:.2f} GB, {r['median_s']:.1f} s", flush=True)
        rows.append(row)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
