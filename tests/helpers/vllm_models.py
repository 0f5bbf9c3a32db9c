"""Tiny models that vLLM's CPU kernels run, and the checks of tests/integration/test_vllm.py.

tests/helpers/tiny_archs.py's models have head size 8; vLLM's CPU attention takes head sizes 32, 64,
80, ... only, so these are the same 2-layer configs at width 64 with 2 heads of 32 (GQA 2:1 where the
architecture has it). Their weights are drawn wider than Hugging Face's 0.02 (`INIT`) so that greedy
decoding has clear winners, which the greedy comparison needs (`decisive_prefix`)."""

from __future__ import annotations

import torch

from helpers.tiny_archs import CLASSES, perturb_vectors, tiny_config

WIDE = {
    "llama": dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32),
    "qwen2": dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32),
    "gpt2": dict(n_embd=64, n_head=2),
    "gpt_neox": dict(hidden_size=64, num_attention_heads=2),
}
INIT = 0.2
LAYERS = 2


def save_vllm_lm(path, arch: str, *, tied: bool = False, seed: int = 0):
    """A tiny `arch` LM vLLM runs on CPU, with the summarize task's word tokenizer, saved as a Hugging
    Face folder."""
    from rloo.tasks import get_task
    from rloo.tasks.tokenizer import build_tokenizer

    tok = build_tokenizer(get_task("summarize"))
    cfg = tiny_config(arch, tied=tied, tokenizer=tok)
    for key, value in WIDE[arch].items():
        setattr(cfg, key, value)
    cfg.initializer_range = INIT
    torch.manual_seed(seed)
    model = perturb_vectors(CLASSES[arch](cfg).float())
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def logit_bound(policy, ids: torch.Tensor, u: float, factor: float) -> float:
    """u * factor * S, S = max over positions and tokens v of sum_j |h_j W_vj| (h the final hidden
    state, W the head; tests/equivalence/test_precision.py's scale of a logit's rounding error),
    measured in fp32 on the sequence `ids` (1, L)."""
    with torch.no_grad(), torch.autocast(ids.device.type, enabled=False):
        h = policy(ids, output_hidden_states=True).hidden_states[-1][0].float()
    w = policy.get_output_embeddings().weight.detach().float()
    return u * factor * float((h.abs() @ w.abs().T).max())


def greedy(policy, prompt: list[int], steps: int, autocast) -> tuple[list[int], list[float]]:
    """The policy's own greedy tokens after `prompt` (EOS ignored), under `autocast` (the trainer's
    precision), with each step's margin between the best and the second-best logit."""
    ids = torch.tensor([prompt], device=policy.device)
    tokens, margins = [], []
    for _ in range(steps):
        with torch.no_grad(), autocast:
            z = policy(ids).logits[0, -1].float()
        top = z.topk(2)
        tokens.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids = torch.cat([ids, top.indices[:1][None]], 1)
    return tokens, margins


def decisive_prefix(margins: list[float], bound: float) -> int:
    """How many leading steps have a margin above 2 * bound (each engine's logits within `bound` of
    the exact ones, so the two cannot rank the best two differently): greedy tokens must agree
    there; after the first closer call they may part."""
    for t, m in enumerate(margins):
        if m <= 2 * bound:
            return t
    return len(margins)
