"""fp32 vs bf16 autocast on this CPU, side by side in one process: the demo model's SFT step and its
sampling (KV-cached decode), and the bench's M-shaped policy. Alternates the two precisions and
reports the minimum and median of each (the minimum is the least disturbed by other load).

    PYTHONPATH=src python benchmarks/precision_speed.py [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rloo.rollout.sampler import sample
from rloo.runtime.precision import resolve_precision

SHAPES = {"demo (128 wide, 3 layers)": (128, 3, 4, 384, 2000), "bench M (512 wide, 6 layers)": (512, 6, 8, 1376, 8192)}


def _model(hidden, layers, heads, inter, vocab):
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=256,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=None,
        )
    )


def _train_step(model, ids):
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def _decode(model, ids, new):
    with torch.no_grad():
        sample(
            model,
            ids,
            torch.ones_like(ids, dtype=torch.bool),
            max_new_tokens=new,
            eos_id=-1,
            pad_id=0,
            generator=torch.Generator().manual_seed(0),
        )


def measure(reps: int) -> dict:
    out = {}
    for name, shape in SHAPES.items():
        model, vocab = _model(*shape), shape[-1]
        ids = torch.randint(2, vocab, (64, 96), generator=torch.Generator().manual_seed(0))
        jobs = {
            "sft step (64 x 96 tokens)": lambda model=model, ids=ids: _train_step(model, ids),
            "decode 32 tokens (64 rows)": lambda model=model, ids=ids: _decode(model, ids[:, :32], 32),
        }
        for job, fn in jobs.items():
            times = {"float32": [], "bfloat16": []}
            for i in range(reps + 1):
                for dt in ["float32", "bfloat16"] if i % 2 == 0 else ["bfloat16", "float32"]:
                    with resolve_precision(dt, "cpu").autocast():
                        t0 = time.perf_counter()
                        fn()
                        if i:  # the first round warms up both
                            times[dt].append(time.perf_counter() - t0)
            r = {dt: {"min_s": min(v), "median_s": statistics.median(v)} for dt, v in times.items()}
            r["speedup_min"] = r["float32"]["min_s"] / r["bfloat16"]["min_s"]
            r["speedup_median"] = r["float32"]["median_s"] / r["bfloat16"]["median_s"]
            out[f"{name}: {job}"] = r
            print(
                f"{name}: {job}: fp32 {r['float32']['min_s']:.3f}/{r['float32']['median_s']:.3f} s, "
                f"bf16 {r['bfloat16']['min_s']:.3f}/{r['bfloat16']['median_s']:.3f} s (min/median); "
                f"bf16 speed-up {r['speedup_min']:.2f}x (min) {r['speedup_median']:.2f}x (median)",
                flush=True,
            )
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    res = measure(a.reps)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
