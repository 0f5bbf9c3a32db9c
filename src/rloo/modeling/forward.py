"""Model forward passes over the shared (left-padded prompt, right-padded completion) layout."""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.core.logprobs import fp32_linear, head_token_logprobs, token_logprobs
from rloo.core.truncation import Truncation
from rloo.data.collate import position_ids

# The largest float32 (positions x vocabulary) logits a log-prob pass may hold at once; above it
# the LM head runs in chunks of this size with its logits recomputed in backward
# (head_token_logprobs; its temporaries peak at about twice a chunk).
MAX_LOGITS_MB = 256
# Architectures whose logits are exactly lm_head(last hidden state): no scaling or soft-capping.
PLAIN_HEAD = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def plain_head(model):
    """The model's LM head (a Linear) when its logits are exactly head(hidden), else None (other
    architectures, wrappers such as DDP/FSDP/PEFT: they keep the model's own forward, whose head
    computes in fp32 under autocast when rloo loaded the model: rloo.modeling.fp32_head)."""
    if type(model).__name__ not in PLAIN_HEAD:
        return None
    head = model.get_output_embeddings()
    return head if type(head) is torch.nn.Linear else None


def reward_backbone(reward_model) -> torch.nn.Module:
    """The transformer under a reward model's score head, by transformers' `base_model_prefix` name.
    (A third-party object; not `.base_model`, which a PEFT wrapper defines as its own.)"""
    # getattr: third-party: transformers names the backbone attribute by base_model_prefix
    return getattr(reward_model, reward_model.base_model_prefix)


def head_logits(hidden: Tensor, head: torch.nn.Linear) -> Tensor:
    """The float32 logits head(hidden) (..., H) -> (..., V): under autocast the head's product runs in
    fp32 (`fp32_linear`, as a loaded model's head does inside a wrapper: rloo.modeling.fp32_head), so
    log-probs are taken from fp32 logits, not bf16-rounded ones; without autocast the head's own
    forward (rloo.modeling.few_rows may have swapped it), as the model runs it."""
    if torch.is_autocast_enabled(hidden.device.type):
        return fp32_linear(hidden, head.weight, head.bias)
    return head(hidden).float()


def lm_logits(model, keep: int, **inputs):
    """(float32 logits of the last `keep` >= 1 positions of model(**inputs) (N, keep, V), the output
    that holds its cache): the one place the log-prob passes (sampler prefill and decode, plain,
    shared) compute logits. A plain head (`plain_head`) runs on the backbone's hidden states through
    `head_logits` (fp32 under autocast); any other model (DDP/FSDP/PEFT wrappers, other architectures)
    gives its own logits, upcast: fp32 products under autocast too where its head has the fp32 forward
    (`rloo.modeling.fp32_head.use_fp32_heads`, which rloo's loaders apply), else bf16-rounded."""
    head = plain_head(model)
    if head is None:
        out = model(**inputs, logits_to_keep=keep)
        return out.logits.float(), out
    out = model.base_model(**inputs)  # a PLAIN_HEAD architecture: transformers' backbone property
    # the slice transformers' ForCausalLM takes for logits_to_keep: the same product, so fp32 runs keep their bits
    return head_logits(out.last_hidden_state[:, -keep:, :], head), out


def chunked_head(model, positions: int, max_logits_mb: float = MAX_LOGITS_MB):
    """(head, chunk positions) when `positions` rows of float32 logits exceed max_logits_mb and the
    model's head is plain, so log-probs should go through `head_token_logprobs`; else None."""
    head = plain_head(model)
    if head is None or positions * head.weight.shape[0] * 4 <= max_logits_mb * 2**20:
        return None
    return head, max(1, int(max_logits_mb * 2**20 // (4 * head.weight.shape[0])))


def lm_token_logprobs(
    model,
    targets: Tensor,
    temperature: float = 1.0,
    max_logits_mb: float = MAX_LOGITS_MB,
    skip_last: bool = False,
    trunc: Truncation | None = None,
    **inputs,
) -> Tensor:
    """log pi(targets) predicted by the last W positions of model(**inputs) (the W before the
    last one with skip_last). targets (N,W) -> (N,W).

    When the (N, W, V) float32 logits would exceed max_logits_mb and the model's head is plain,
    the backbone's hidden states go through `head_token_logprobs` in chunks of that size, so no
    (N, W, V) tensor exists in forward or backward; otherwise the logits of `lm_logits`. Either way a
    plain head computes in fp32 under autocast. trunc: the top-k/top-p truncated distribution's
    log-probs (rloo.core.truncation)."""
    N, W = targets.shape
    keep, chunked = W + int(skip_last), chunked_head(model, N * W, max_logits_mb)
    if chunked is None:
        logits = lm_logits(model, keep, **inputs)[0]
        return token_logprobs(logits[:, :W], targets, temperature=temperature, truncation=trunc)
    head, chunk = chunked
    hidden = model.base_model(**inputs).last_hidden_state[:, -keep:][:, :W]  # a PLAIN_HEAD model (chunked_head)
    return head_token_logprobs(hidden, head.weight, head.bias, targets, temperature, chunk=chunk, truncation=trunc)


def _joined(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor):
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    return ids, mask, position_ids(mask)


def completion_logprobs(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float = 1.0,
    max_logits_mb: float = MAX_LOGITS_MB,
    truncation: Truncation | None = None,
) -> Tensor:
    """log pi(y_t | x, y_<t) for every completion token (log pi_K with `truncation`). (N,P),(N,P),(N,T),(N,T) -> (N,T).

    Only the logits that predict completion tokens are computed (`logits_to_keep`), so the LM
    head never runs over prompt positions. Values at masked positions are meaningless; mask them.
    Large vocabularies: see `lm_token_logprobs` (max_logits_mb).
    """
    ids, mask, pos = _joined(prompt_ids, prompt_mask, completion_ids, completion_mask)
    # The logit at position P-1+t predicts completion token t: the last T+1 positions but the final one.
    return lm_token_logprobs(
        model,
        completion_ids,
        temperature,
        max_logits_mb,
        skip_last=True,
        trunc=truncation,
        input_ids=ids,
        attention_mask=mask.long(),
        position_ids=pos,
        use_cache=False,
    )


def reward_scores(
    reward_model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor
) -> Tensor:
    """Scalar reward of each (prompt, completion): the one-output head applied at the last real
    token (the EOS when there is one). (N,P),(N,P),(N,T),(N,T) -> (N,).

    The pooling index is computed from the masks rather than by searching for pad tokens, so it
    stays right when pad == eos or when a completion is empty.
    """
    ids, mask, pos = _joined(prompt_ids, prompt_mask, completion_ids, completion_mask)
    backbone = reward_backbone(reward_model)
    hidden = backbone(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False).last_hidden_state
    last = prompt_ids.shape[1] - 1 + completion_mask.sum(-1)  # (N,)
    pooled = hidden[torch.arange(ids.shape[0], device=ids.device), last]
    return score_head(reward_model, pooled)


def score_head(reward_model, pooled: Tensor) -> Tensor:
    """The one-output head on pooled hidden states, in fp32 with autocast off. (N,H) -> (N,).

    Under bf16 autocast the head's output would be rounded to 8 bits (scores of ~10 to steps of
    0.06): near-equal scores tie, and zero-variance filtering, the leave-one-out baseline and win
    rates see the ties. One (N,H)x(H,1) product: fp32 costs nothing here."""
    head = reward_model.score
    if type(head) is not torch.nn.Linear:  # a PEFT wrapper, say: its own forward, whose Linear keeps
        return head(pooled).squeeze(-1).float()  # the fp32 forward of a loaded model (rloo.modeling.fp32_head)
    return fp32_linear(pooled, head.weight, head.bias).squeeze(-1)
