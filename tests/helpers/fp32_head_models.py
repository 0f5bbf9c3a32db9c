"""Causal LMs whose sublayers add exactly 0, so that under bf16 autocast only the output head (and the
log-softmax after it) can differ from fp32, of the head kinds rloo meets, saved and loaded back through
rloo's loader (which gives the heads their fp32 forward): tests/equivalence/test_fp32_head_wrapped.py.

Every layer's output projections (attention o_proj / dense / c_proj, MLP down_proj / fc2 / c_proj), weights
and biases, are zero: a sublayer then adds exactly 0 under any precision, and the hidden state entering
the head is norm(embedding), computed in fp32 with or without autocast (RMSNorm and LayerNorm keep fp32).
The head's weight is N(0, 0.5) and its bias (Phi's) N(0, 0.5): logits of ~4, which a bf16 product moves
by ~1e-2.
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PhiConfig,
    PhiForCausalLM,
)

V, H, PAD, EOS = 64, 64, 0, 1
OUT_PROJ = ("o_proj", "down_proj", "dense", "fc2", "c_proj")
SOFT_CAP = 5.0  # Gemma 2's final-logit soft cap, small enough that tanh bends logits of ~4


def _config(arch: str, tied: bool):
    common = dict(vocab_size=V, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None, tie_word_embeddings=tied)
    body = dict(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2, num_attention_heads=4)
    if arch == "llama":
        return LlamaForCausalLM, LlamaConfig(**body, num_key_value_heads=4, max_position_embeddings=64, **common)
    if arch == "gpt2":  # Conv1D body, an nn.Linear head, not a plain head by rloo's name list
        return GPT2LMHeadModel, GPT2Config(n_embd=H, n_layer=2, n_head=4, n_positions=64, **common)
    if arch == "phi":  # a head with a bias
        return PhiForCausalLM, PhiConfig(**body, max_position_embeddings=64, **common)
    if arch == "gemma2":  # logits = cap * tanh(head(h) / cap)
        cfg = Gemma2Config(**body, num_key_value_heads=4, head_dim=16, max_position_embeddings=64, **common)
        cfg.final_logit_softcapping, cfg.attn_logit_softcapping = SOFT_CAP, None
        return Gemma2ForCausalLM, cfg
    raise ValueError(arch)


def head_only_lm(path, arch: str = "llama", tied: bool = False):
    """The model described above, saved to `path` with a word tokenizer and loaded by
    `rloo.modeling.loading.load_policy` (fp32 weights)."""
    from rloo.modeling.loading import load_policy
    from rloo.tasks import get_task
    from rloo.tasks.tokenizer import build_tokenizer

    cls, cfg = _config(arch, tied)
    torch.manual_seed(0)
    model = cls(cfg).float()
    with torch.no_grad():
        for name, m in model.named_modules():
            if name.rsplit(".", 1)[-1] in OUT_PROJ:
                for p in m.parameters():
                    p.zero_()
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
        head = model.get_output_embeddings()
        head.weight.normal_(0.0, 0.5)
        if head.bias is not None:
            head.bias.normal_(0.0, 0.5)
    model.save_pretrained(path)
    build_tokenizer(get_task("summarize")).save_pretrained(path)
    return load_policy(str(path))[0].eval()


def abs_head(head, h: torch.Tensor) -> torch.Tensor:
    """sum_j |h_j W_vj| + |b_v| for each position and output v (..., V), through LoRA's pieces
    (base + scaling * B A) when the head carries an adapter: the magnitude its rounding scales with."""
    if type(head) is torch.nn.Linear:
        return h.abs() @ head.weight.abs().t() + (0.0 if head.bias is None else head.bias.abs())
    out = abs_head(head.base_layer, h)
    for name, a in head.lora_A.items():
        out = out + head.scaling[name] * (h.abs() @ a.weight.abs().t()) @ head.lora_B[name].weight.abs().t()
    return out


def head_input(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The hidden states entering the LM head in an fp32 forward over every position (N, L, H)."""
    head, seen = model.get_output_embeddings(), []
    hook = head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask.long(), use_cache=False)
        return seen[0]
    finally:
        hook.remove()


def head_scale(model, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """S = max over positions and outputs of `abs_head`, on the head's input in an fp32 forward."""
    return float(abs_head(model.get_output_embeddings(), head_input(model, ids, mask)).max())
