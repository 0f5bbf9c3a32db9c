"""Forward passes that compute each prompt ONCE per group of K completions.

The rows of an RLOO batch come in groups of K that share one prompt (rows k*i .. k*i+K-1).
The plain passes in `rloo.modeling.forward` run the transformer over all N = B*K (prompt, completion)
sequences, so every prompt is computed K times, forward and backward. Here the B distinct
prompts run once with a KV cache; the cache's key/value tensors are repeated for the K rows of
each group (an indexing op under autograd: the K completions' gradients with respect to the
prompt's keys/values are summed back into the single copy), and the completions then
run against it with position ids that continue from the prompt. Every completion token sees
exactly the keys/values it would see in the joined sequence, so the results are the same
computation up to float rounding (tests/equivalence/test_fastpath.py checks log-probs, scores and
parameter gradients against `rloo.modeling.forward`).

Cost, per layer: prompt tokens B*P instead of N*P; the completion tokens still attend to P+T
keys each, so only the attention over the prompt is not shared.

Gradient checkpointing: transformers drops the cache inside checkpointed layers, which would run
the completions without their prompt; these passes checkpoint each decoder layer themselves with
the prompt's keys/values kept (`rloo.modeling.layer_checkpoint`), an exact computation. A model that cannot
be checkpointed that way is refused here; `rloo.modeling.logprob_pass.policy_logprobs` gives it the
plain pass (one logged line).

Grouped attention (rloo.modeling.kvcache.GroupedPassLayer, rloo.modeling.attention.grouped_attention):
where it pays (long prompts, a CPU model on rloo_sdpa) the passes run in buckets of whole groups
(bucketed by each group's longest row) and do not repeat the prompt's keys/values at all: each
group's k rows attend to the one copy, whose gradient the attention's matmuls sum over the k rows.
Same attention, summed in another order.

Little compute on completion padding: the completions run in buckets of similar length
(`rloo.data.buckets.length_buckets`), each padded only to its own longest row; a bucket's rows
take their prompts' keys/values from the B-row cache by that same indexing.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache

from rloo.core.logprobs import token_logprobs
from rloo.core.truncation import Truncation
from rloo.data.buckets import BUCKET_OVERHEAD_TOKENS, length_buckets
from rloo.data.collate import position_ids, trim_left
from rloo.modeling.cache_layers import kv
from rloo.modeling.forward import (
    MAX_LOGITS_MB,
    lm_token_logprobs,
    reward_backbone,
    score_head,
)
from rloo.modeling.kvcache import Prefill, cache_kwarg, grouped_ok, grouped_pass_cache, prefill_prompts
from rloo.modeling.layer_checkpoint import cache_keeping_checkpointing, prefix_cache, supports_shared_checkpointing


def group_prompts(prompt_ids: Tensor, prompt_mask: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The B distinct prompts of a batch whose rows come in groups of k. (N,P) -> (B,P).

    Raises ValueError when the rows are not grouped (a silent mismatch would train on the
    wrong prompt's keys/values)."""
    N, P = prompt_ids.shape
    if k < 1 or N % k:
        raise ValueError(f"{N} rows cannot be split into groups of k={k}")
    ids, mask = prompt_ids.view(-1, k, P), prompt_mask.view(-1, k, P)
    if not (bool((ids == ids[:, :1]).all()) and bool((mask == mask[:, :1]).all())):
        raise ValueError(f"rows are not grouped by prompt in runs of k={k}; use the plain forward pass")
    return trim_left(ids[:, 0], mask[:, 0])


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor, prompt_of: Tensor) -> tuple[Tensor, Tensor]:
    """The B distinct prompts of rows in any order, row r's being prompt prompt_of[r] (n,) of
    0..B-1 (each used). (n,P) -> (B,P). Raises ValueError when two rows of one prompt differ."""
    B, n = int(prompt_of.max()) + 1, prompt_of.numel()
    first = torch.full((B,), n, device=prompt_of.device).scatter_reduce(
        0, prompt_of, torch.arange(n, device=prompt_of.device), "amin"
    )
    ids, mask = prompt_ids[first], prompt_mask[first]
    if not (bool((ids[prompt_of] == prompt_ids).all()) and bool((mask[prompt_of] == prompt_mask).all())):
        raise ValueError("rows said to share a prompt have different prompts; use the plain forward pass")
    return trim_left(ids, mask)


def _group_rows(cache: DynamicCache, groups: Tensor) -> DynamicCache:
    """A new cache whose row r is row groups[r] of `cache` (B prompts -> n rows). Indexing is an
    autograd op: the gradients of a prompt's copies are summed back into its single copy. Its layers
    are PrefixLayers, so a checkpointed layer's replay in backward sees the same keys/values."""
    return prefix_cache([(keys[groups], values[groups]) for keys, values in map(kv, cache.layers)])


def _buckets(lengths: Tensor, k: int, grouped: bool, overhead: int | None) -> list[Tensor]:
    """The passes' row buckets: rows of similar length (`length_buckets`), or, for grouped attention,
    whole groups of k rows bucketed by each group's longest row (a group's shorter rows ride along
    padded; rows of length 0 in such a group too, their outputs unused)."""
    if not grouped:
        return length_buckets(lengths, overhead)
    if overhead is None:
        overhead = BUCKET_OVERHEAD_TOKENS.get(lengths.device.type, BUCKET_OVERHEAD_TOKENS["cuda"])
    # length_buckets costs a bucket n x longest + overhead; here n counts groups of k rows
    groups = length_buckets(lengths.view(-1, k).amax(1), -(-overhead // k))
    return [(g[:, None] * k + torch.arange(k, device=g.device)).reshape(-1) for g in groups]


def whole_groups(rows: Tensor, k: int) -> Tensor | None:
    """The prompt of each run of k rows when `rows` (sorted row indices of a batch grouped by prompt
    in runs of k) is whole groups in order, e.g. [4,5,6,7, 12,13,14,15] -> [1, 3] for k=4; else None."""
    if k < 2 or len(rows) % k:
        return None
    runs = rows.view(-1, k)
    if bool((runs[:, 0] % k).any()) or not bool((runs == runs[:, :1] + torch.arange(k, device=rows.device)).all()):
        return None
    return runs[:, 0] // k


def _bucket_cache(
    cache: DynamicCache, rows: Tensor, prompts_of_rows: Tensor, k: int, grouped: bool
) -> tuple[DynamicCache, dict]:
    """The prompt cache for a bucket's rows (whose prompts are `prompts_of_rows`), and the extra
    model inputs it needs: grouped (one copy per prompt) when asked for and the bucket is whole
    groups in order, else each row's own copy."""
    prompts = whole_groups(rows, k) if grouped else None
    if prompts is None:
        return _group_rows(cache, prompts_of_rows), {}
    pass_cache = grouped_pass_cache(cache, prompts, k)
    return pass_cache, {"rloo_grouped": pass_cache}


def _reuse(prefill: Prefill, p_ids: Tensor, p_mask: Tensor) -> Prefill:
    if prefill.ids.shape != p_ids.shape or not bool((prefill.ids == p_ids).all() & (prefill.mask == p_mask).all()):
        raise ValueError("the given prefill was made for other prompts")
    return prefill


def _continued(model, cache, full_mask: Tensor, ids: Tensor) -> dict:
    """Inputs that run `ids` (N,L) after the cached prompt; full_mask (N, P+L) covers prompt and ids."""
    pos = position_ids(full_mask)[:, full_mask.shape[1] - ids.shape[1] :]
    return dict(
        input_ids=ids, attention_mask=full_mask.long(), position_ids=pos, use_cache=True, **{cache_kwarg(model): cache}
    )


def completion_logprobs_shared(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    k: int,
    temperature: float = 1.0,
    prefill: Prefill | None = None,
    bucket_overhead: int | None = None,
    max_logits_mb: float = MAX_LOGITS_MB,
    truncation: Truncation | None = None,
    prompt_of: Tensor | None = None,
) -> Tensor:
    """Same as `rloo.modeling.forward.completion_logprobs`, prompts computed once per group of k.
    (N,P),(N,P),(N,T),(N,T) -> (N,T). Values at masked positions are meaningless. prompt_of (N,):
    rows in any order (a minibatch of random rows), row r's prompt being the prompt_of[r]-th
    distinct one (`distinct_prompts`), each computed once; None: runs of k rows share a prompt.

    Completion token 0 is predicted by the prompt's last position (one logit row per prompt,
    repeated k times); token t >= 1 by completion position t-1, so the last completion token
    is never fed in. `prefill`: this model's pass over these prompts, already made (with autograd
    on, when gradients are wanted) and unchanged since; it is reused instead of recomputed."""
    if prompt_of is None:
        p_ids, p_mask = group_prompts(prompt_ids, prompt_mask, k)
    else:
        p_ids, p_mask = distinct_prompts(prompt_ids, prompt_mask, prompt_of)
    if not supports_shared_checkpointing(model):  # policy_logprobs takes the plain pass for such a model
        raise ValueError(
            f"gradient checkpointing of {type(model).__name__} cannot keep the prompt's KV cache: "
            "use the plain pass (rloo.modeling.forward.completion_logprobs)"
        )
    kept = _reuse(prefill, p_ids, p_mask) if prefill is not None else None
    with cache_keeping_checkpointing(model):
        return _shared_logprobs(
            model,
            p_ids,
            p_mask,
            completion_ids,
            completion_mask,
            k,
            temperature,
            kept,
            bucket_overhead,
            max_logits_mb,
            truncation,
            prompt_of,
        )


def _shared_logprobs(
    model, p_ids, p_mask, completion_ids, completion_mask, k, temperature, prefill, bucket_overhead, max_mb, trunc, of
) -> Tensor:
    """completion_logprobs_shared on the B distinct prompts (B,P) -> (N,T); trunc: `token_logprobs`'s
    truncation; of: its prompt_of (None: runs of k)."""
    pre = prefill if prefill is not None else prefill_prompts(model, p_ids, p_mask)
    last = pre.last_logits[:, None].float()
    last = last.repeat_interleave(k, dim=0) if of is None else last[of]
    first = token_logprobs(last, completion_ids[:, :1], temperature=temperature, truncation=trunc)
    N, T = completion_ids.shape
    rest = first.new_zeros(N, T - 1)
    fed = (completion_mask.sum(-1) - 1).clamp(min=0)  # tokens fed: all but the last of each completion
    grouped = of is None and grouped_ok(model, pre.cache, k)  # grouped attention needs runs of k
    for rows in _buckets(fed, k, grouped, bucket_overhead):
        W, groups = int(fed[rows].max()), rows // k if of is None else of[rows]
        full = torch.cat([p_mask[groups], completion_mask[rows, :W]], dim=1)
        cache, extra = _bucket_cache(pre.cache, rows, groups, k, grouped)
        inputs = _continued(model, cache, full, completion_ids[rows, :W]) | extra
        lp = lm_token_logprobs(model, completion_ids[rows, 1 : W + 1], temperature, max_mb, trunc=trunc, **inputs)
        rest = rest.index_put((rows[:, None], torch.arange(W, device=rows.device)[None]), lp)
    return torch.cat([first, rest], dim=1)


def reward_scores_shared(
    reward_model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    k: int,
    bucket_overhead: int | None = None,
) -> Tensor:
    """Same as `rloo.modeling.forward.reward_scores`, prompts computed once per group of k. -> (N,).

    Pooled at the last real token: completion position len-1, or the prompt's last token for an
    empty completion."""
    backbone = reward_backbone(reward_model)
    p_ids, p_mask = group_prompts(prompt_ids, prompt_mask, k)
    cache = prefix_cache()
    out = backbone(
        input_ids=p_ids,
        attention_mask=p_mask.long(),
        position_ids=position_ids(p_mask),
        use_cache=True,
        **{cache_kwarg(backbone): cache},
    )
    pooled = out.last_hidden_state[:, -1].repeat_interleave(k, dim=0)  # (N,H)
    lengths = completion_mask.sum(-1)
    grouped = grouped_ok(backbone, cache, k)
    for rows in _buckets(lengths, k, grouped, bucket_overhead):
        W, groups = int(lengths[rows].max()), rows // k
        full = torch.cat([p_mask[groups], completion_mask[rows, :W]], dim=1)
        rows_cache, extra = _bucket_cache(cache, rows, groups, k, grouped)
        hidden = backbone(**_continued(backbone, rows_cache, full, completion_ids[rows, :W]), **extra)
        hidden = hidden.last_hidden_state
        filled = lengths[rows] > 0  # an empty completion keeps the prompt's pooled state
        at = torch.arange(len(rows), device=rows.device)[filled]
        pooled = pooled.index_put((rows[filled],), hidden[at, lengths[rows][filled] - 1])
    return score_head(reward_model, pooled)
