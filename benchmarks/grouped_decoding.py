"""Grouped decoding (one copy of each prompt's keys/values for its k samples) against the expanded
cache (k copies), measured on this machine: what `GROUPED_MIN_ELEMENTS` (rloo.modeling.kvcache) and
docs/bench.md ("Grouped decoding") quote.

    python benchmarks/grouped_decoding.py [--threads 2] [--reps 40] [--rounds 5] [--json FILE]

1. One decode step's attention (q length 1), SDPA over the expanded cache against
   `grouped_attention`, at `rloo bench`'s M/L attention shape (32 rows = 8 prompts x k=4, 8 heads of
   64) for prompt lengths 32-460, and at the small built-in models' shapes; with a left-padding mask.
2. rloo's sampler end to end on `rloo bench`'s L policy shape (Llama, hidden 512, 6 layers, 8 heads,
   MLP 1376, vocabulary 8192; random weights): 8 prompts of 400-460 tokens (left-padded to 460, as
   `rloo bench` draws them) x k=4, 32 new tokens, no EOS,
   in fp32 and under bf16 autocast, expanded vs grouped, alternated; median seconds, and the bytes
   the decoding cache holds.
3. The shared training passes at the same shape (32 completions of 32 tokens): the policy's log-prob
   pass with its backward, and a no-grad pass (the reference's), grouped vs expanded, alternated.
"""

from __future__ import annotations

import json
import statistics
import time

import torch
import torch.nn.functional as F

from microbench import median_ms as _median_ms
from microbench import script_args
from rloo.config import Sampling
from rloo.modeling.attention import grouped_attention


@torch.no_grad()
def attention_row(name: str, b: int, k: int, h: int, d: int, p: int, t: int, reps: int) -> dict:
    n, g = b * k, torch.Generator().manual_seed(0)
    q = torch.randn(n, h, 1, d, generator=g)
    pk, pv = torch.randn(b, h, p, d, generator=g), torch.randn(b, h, p, d, generator=g)
    ok, ov = torch.randn(n, h, t, d, generator=g), torch.randn(n, h, t, d, generator=g)
    prompt_mask = torch.ones(b, p, dtype=torch.bool)
    prompt_mask[:, : p // 10] = False  # left padding, as prompts are batched
    mask = torch.cat([prompt_mask.repeat_interleave(k, 0), torch.ones(n, t, dtype=torch.bool)], 1)[:, None, None]
    # the expanded cache as the sampler holds it: a view into a buffer with room for more tokens
    keys = torch.zeros(n, h, p + t + 16, d)
    values = torch.zeros(n, h, p + t + 16, d)
    keys[:, :, :p], keys[:, :, p : p + t] = pk.repeat_interleave(k, 0), ok
    values[:, :, :p], values[:, :, p : p + t] = pv.repeat_interleave(k, 0), ov
    keys, values = keys[:, :, : p + t], values[:, :, : p + t]
    own_k = torch.zeros(n, h, t + 16, d)
    own_v = torch.zeros(n, h, t + 16, d)
    own_k[:, :, :t], own_v[:, :, :t] = ok, ov
    own_k, own_v = own_k[:, :, :t], own_v[:, :, :t]

    def expanded():
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    def grouped():
        return grouped_attention(q, own_k, own_v, pk, pv, mask)

    err = (grouped() - expanded().transpose(1, 2)).abs().max().item()
    row = {"shape": name, "prompts": b, "k": k, "heads": h, "head_dim": d, "prompt": p, "own": t}
    row |= {"elements": n * h * p * d, "expanded_ms": _median_ms(expanded, reps)}
    row |= {"grouped_ms": _median_ms(grouped, reps), "max_abs_diff": err}
    row["grouped/expanded"] = row["grouped_ms"] / row["expanded_ms"]
    return row


def attention_table(reps: int) -> list[dict]:
    shapes = [("M/L", 8, 4, 8, 64, p, 32) for p in (32, 64, 128, 256, 460)]
    shapes += [("demo", 8, 4, 4, 32, 40, 24), ("compare --quick", 8, 4, 2, 32, 40, 10)]
    shapes += [("arithmetic", 16, 8, 4, 32, 20, 12)]
    return [attention_row(*s, reps=reps) for s in shapes]


def _l_policy():
    """`rloo bench`'s L policy shape (rloo.experiments.bench_assets.SHAPES["L"]) as a random Llama on
    rloo_sdpa, vocabulary 8192, untied head."""
    from transformers import LlamaForCausalLM

    from rloo.experiments.bench_assets import SHAPES, llama_config
    from rloo.modeling.attention import use_rloo_attention

    cfg = llama_config(SHAPES["L"], vocab_size=8192, tied=False)
    torch.manual_seed(0)
    return use_rloo_attention(LlamaForCausalLM(cfg))


def _l_prompts():
    """8 prompts of 400-460 tokens, left-padded to 460 as `rloo bench` draws them: ids, mask, and the
    generator (for whatever else a table draws after them)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 8192, (8, 460), generator=gen)
    mask = torch.ones_like(ids, dtype=torch.bool)
    for row, pad in enumerate(torch.randint(0, 61, (8,), generator=gen).tolist()):
        mask[row, :pad] = False
    return ids.masked_fill(~mask, 0), mask, gen


def sampler_table(rounds: int) -> dict:
    from rloo.rollout import sampler

    model = _l_policy().eval()
    ids, mask, _ = _l_prompts()
    variants = [(dt, gr) for dt in ("float32", "bfloat16") for gr in (False, True)]
    times: dict[str, list[float]] = {}
    outputs: dict[str, tuple] = {}
    for _ in range(rounds):
        for dt, gr in variants:
            name = f"{dt}, {'grouped' if gr else 'expanded'}"
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == "bfloat16"):
                t = time.perf_counter()
                out = sampler.sample_tokens(
                    model, ids, mask, Sampling(32, ids.shape[1]), eos_id=-1, pad_id=0, k=4,
                    generator=torch.Generator().manual_seed(0), grouped=gr,
                )  # fmt: skip
                times.setdefault(name, []).append(time.perf_counter() - t)
            outputs[name] = out
    res = {name: {"median_s": statistics.median(ts), "times_s": ts} for name, ts in times.items()}
    for dt in ("float32", "bfloat16"):
        (ids_e, _, lp_e), (ids_g, _, lp_g) = outputs[f"{dt}, expanded"], outputs[f"{dt}, grouped"]
        res[f"{dt}, grouped"]["same_tokens"] = bool(torch.equal(ids_e, ids_g))
        res[f"{dt}, grouped"]["max_logprob_diff"] = (lp_e - lp_g).abs().max().item()
    # what the decoding cache holds (fp32: rloo_sdpa's CPU cache): 6 layers x keys and values
    n, h, d, p, t = 32, 8, 64, 460, 32
    expanded_mb, grouped_mb = 6 * 2 * n * h * (p + t) * d * 4 / 1e6, 6 * 2 * (8 * p + n * t) * h * d * 4 / 1e6
    res["cache_mb"] = {"expanded": expanded_mb, "grouped": grouped_mb}
    return res


def training_table(rounds: int) -> dict:
    """The shared passes at the L shape: the policy's log-prob pass with backward, and a no-grad pass
    (what the reference runs), over 32 completions of 32 tokens after 8 prompts of 400-460 tokens;
    grouped attention on (as `grouped_pays` decides there) and forced off, alternated."""
    import rloo.modeling.kvcache as kvcache
    from rloo.modeling.forward_shared import completion_logprobs_shared

    model = _l_policy()
    p_ids, p_mask, gen = _l_prompts()
    p_ids, p_mask = p_ids.repeat_interleave(4, 0), p_mask.repeat_interleave(4, 0)
    c_ids = torch.randint(2, 8192, (32, 32), generator=gen)
    c_mask = torch.ones_like(c_ids, dtype=torch.bool)
    threshold = kvcache.GROUPED_MIN_ELEMENTS
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for dt in ("float32", "bfloat16"):
            for grouped in (False, True):
                kvcache.GROUPED_MIN_ELEMENTS = threshold if grouped else 2**62
                for what in ("policy fwd+bwd", "no-grad pass"):
                    name = f"{what}, {dt}, {'grouped' if grouped else 'expanded'}"
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == "bfloat16"):
                        t = time.perf_counter()
                        with torch.set_grad_enabled(what == "policy fwd+bwd"):
                            lp = completion_logprobs_shared(model, p_ids, p_mask, c_ids, c_mask, k=4)
                            if what == "policy fwd+bwd":
                                lp.sum().backward()
                        times.setdefault(name, []).append(time.perf_counter() - t)
                    model.zero_grad(set_to_none=True)
    kvcache.GROUPED_MIN_ELEMENTS = threshold
    return {name: {"median_s": statistics.median(ts), "times_s": ts} for name, ts in times.items()}


def _runs(r: dict) -> str:
    return ", ".join(f"{t:.2f}" for t in r["times_s"])


def main() -> None:
    args = script_args(__doc__, threads=2, reps=40, rounds=5)
    torch.set_num_threads(args.threads)
    att = attention_table(args.reps)
    for r in att:
        print(
            f"{r['shape']:15s} prompt {r['prompt']:3d} own {r['own']:2d} ({r['elements'] / 1e6:5.2f}M elements): "
            f"expanded {r['expanded_ms']:.3f} ms, grouped {r['grouped_ms']:.3f} ms "
            f"({r['grouped/expanded']:.2f}x; max |diff| {r['max_abs_diff']:.1e})"
        )
    dec = sampler_table(args.rounds)
    for name, r in dec.items():
        if name == "cache_mb":
            print(f"decoding cache: expanded {r['expanded']:.0f} MB, grouped {r['grouped']:.0f} MB")
            continue
        extra = ""
        if "same_tokens" in r:
            extra = f"; same tokens {r['same_tokens']}, max |log-prob diff| {r['max_logprob_diff']:.1e}"
        print(f"sampler, L shape, {name:20s}: {r['median_s']:.2f} s (runs {_runs(r)}){extra}")
    train = training_table(args.rounds)
    for name, r in train.items():
        print(f"shared pass, L shape, {name:38s}: {r['median_s']:.2f} s (runs {_runs(r)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "attention": att, "sampler": dec, "training": train}, f, indent=1)


if __name__ == "__main__":
    main()
