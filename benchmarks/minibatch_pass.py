"""The policy's log-prob pass over a minibatch of random rows (grpo, dr_grpo, reinforce_pp and
rloo_clip at their default num_minibatches=2, and the micro-batches rl.micro_batch_size cuts from
such a minibatch): every
row in full (the plain pass, what such minibatches took before) against each distinct prompt once
(`rloo.modeling.logprob_pass.rows_prompts`, the shared pass), forward and backward, alternated.

    python benchmarks/minibatch_pass.py [--threads 2] [--rounds 5] [--json FILE]

At `rloo bench`'s S, M and L policy shapes (rloo.experiments.bench_assets.SHAPES; random Llama weights,
vocabulary 8192, fp32): 8 prompts of the shape's lengths (left-padded) x k=4 completions of the
shape's length, and a minibatch of 16 of the 32 rows drawn as `rloo.algorithms.common.minibatches`
draws them (a random permutation's first half). Median seconds over the rounds, their ratio, and
the largest |log-prob difference| between the two passes.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from microbench import script_args
from rloo.modeling.logprob_pass import policy_logprobs, rows_prompts


def _inputs(shape, gen: torch.Generator, b: int = 8, k: int = 4):
    lo, hi = shape.prompt_tokens
    p_ids = torch.randint(2, 8192, (b, hi), generator=gen)
    p_mask = torch.ones_like(p_ids, dtype=torch.bool)
    for row, pad in enumerate(torch.randint(0, hi - lo + 1, (b,), generator=gen).tolist()):
        p_mask[row, :pad] = False
    p_ids = p_ids.masked_fill(~p_mask, 0)
    c_ids = torch.randint(2, 8192, (b * k, shape.max_new_tokens), generator=gen)
    c_mask = torch.ones_like(c_ids, dtype=torch.bool)
    rows = torch.randperm(b * k, generator=gen)[: b * k // 2]
    return (p_ids.repeat_interleave(k, 0), p_mask.repeat_interleave(k, 0), c_ids, c_mask), rows


def shape_row(name: str, rounds: int) -> dict:
    from transformers import LlamaForCausalLM

    from rloo.experiments.bench_assets import SHAPES, llama_config
    from rloo.modeling.attention import use_rloo_attention

    shape = SHAPES[name]
    torch.manual_seed(0)
    model = use_rloo_attention(LlamaForCausalLM(llama_config(shape, vocab_size=8192, tied=False)))
    batch, rows = _inputs(shape, torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {"plain": [], "shared": []}
    out = {}
    for _ in range(rounds):
        for how in ("plain", "shared"):
            t = time.perf_counter()
            lp = policy_logprobs(model, *batch, k=4, share=how == "shared", rows=rows)
            lp.sum().backward()
            times[how].append(time.perf_counter() - t)
            model.zero_grad(set_to_none=True)
            out[how] = lp.detach()
    plain, shared = (statistics.median(times[h]) for h in ("plain", "shared"))
    prompt_of = rows_prompts(rows, 4)
    return {
        "shape": name,
        "prompt_tokens": list(shape.prompt_tokens),
        "completion_tokens": shape.max_new_tokens,
        "rows": len(rows),
        "distinct_prompts": None if prompt_of is None else int(prompt_of.max()) + 1,
        "plain_s": plain,
        "shared_s": shared,
        "plain/shared": plain / shared,
        "times_s": times,
        "max_logprob_diff": (out["plain"] - out["shared"]).abs().max().item(),
    }


def main() -> None:
    args = script_args(__doc__, threads=2, reps=1, rounds=5)
    torch.set_num_threads(args.threads)
    table = []
    for name in ("S", "M", "L"):
        r = shape_row(name, args.rounds)
        table.append(r)
        print(
            f"{name}: {r['rows']} rows of {r['distinct_prompts']} prompts ({r['prompt_tokens']} + "
            f"{r['completion_tokens']} tokens): plain {r['plain_s']:.3f} s, shared {r['shared_s']:.3f} s "
            f"({r['plain/shared']:.2f}x); max |log-prob diff| {r['max_logprob_diff']:.1e}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
