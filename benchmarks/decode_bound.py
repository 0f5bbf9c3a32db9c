"""What bounds the decode loop on a CPU, and four ways to run its products (one of them, (W x^T)^T, is
rloo.modeling.few_rows; docs/bench.md, "What bounds M's decode loop").

    python benchmarks/decode_bound.py [--threads 2] [--rounds 7] [--json FILE]

1. Cold weights: one decode step's matmuls at `rloo bench`'s M shape (6 layers of q/k/v/o 512x512,
   gate/up 512x1376, down 1376x512, and the 512x8192 LM head: 93 MB of fp32 weights) multiplied one
   after the other, as a decode step does, so no weight is still in cache when it is used again;
   1-128 rows, 1 and 2 threads; against the rate at which the same 93 MB can be summed (bandwidth).
2. The same sweep at 32 rows with (a) the weights prepacked by MKL for 32 rows
   (`torch.ops.mkl._mkl_linear`, what inductor's freezing uses), (b) each matrix's output columns
   split over two Python threads with one OpenMP thread each, (c) the output columns in blocks of
   512 (`torch.mm(..., out=)` into the slices), (d) the transposed product (W x^T)^T made contiguous
   (the BLAS then sees a tall, thin problem): results checked equal to `F.linear` (bit for bit, or
   the largest difference for (d), whose sums run in another order).
3. A warm micro-benchmark of the LM head alone (one matrix, repeated): plain vs 1024-column blocks
   vs (W x^T)^T.
4. rloo's sampler end to end at the M shape (random Llama, 8 prompts of 16-48 tokens left-padded to
   48, k=4, 64 new tokens, no EOS, uniforms from `rows=` as `rloo bench` draws them): every linear
   plain vs in 512- and 1024-column blocks vs (W x^T)^T (no-grad only), alternated, the order reversed
   every other round; medians, rounds faster than plain, and whether the tokens are the same.
"""

from __future__ import annotations

import json
import statistics
import time
import types
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from microbench import median_ms, script_args
from rloo.config import Sampling

LAYER = [(512, 512)] * 4 + [(512, 1376)] * 2 + [(1376, 512)]  # (in, out) of one M layer's linears


def _median_ms(fn, reps: int) -> float:
    return median_ms(fn, reps, warmup=3)


def _weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(o, i, generator=g) for _ in range(6) for i, o in LAYER] + [torch.randn(8192, 512, generator=g)]


def _blocked_mm(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
    for s in range(0, w.shape[0], block):
        torch.mm(x, w[s : s + block].t(), out=out[:, s : s + block])
    return out


def _transposed_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (w @ x.t()).t().contiguous()


def cold_sweep(threads: int, reps: int) -> dict:
    ws = _weights()
    mb, res = sum(w.numel() * 4 for w in ws) / 1e6, {}
    torch.set_num_threads(threads)
    res["weights_mb"] = mb
    res["sum_ms"] = _median_ms(lambda: [w.sum() for w in ws], reps)
    res["sum_gb_s"] = mb / res["sum_ms"]
    for th in (1, 2):
        torch.set_num_threads(th)
        for rows in (1, 8, 32, 128):
            xs = {i: torch.randn(rows, i) for i in (512, 1376)}
            ms = _median_ms(lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in ws], reps)
            gflop = sum(2 * rows * w.numel() for w in ws) / 1e9
            res[f"threads {th}, rows {rows}"] = {"ms": ms, "gflop_s": gflop / ms * 1e3, "weight_gb_s": mb / ms}
    torch.set_num_threads(threads)
    return res


def variants_32_rows(threads: int, reps: int, rounds: int) -> dict:
    ws, rows = _weights(), 32
    xs = {i: torch.randn(rows, i) for i in (512, 1376)}
    packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for w in ws]
    halves = [w.chunk(2, 0) for w in ws]
    pool = ThreadPoolExecutor(2)
    list(pool.map(lambda _: torch.set_num_threads(1), range(2)))

    def split(x, w, h):
        out = torch.empty(rows, w.shape[0])
        left, right = out.chunk(2, 1)
        fut = pool.submit(torch.mm, x, h[1].t(), out=right)
        torch.mm(x, h[0].t(), out=left)
        fut.result()
        return out

    def two_threads():
        torch.set_num_threads(1)
        try:
            return [split(xs[w.shape[1]], w, h) for w, h in zip(ws, halves, strict=True)]
        finally:
            torch.set_num_threads(threads)

    fns = {
        "plain": lambda: [F.linear(xs[w.shape[1]], w) for w in ws],
        "mkl packed": lambda: [
            torch.ops.mkl._mkl_linear(xs[w.shape[1]], p, w, None, rows) for w, p in zip(ws, packed, strict=True)
        ],
        "two threads, half the columns each": two_threads,
        "512-column blocks": lambda: [_blocked_mm(xs[w.shape[1]], w, 512) for w in ws],
        "(W x^T)^T": lambda: [_transposed_mm(xs[w.shape[1]], w) for w in ws],
    }
    ref = fns["plain"]()
    outs = {name: fn() for name, fn in fns.items()}
    same = {n: all(torch.equal(a, b) for a, b in zip(ref, o, strict=True)) for n, o in outs.items()}
    diff = {n: max((a - b).abs().max().item() for a, b in zip(ref, o, strict=True)) for n, o in outs.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_median_ms(fn, reps))
    pool.shutdown()
    return {
        n: {"median_ms": statistics.median(t), "ms": t, "equal_to_plain": same[n], "max_abs_diff": diff[n]}
        for n, t in times.items()
    }


def warm_head(reps: int) -> dict:
    w, x = torch.randn(8192, 512), torch.randn(32, 512)
    return {
        "plain_ms": _median_ms(lambda: F.linear(x, w), reps),
        "blocks_1024_ms": _median_ms(lambda: _blocked_mm(x, w, 1024), reps),
        "transposed_ms": _median_ms(lambda: _transposed_mm(x, w), reps),
    }


def _blocked_forward(self, x, block):
    if torch.is_grad_enabled() or (block and self.weight.shape[0] <= block):
        return F.linear(x, self.weight, self.bias)
    x2 = x.reshape(-1, x.shape[-1])
    out = _blocked_mm(x2, self.weight, block) if block else _transposed_mm(x2, self.weight)
    if self.bias is not None:
        out += self.bias
    return out.reshape(*x.shape[:-1], -1)


def sampler_ab(rounds: int) -> dict:
    from transformers import LlamaForCausalLM

    from rloo.experiments.bench_assets import SHAPES, llama_config
    from rloo.modeling.attention import use_rloo_attention
    from rloo.rollout import sampler

    torch.manual_seed(0)
    model = use_rloo_attention(LlamaForCausalLM(llama_config(SHAPES["M"], vocab_size=8192, tied=False))).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 8192, (8, 48), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    for row, pad in enumerate(torch.randint(0, 33, (8,), generator=g).tolist()):
        mask[row, :pad] = False
    ids = ids.masked_fill(~mask, 0)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]

    def use(block):
        for m in linears:
            m.forward = (
                types.MethodType(torch.nn.Linear.forward, m)
                if block is None
                else types.MethodType(lambda self, x, b=block: _blocked_forward(self, x, b), m)
            )

    def run():
        gen = torch.Generator().manual_seed(0)
        return sampler.sample_tokens(
            model, ids, mask, Sampling(64, ids.shape[1]), eos_id=-1, pad_id=0, k=4, generator=gen, rows=(0, 32),
            few_rows=False,  # the variants below patch the linears themselves
        )  # fmt: skip

    variants = {"plain": None, "512-column blocks": 512, "1024-column blocks": 1024, "(W x^T)^T": 0}
    times: dict[str, list[float]] = {n: [] for n in variants}
    outs = {}
    for b in variants.values():  # warm-up
        use(b)
        run()
    names = list(variants)
    for r in range(rounds):  # the order reversed every other round: a fixed order once read 0.88x, reversed 0.96x
        for n in names if r % 2 == 0 else names[::-1]:
            b = variants[n]
            use(b)
            t = time.perf_counter()
            outs[n] = run()
            times[n].append(time.perf_counter() - t)
    use(None)
    plain = times["plain"]
    return {
        n: {
            "median_s": statistics.median(t),
            "s": t,
            "rounds_faster_than_plain": sum(a < b for a, b in zip(t, plain, strict=True)),
            "same_tokens": torch.equal(outs[n][0], outs["plain"][0]),
        }
        for n, t in times.items()
    }


def main() -> None:
    args = script_args(__doc__, threads=2, reps=20, rounds=7)
    torch.set_num_threads(args.threads)
    res = {
        "torch": torch.__version__,
        "threads": args.threads,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    res["cold_sweep"] = cold = cold_sweep(args.threads, args.reps)
    print(f"cold sweep of {cold['weights_mb']:.0f} MB of weights; summing them: {cold['sum_ms']:.2f} ms", end="")
    print(f" ({cold['sum_gb_s']:.1f} GB/s)")
    for key, r in cold.items():
        if isinstance(r, dict):
            rate = f"{r['gflop_s']:5.0f} GFLOP/s  {r['weight_gb_s']:5.1f} GB/s of weights"
            print(f"  {key:20s}: {r['ms']:7.2f} ms  {rate}")
    res["variants_32_rows"] = var = variants_32_rows(args.threads, args.reps, args.rounds)
    for name, r in var.items():
        same = f"equal to plain: {r['equal_to_plain']} (max |diff| {r['max_abs_diff']:.1e})"
        print(f"  32 rows, {name:36s}: median {r['median_ms']:.2f} ms  {same}")
    res["warm_head_32_rows"] = head = warm_head(args.reps * 5)
    print(f"warm LM head (32 x 512 -> 8192, one matrix repeated): plain {head['plain_ms']:.2f} ms,", end="")
    print(f" 1024-column blocks {head['blocks_1024_ms']:.2f} ms, (W x^T)^T {head['transposed_ms']:.2f} ms")
    res["sampler_m"] = smp = sampler_ab(args.rounds)
    for name, r in smp.items():
        runs = ", ".join(f"{t:.2f}" for t in r["s"])
        wins = f"faster than plain in {r['rounds_faster_than_plain']}/{len(r['s'])} rounds"
        same = f"same tokens: {r['same_tokens']}"
        print(f"  M rollout, {name:20s}: median {r['median_s']:.2f} s (runs {runs}); {wins}; {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
