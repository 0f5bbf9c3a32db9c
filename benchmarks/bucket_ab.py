"""Length buckets on and off, same process, alternating: the reference pass and the policy's
forward + backward over one rollout of a benchmark shape (docs/bench.md, "Completions in length
buckets").

    python benchmarks/bucket_ab.py S      # medians over 6 alternating repetitions
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from rloo.config import RLConfig
from rloo.experiments.bench_assets import SHAPES, build_assets, load_words, make_prompts
from rloo.modeling.forward_shared import completion_logprobs_shared
from rloo.rollout import rollout
from rloo.training.common import seed_everything
from rloo.training.rl import load_models

OVERHEADS = {"one padded pass": 10**9, "buckets (default, 64)": 64, "one pass per length (0)": 0}


def main(name: str = "S", root: str = "runs/bench/assets", reps: int = 6) -> None:
    torch.set_num_threads(2)
    shape = SHAPES[name]
    folder = build_assets(shape, Path(root), 0)
    cfg = RLConfig(
        policy=str(folder / "policy"),
        reward_model=str(folder / "reward"),
        k=4,
        batch_size=8,
        max_new_tokens=shape.max_new_tokens,
        max_prompt_tokens=shape.max_prompt_tokens,
        seed=0,
    )
    gen = seed_everything(0)
    models = load_models(cfg)
    prompts = make_prompts(models.tokenizer, load_words(folder), shape, 8, 0)
    roll = rollout(
        models.policy,
        models.tokenizer,
        prompts,
        4,
        max_prompt_len=shape.max_prompt_tokens,
        max_new_tokens=shape.max_new_tokens,
        generator=gen,
        rows=(0, 32),
    )
    print("completion lengths:", roll.completion_mask.sum(-1).tolist())
    args = (roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in OVERHEADS}
    for rep in range(reps + 1):
        for label, overhead in OVERHEADS.items():
            t0 = time.perf_counter()
            with torch.no_grad():
                completion_logprobs_shared(models.ref, *args, k=4, bucket_overhead=overhead)
            t1 = time.perf_counter()
            lp = completion_logprobs_shared(models.policy, *args, k=4, bucket_overhead=overhead)
            lp.masked_fill(~roll.completion_mask, 0).sum().backward()
            t2 = time.perf_counter()
            if rep:  # the first round is warm-up
                times[label].append((t1 - t0, t2 - t1))
    print("| passes | reference s | policy fwd+bwd s |\n|---|---|---|")
    for label, v in times.items():
        print(f"| {label} | {statistics.median(a for a, _ in v):.3f} | {statistics.median(b for _, b in v):.3f} |")


if __name__ == "__main__":
    main(*sys.argv[1:2])
