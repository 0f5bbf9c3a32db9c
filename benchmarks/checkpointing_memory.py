"""Peak memory and step time of rloo's RL step with gradient checkpointing off and on, side by
side in one run: two worker processes (rloo.experiments.bench_workers._rloo_worker) on the same shape, prompts and
seed, taking turns one step at a time (the first mover alternates). share_prompt=true (the
default), so checkpointing runs through rloo.modeling.layer_checkpoint. Results: docs/bench.md.

    python benchmarks/checkpointing_memory.py [--shapes M L] [--steps 3] [--dtype float32]
        [--out runs/bench/checkpointing.json]
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rloo.experiments.bench_assets import SHAPES, Shape, build_assets, load_words, make_prompts
from rloo.experiments.bench_workers import _rloo_worker, _start


def run_shape(
    shape: Shape | str, root: Path, steps: int, warmup: int, k: int = 4, batch_size: int = 8, dtype: str = "float32"
) -> dict:
    from transformers import AutoTokenizer

    shape = SHAPES[shape] if isinstance(shape, str) else shape
    name = shape.name
    folder = build_assets(shape, root, 0)
    tok = AutoTokenizer.from_pretrained(folder / "policy")
    total = warmup + steps
    prompts = make_prompts(tok, load_words(folder), shape, total * batch_size, 0)
    job = dict(
        policy=str(folder / "policy"),
        reward=str(folder / "reward"),
        k=k,
        beta=0.05,
        lr=1e-6,
        seed=0,
        batch_size=batch_size,
        max_new_tokens=shape.max_new_tokens,
        max_prompt_tokens=shape.max_prompt_tokens,
        threads=2,
        share_prompt=True,
        device="cpu",
        dtype=dtype,
        tmp=tempfile.mkdtemp(prefix="rloo-ckpt-"),
        batches=[prompts[i * batch_size : (i + 1) * batch_size] for i in range(total)],
    )
    labels = ("off", "on")
    workers = {lab: _start(_rloo_worker, job | {"gradient_checkpointing": lab == "on"}) for lab in labels}
    res = {
        lab: {"loaded_rss_gb": workers[lab][2]["rss_gb"], "times_s": [], "rss_gb": [], "update_s": []} for lab in labels
    }
    for i in range(total):
        for lab in labels if i % 2 == 0 else labels[::-1]:
            workers[lab][1].send("step")
            r = workers[lab][1].recv()
            print(
                f"{name} checkpointing {lab} step {i + 1}/{total}: {r['time']:.2f} s, peak {r['rss_gb']:.2f} GB",
                flush=True,
            )
            if i >= warmup:
                res[lab]["times_s"].append(r["time"])
                res[lab]["update_s"].append(r["phases"]["time/update"])
            res[lab]["rss_gb"].append(r["rss_gb"])
    for proc, conn, _ in workers.values():
        conn.send("stop")
        proc.join(timeout=60)
    for r in res.values():
        r["peak_rss_gb"] = max(r["rss_gb"])
        r["median_s"] = statistics.median(r["times_s"])
        r["median_update_s"] = statistics.median(r["update_s"])
    return {
        "shape": name,
        "dtype": dtype,
        "k": k,
        "batch_size": batch_size,
        "steps": steps,
        "warmup": warmup,
        **res,
        "peak_saved_gb": res["off"]["peak_rss_gb"] - res["on"]["peak_rss_gb"],
        "time_ratio_on_off": res["on"]["median_s"] / res["off"]["median_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["M", "L"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--root", default="runs/bench/assets")
    ap.add_argument("--out", default="runs/bench/checkpointing.json")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    args = ap.parse_args()
    rows = []
    for name in args.shapes:
        rows.append(run_shape(name, Path(args.root), args.steps, args.warmup, dtype=args.dtype))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
        r = rows[-1]
        print(
            f"{name}: peak off {r['off']['peak_rss_gb']:.2f} GB, on {r['on']['peak_rss_gb']:.2f} GB "
            f"(saved {r['peak_saved_gb']:.2f} GB); median step off {r['off']['median_s']:.2f} s, "
            f"on {r['on']['median_s']:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
