"""Why CPU bf16 autocast computes attention in fp32 (rloo.modeling.attention), measured on this machine.

    python benchmarks/cpu_attention.py [--threads 1] [--reps 20]

1. torch's scaled_dot_product_attention alone, fp32 against bf16 inputs, at the shapes a step meets:
   a decode step over a 460- and a 64-token cache (32 rows, 8 heads of 64; with a padding mask, as
   the sampler passes one), and causal forward + backward over 460 (8 rows) and 80 tokens (32 rows).
2. rloo's sampler end to end on `rloo bench`'s L policy shape (Llama, hidden 512, 6 layers, 8 heads,
   MLP 1376, vocabulary 8192; random weights), 8 prompts of 430 tokens x k=4, 32 new tokens, no EOS:
   fp32, bf16 autocast on transformers' SDPA, bf16 autocast on rloo_sdpa; alternated, medians.
3. A decode step's linear layers (32 rows): fp32, bf16 weights outright, bf16 autocast over fp32
   weights (whether a bf16 copy of the weights for sampling would beat autocast: it does not, autocast
   caches its casts of the weights).
Times in ms (1, 3) and s (2), medians; the ratios are what docs/precision.md and docs/bench.md quote.
"""

from __future__ import annotations

import copy
import json
import statistics
import time

import torch
import torch.nn.functional as F

from microbench import median_ms as _median_ms
from microbench import script_args


def sdpa_table(reps: int) -> list[dict]:
    rows = []
    for what, (b, q_len, kv_len), backward in (
        ("decode step", (32, 1, 460), False),
        ("decode step", (32, 1, 64), False),
        ("causal fwd+bwd", (8, 460, 460), True),
        ("causal fwd+bwd", (32, 80, 80), True),
    ):
        row = {"what": what, "rows": b, "q": q_len, "kv": kv_len}
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(0)
            q = torch.randn(b, 8, q_len, 64, generator=g).to(dtype).requires_grad_(backward)
            k = torch.randn(b, 8, kv_len, 64, generator=g).to(dtype).requires_grad_(backward)
            v = torch.randn(b, 8, kv_len, 64, generator=g).to(dtype).requires_grad_(backward)
            mask = None if backward else torch.ones(b, 1, 1, kv_len, dtype=torch.bool)

            def run(q=q, k=k, v=v, mask=mask, backward=backward):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=backward)
                if backward:
                    out.sum().backward()

            with torch.set_grad_enabled(backward):
                row[str(dtype).removeprefix("torch.")] = _median_ms(run, reps)
        row["bf16/fp32"] = row["bfloat16"] / row["float32"]
        rows.append(row)
    return rows


def linear_table(reps: int) -> list[dict]:
    rows = []
    for d_in, d_out in ((512, 512), (512, 1376), (512, 8192), (2048, 8192)):
        w = torch.randn(d_out, d_in, requires_grad=True)
        x = torch.randn(32, d_in)
        wb, xb = w.detach().bfloat16(), x.bfloat16()
        with torch.no_grad():
            row = {"in": d_in, "out": d_out, "float32": _median_ms(lambda x=x, w=w: F.linear(x, w), reps)}
            row["bf16 weights"] = _median_ms(lambda xb=xb, wb=wb: F.linear(xb, wb), reps)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                row["autocast"] = _median_ms(lambda x=x, w=w: F.linear(x, w), reps)
        rows.append(row)
    return rows


def decode_table(rounds: int) -> dict:
    from transformers import LlamaForCausalLM

    from rloo.experiments.bench_assets import SHAPES, llama_config
    from rloo.modeling.attention import use_rloo_attention
    from rloo.rollout.sampler import sample

    cfg = llama_config(SHAPES["L"], vocab_size=8192, tied=False)  # as measured for docs/precision.md
    torch.manual_seed(0)
    plain = LlamaForCausalLM(cfg).eval()
    ours = use_rloo_attention(copy.deepcopy(plain))
    ids = torch.randint(2, 8192, (8, 430), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    variants = {"fp32": (plain, False), "bf16 autocast, sdpa": (plain, True), "bf16 autocast, rloo_sdpa": (ours, True)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (model, bf16) in variants.items():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                t = time.perf_counter()
                sample(
                    model,
                    ids,
                    mask,
                    max_new_tokens=32,
                    eos_id=-1,
                    pad_id=0,
                    k=4,
                    generator=torch.Generator().manual_seed(0),
                )
                times[name].append(time.perf_counter() - t)
    return {name: {"median_s": statistics.median(ts), "times_s": ts} for name, ts in times.items()}


def main() -> None:
    args = script_args(__doc__, threads=1, reps=20, rounds=3)
    torch.set_num_threads(args.threads)
    sdpa = sdpa_table(args.reps)
    for r in sdpa:
        print(
            f"{r['what']:15s} rows {r['rows']:2d} q {r['q']:3d} kv {r['kv']:3d}: fp32 {r['float32']:7.2f} ms, "
            f"bf16 {r['bfloat16']:7.2f} ms ({r['bf16/fp32']:.2f}x the fp32 time)"
        )
    lin = linear_table(args.reps)
    for r in lin:
        print(
            f"linear 32 x {r['in']:4d} -> {r['out']:4d}: fp32 {r['float32']:.3f} ms, bf16 weights "
            f"{r['bf16 weights']:.3f} ms, autocast {r['autocast']:.3f} ms"
        )
    dec = decode_table(args.rounds)
    for name, r in dec.items():
        print(
            f"sampler, L shape, {name:26s}: {r['median_s']:.2f} s (runs {', '.join(f'{t:.2f}' for t in r['times_s'])})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "sdpa": sdpa, "linear": lin, "decode": dec}, f, indent=1)


if __name__ == "__main__":
    main()
