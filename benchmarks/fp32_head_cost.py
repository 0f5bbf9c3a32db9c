"""The fp32 LM head under bf16 autocast for a wrapped policy (issue 34, rloo.modeling.fp32_head), before
and after, side by side in one process on this CPU (docs/precision.md):

1. step-0 KL and first PPO ratio: a policy under DDP (a one-rank gloo group, as `torchrun` would wrap it)
   against its frozen, unwrapped copy (rloo's reference), the sampler running the unwrapped module (as
   rloo's loop does). "bf16 head" removes the heads' fp32 forward, which is the code before this change.
2. the head's cost: one log-prob pass of the wrapped policy (no_grad, the reference / old-policy pass; and
   forward + backward, the training pass) with the head in bf16 or in fp32, alternated, median of --reps
   (CPU time of the process on one thread, and wall time), for large vocabularies on a small body; fp32
   throughout beside them.

    PYTHONPATH=src python benchmarks/fp32_head_cost.py [--reps 7] [--threads 1]

The model is a random Llama, H=256, 2 layers, its head drawn N(0, 0.25^2) so that logits spread like a
trained model's (std ~4 after the final RMSNorm) rather than the near-uniform ones of a fresh init.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import LlamaConfig, LlamaForCausalLM

from rloo.modeling.attention import use_rloo_attention
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.fp32_head import fp32_head_forward, is_fp32_head, use_fp32_heads
from rloo.rollout.sampler import sample

H, LAYERS = 256, 2


def _policy(vocab: int):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=H, intermediate_size=688, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, pad_token_id=0,
                      eos_token_id=1, bos_token_id=None, tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.25)
    return use_fp32_heads(use_rloo_attention(model))  # as rloo.modeling.loading does


def _set_head(model, fp32: bool) -> None:
    """The LM head's fp32 forward on (this change) or off (the code before it)."""
    head = model.get_output_embeddings()
    if fp32 and not is_fp32_head(head):
        head.forward = fp32_head_forward.__get__(head)
    elif not fp32 and is_fp32_head(head):
        del head.forward


def step0(vocab: int, B=8, P=32, k=4, T=32) -> dict:
    inner = _policy(vocab)
    ref = copy.deepcopy(inner).eval().requires_grad_(False)
    policy = DDP(inner)
    g = torch.Generator().manual_seed(1)
    ids, mask = torch.randint(2, vocab, (B, P), generator=g), torch.ones(B, P, dtype=torch.bool)
    out = {}
    for name, fp32 in (("bf16 head", False), ("fp32 head", True)):
        _set_head(inner, fp32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c_ids, c_mask, lps = sample(inner.eval(), ids, mask, max_new_tokens=T, eos_id=1, pad_id=0, k=k,
                                        generator=torch.Generator().manual_seed(2))  # fmt: skip
            p_ids, p_mask = ids.repeat_interleave(k, 0), mask.repeat_interleave(k, 0)
            with torch.no_grad():
                lp_pol = completion_logprobs(policy, p_ids, p_mask, c_ids, c_mask)
                lp_ref = completion_logprobs(ref, p_ids, p_mask, c_ids, c_mask)
        m, d = c_mask, (lp_pol - lp_ref)
        out[name] = {"tokens": int(m.sum()), "step0_kl_k1_mean": float(d[m].mean()),
                     "step0_logprob_max_abs": float(d[m].abs().max()),
                     "first_ratio_max_dev": float((lp_pol - lps)[m].exp().sub(1).abs().max())}  # fmt: skip
    return out


def _time(fn) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds): on one thread the CPU time is the work done, which
    other processes on the cores do not inflate as they do the wall time (only the caches they share)."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - t0


def cost(vocab: int, reps: int, N=16, P=32, T=64) -> dict:
    inner = _policy(vocab)
    policy = DDP(inner)
    g = torch.Generator().manual_seed(3)
    p_ids, c_ids = torch.randint(2, vocab, (N, P), generator=g), torch.randint(2, vocab, (N, T), generator=g)
    p_mask, c_mask = torch.ones_like(p_ids, dtype=torch.bool), torch.ones_like(c_ids, dtype=torch.bool)

    def no_grad():
        with torch.no_grad():
            completion_logprobs(policy, p_ids, p_mask, c_ids, c_mask)

    def train():
        policy.zero_grad(set_to_none=True)
        completion_logprobs(policy, p_ids, p_mask, c_ids, c_mask)[c_mask].sum().backward()

    arms = {"bf16 head": (True, False), "fp32 head": (True, True), "fp32 throughout": (False, True)}
    times = {(a, p): [] for a in arms for p in ("no_grad", "train")}
    for _ in range(reps + 1):  # the first round warms up and is dropped
        for arm, (autocast, fp32) in arms.items():
            _set_head(inner, fp32)
            for part, fn in (("no_grad", no_grad), ("train", train)):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    times[arm, part].append(_time(fn))
    return {
        f"{arm} {part} ms ({kind})": round(1e3 * statistics.median(x[i] for x in t[1:]), 1)
        for (arm, part), t in times.items()
        for i, kind in enumerate(("cpu", "wall"))
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/rdzv", rank=0, world_size=1)
        try:
            report = {"threads": args.threads, "reps": args.reps, "step0 (V=32000)": step0(32000)}
            for vocab in (32000, 50257):
                report[f"cost V={vocab} H={H} N*T=16*64"] = cost(vocab, args.reps)
        finally:
            dist.destroy_process_group()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
