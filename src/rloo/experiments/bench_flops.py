"""FLOPs one RL step executes, counted from the shapes (matmuls and attention, as torch's
FlopCounterMode counts them: a (m,k)@(k,n) matmul is 2mkn; attention is 4*q*kv*d per head,
the full rectangle, since the masked kernels compute it). tests/unit/test_bench_flops.py checks these
formulas against FlopCounterMode on real forward passes. Backward = 2x forward.

Running FlopCounterMode inside the benchmark itself slows a step 5-10x (Python per op), so the
benchmark counts from the step's padded shapes instead: prompt width P and completion width T of
the batch, as both trainers pad to them, and for rloo's shared passes the widths of its length
buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rloo.data.buckets import length_buckets


@dataclass(frozen=True)
class Arch:
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    kv_heads_ratio: float = 1.0  # num_key_value_heads / num_attention_heads

    @classmethod
    def of(cls, config) -> Arch:
        return cls(
            config.hidden_size,
            config.num_hidden_layers,
            config.intermediate_size,
            config.vocab_size,
            config.num_key_value_heads / config.num_attention_heads,
        )

    def linear(self, tokens: float) -> float:
        """q, o (h x h), k, v (h x h*ratio), gate/up/down MLP, per layer."""
        h = self.hidden
        return 2 * tokens * self.layers * (2 * h * h + 2 * h * h * self.kv_heads_ratio + 3 * h * self.intermediate)

    def attention(self, rows: float, q: float, kv: float) -> float:
        return 4 * rows * q * kv * self.hidden * self.layers

    def head(self, rows: float) -> float:
        return 2 * rows * self.hidden * self.vocab

    def forward(self, rows: float, q: float, kv: float, logits: float) -> float:
        """rows sequences of q new tokens attending to kv keys each, `logits` LM-head rows in total."""
        return self.linear(rows * q) + self.attention(rows, q, kv) + self.head(logits)


def decode(a: Arch, n: int, P: int, T: int) -> float:
    """T-1 single-token steps of n rows after a P-token prompt (the last token is not fed back)."""
    return sum(a.forward(n, 1, P + t, n) for t in range(1, T))


def bucketed(a: Arch, lengths: list[int], P: int, logits: bool) -> float:
    """Completion passes after a shared P-token prompt, run in length buckets as
    rloo.modeling.forward_shared runs them: each bucket is padded to its own longest row."""
    t = torch.tensor(lengths)
    total = 0.0
    for rows in length_buckets(t):
        n, W = len(rows), int(t[rows].max())
        total += a.forward(n, W, P + W, n * W if logits else 0)
    return total


def rloo_step_flops(
    a: Arch,
    B: int,
    K: int,
    P: int,
    T: int,
    share_prompt: bool = True,
    lengths: list[int] | None = None,
    reuse_prefill: bool = True,
) -> float:
    """rloo_step: sample (prefill + decode), reference and reward-model forward, policy forward+backward.
    Assumes a model without dropout (rloo reuses the sampling prefill only then). `lengths`: the
    N completion lengths, when known; the shared passes then run in length buckets. `reuse_prefill`
    False: the update runs its own prompt pass (max_staleness > 0: the producer sampled the batch)."""
    N = B * K
    if not share_prompt:
        plain = a.forward(N, P + T, P + T, N * T)
        return (
            a.forward(N, P, P, N)
            + decode(a, N, P, T)  # generation
            + plain
            + (plain - a.head(N * T))  # reference, reward model (no LM head)
            + 3 * plain
        )  # policy forward + backward
    prompt = a.forward(B, P, P, B)  # each prompt once, last logit only
    if lengths is None:
        lm = prompt + a.forward(N, T - 1, P + T - 1, N * (T - 1))  # completions after the shared prompt
        rm = a.forward(B, P, P, 0) + a.forward(N, T, P + T, 0)
    else:  # the last token is not fed to the LM
        lm = prompt + bucketed(a, [max(n - 1, 0) for n in lengths], P, logits=True)
        rm = a.forward(B, P, P, 0) + bucketed(a, lengths, P, logits=False)
    # the policy's prompt pass of sampling is kept (with its graph) for the update: its forward is not repeated
    return prompt + decode(a, N, P, T) + lm + rm + (lm - prompt) + 2 * lm + (0 if reuse_prefill else prompt)


def rloo_phase_flops(a: Arch, B: int, K: int, P: int, lengths: list[int]) -> dict[str, float]:
    """rloo_step_flops (shared prompt, known lengths, the prefill reused) split by phase: sampling (the
    prompt pass and decode), scoring (reference and reward model) and the update (the policy's completion
    pass after the kept prefill, and its backward, 2x the forward). T: the longest completion."""
    N, T = B * K, max(lengths)
    prompt = a.forward(B, P, P, B)
    lm = prompt + bucketed(a, [max(n - 1, 0) for n in lengths], P, logits=True)
    rm = a.forward(B, P, P, 0) + bucketed(a, lengths, P, logits=False)
    return {"sampling": prompt + decode(a, N, P, T), "scoring": lm + rm, "update": (lm - prompt) + 2 * lm}


def trl_step_flops(a: Arch, B: int, K: int, P: int, T: int) -> float:
    """TRL RLOOTrainer step: generate (prefill of N rows + decode), old-policy, reference and reward-model
    forward over the N joined sequences, then policy forward + backward (logits for T positions)."""
    N = B * K
    joined = a.forward(N, P + T, P + T, N * T)
    return a.forward(N, P, P, N) + decode(a, N, P, T) + 2 * joined + (joined - a.head(N * T)) + 3 * joined
