"""Peak memory of the policy's log-prob pass (forward + backward) with a large vocabulary, with
the LM head's logits held whole or in chunks (`max_logits_mb`, rloo.modeling.forward.lm_token_logprobs).

    python benchmarks/logits_memory.py            # prints a markdown table (docs/bench.md)

Each setting runs in its own process so that its peak RSS (VmHWM) is its own. The model is a
small Llama (hidden 64, 2 layers) with a 151,936-token vocabulary (Qwen2's), so the (N, T, V)
logits dominate: N = 32 completions of T = 128 tokens after 16-token prompts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

SETTINGS = [1e9, 1024, 256, 64]  # MB; 1e9: never chunk (the logits are held whole)


def worker(budget: float) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rloo.experiments.bench_machine import peak_rss_gb
    from rloo.modeling.forward import completion_logprobs

    torch.set_num_threads(2)
    torch.manual_seed(0)
    V, N, P, T = 151_936, 32, 16, 128
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    p_ids, c_ids = torch.randint(0, V, (N, P)), torch.randint(0, V, (N, T))
    ones = lambda n: torch.ones(N, n, dtype=torch.bool)  # noqa: E731
    before = peak_rss_gb()
    t0 = time.perf_counter()
    lp = completion_logprobs(model, p_ids, ones(P), c_ids, ones(T), max_logits_mb=budget)
    lp.sum().backward()
    return {
        "max_logits_mb": budget,
        "seconds": time.perf_counter() - t0,
        "peak_rss_gb": peak_rss_gb(),
        "rss_before_gb": before,
        "full_logits_gb": N * T * V * 4 / 1e9,
    }


def main() -> None:
    if len(sys.argv) > 1:
        print(json.dumps(worker(float(sys.argv[1]))))
        return
    rows = [
        json.loads(
            subprocess.run([sys.executable, __file__, str(b)], capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        for b in SETTINGS
    ]
    print(f"(N, T, V) float32 logits: {rows[0]['full_logits_gb']:.2f} GB\n")
    print("| max_logits_mb | peak RSS GB | model + inputs before the pass GB | fwd+bwd seconds |")
    print("|---|---|---|---|")
    for r in rows:
        name = "whole (no chunking)" if r["max_logits_mb"] >= 1e9 else f"{r['max_logits_mb']:.0f}"
        print(f"| {name} | {r['peak_rss_gb']:.2f} | {r['rss_before_gb']:.2f} | {r['seconds']:.2f} |")


if __name__ == "__main__":
    main()
