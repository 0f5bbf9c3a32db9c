"""The one entry point of the policy's log-prob pass: which pass runs is decided here, once.

Four passes give the same numbers (tests/equivalence/test_fastpath.py and test_gradient_matrix.py):
plain (`rloo.modeling.forward.completion_logprobs`: every (prompt, completion) in full), shared
(`rloo.modeling.forward_shared.completion_logprobs_shared`: each prompt once per group of k, or,
for a minibatch of random rows, once per distinct prompt among them),
prefilled (the shared pass reusing the sampler's prompt pass, `rloo.modeling.kvcache.Prefill`) and
wrapped (a DDP/FSDP-wrapped model: the plain pass, since the update must be one forward through the
wrapper); a model whose gradient checkpointing cannot keep the prompt's cache gets the plain pass
too. `policy_logprobs` chooses among them; the algorithms only say what they have.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.core.truncation import Truncation
from rloo.modeling.forward import MAX_LOGITS_MB, completion_logprobs
from rloo.modeling.forward_shared import completion_logprobs_shared
from rloo.modeling.kvcache import Prefill
from rloo.modeling.layer_checkpoint import supports_shared_checkpointing
from rloo.runtime.tracking.log import say_once


def policy_logprobs(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    k: int = 1,
    share: bool = False,
    wrapped: bool = False,
    prefill: Prefill | None = None,
    rows: Tensor | None = None,
    temperature: float = 1.0,
    max_logits_mb: float = MAX_LOGITS_MB,
    truncation: Truncation | None = None,
) -> Tensor:
    """log pi(y_t | x, y_<t) of every completion token. (N,P),(N,P),(N,T),(N,T) -> (N,T), or (n,T)
    for `rows` (n,) in that order. Values at masked positions are meaningless; mask them.

    The rows come in groups of k sharing a prompt. share: the run asked for the shared pass
    (rl.share_prompt); wrapped: the model is DDP/FSDP-wrapped; prefill: the policy's prompt pass
    kept from sampling (same weights), reused by the shared pass; rows: a subset (a minibatch):
    whole groups run as groups (sorted), other rows with each of their distinct prompts computed
    once (plain when no two share one). temperature, max_logits_mb, truncation: as
    `completion_logprobs`."""
    order = prompt_of = None
    if rows is not None:
        order = whole_groups_order(rows, k) if share and not wrapped else None
        if order is None and share and not wrapped:
            prompt_of = rows_prompts(rows, k)
        r = rows if order is None else rows[order]
        prompt_ids, prompt_mask, completion_ids, completion_mask = (
            t[r] for t in (prompt_ids, prompt_mask, completion_ids, completion_mask)
        )
        # a kept prompt pass holds every row, not these (and the weights may have moved since)
        share, prefill = order is not None or prompt_of is not None, None
    how = {"temperature": temperature, "max_logits_mb": max_logits_mb, "truncation": truncation}
    if share and k >= 2 and not wrapped and not supports_shared_checkpointing(model):
        say_once(
            f"gradient checkpointing of {type(model).__name__} cannot keep the prompt's KV cache: "
            "its policy pass runs every (prompt, completion) in full (share_prompt has no effect there)"
        )
        share = False
    if wrapped or not share or k < 2:  # plain; wrapped: one forward through the wrapper
        lp = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, **how)
    else:  # shared; prefilled when the sampler kept its prompt pass
        lp = completion_logprobs_shared(
            model,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            k=k,
            prefill=prefill,
            prompt_of=prompt_of,
            **how,
        )
    return lp if order is None else lp[order.argsort()]  # row j of lp is rows[order[j]]: back in order


def whole_groups_order(rows: Tensor, k: int) -> Tensor | None:
    """If `rows` (n,) are whole groups of a rollout with groups of k (rows k*i .. k*i+k-1 for some
    prompts i, in any order), the permutation that sorts them; else None."""
    if k < 2 or rows.numel() == 0 or rows.numel() % k:
        return None
    ordered, order = rows.sort()
    groups = ordered.view(-1, k)
    step = torch.arange(k, device=rows.device)
    return order if bool(((groups - groups[:, :1]) == step).all() & (groups[:, 0] % k == 0).all()) else None


def rows_prompts(rows: Tensor, k: int) -> Tensor | None:
    """For rows (n,) of a rollout with groups of k, in any order: which of their distinct prompts
    each row has (n,), e.g. [9, 2, 10, 0] -> [1, 0, 1, 0] for k=4; None when no two rows share a
    prompt (nothing to compute once) or k < 2."""
    if k < 2:
        return None
    distinct, prompt_of = (rows // k).unique(return_inverse=True)
    return prompt_of if distinct.numel() < rows.numel() else None
