"""vLLM's log-probs (mu) against the trainer's (pi) on a real model, fp32 and bf16
(docs/results/vllm-mismatch/README.md).

    PYTHONPATH=src .venv-vllm/bin/python benchmarks/studies/vllm_mismatch_demo.py RUNS/seed0/sft/model \
        --batches 4 --out mismatch_demo.json

For each dtype: rloo's VLLMSampler (generation=vllm) samples `batches` batches of the summarize task's
training prompts (16 prompts x k = 4, at most 16 new tokens, temperature 1: the demo's RL settings)
from the model, and the policy recomputes the sampled tokens' log-probs in the trainer's precision
(fp32, or bf16 autocast over fp32 weights). Reported over all sampled tokens: the k1 estimate of
KL(mu || pi) per token (mean of log mu - log pi), the largest |log mu - log pi|, and over sequences the
largest |sum_t log mu - log pi| and the share of sequences whose ratio pi/mu leaves [1/2, 2] (what
`rl.is_correction=tis|mis` at `is_clip=2` would truncate or drop).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Literal, cast

import torch

from rloo.config import RLConfig
from rloo.modeling.loading import load_policy
from rloo.rollout.vllm import VLLMSampler
from rloo.runtime.precision import MIN_BF16_WIDTH_SAMPLING, model_width, resolve_precision
from rloo.tasks import get_task


def measure(model: str, dtype: str, batches: int, prompts: list[str]) -> dict:
    dtype_field = cast(Literal["auto", "float32", "bfloat16", "float16"], dtype)  # RLConfig validates the string
    cfg = RLConfig(policy=model, output_dir=Path("/tmp/unused"), generation="vllm", dtype=dtype_field,
                   reward_fn="math:fsum", k=4, batch_size=16, max_new_tokens=16, seed=0)  # fmt: skip
    policy, tok = load_policy(model)
    sampler = VLLMSampler(cfg, tok, policy)
    precision = resolve_precision(dtype, "cpu", model_width(cfg), MIN_BF16_WIDTH_SAMPLING)
    diffs, seq = [], []
    gen = torch.Generator().manual_seed(0)
    for b in range(batches):
        with precision.autocast():
            roll = sampler(policy, prompts[16 * b : 16 * (b + 1)], generator=gen)
        mask = roll.completion_mask
        assert roll.sampler_logprobs is not None  # VLLMSampler returns vLLM's own log-probs with every batch
        d = (roll.sampler_logprobs - roll.logprobs).double().masked_fill(~mask, 0.0)
        diffs.append(d[mask])
        seq.append(d.sum(1))
    tokens, seqs = torch.cat(diffs), torch.cat(seq)
    return {
        "dtype": dtype,
        "tokens": tokens.numel(),
        "sequences": seqs.numel(),
        "kl_mu_pi_k1": float(tokens.mean()),
        "logprob_abs_max": float(tokens.abs().max()),
        "logprob_abs_mean": float(tokens.abs().mean()),
        "seq_logratio_abs_max": float(seqs.abs().max()),
        "seq_outside_half_two": float((seqs.abs() > torch.log(torch.tensor(2.0))).double().mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    task = get_task("summarize")
    prompts = [e.prompt for e in task.examples("train", 16 * a.batches, seed=0)]
    random.Random(0).shuffle(prompts)
    rows = [measure(a.model, d, a.batches, prompts) for d in a.dtypes.split(",")]
    for r in rows:
        print(json.dumps(r))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
