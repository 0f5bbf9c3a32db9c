"""Model forward passes over the shared (left-padded prompt, right-padded completion) layout."""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.core.logprobs import token_logprobs
from rloo.data.collate import position_ids


def _joined(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor):
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask], dim=1)
    return ids, mask, position_ids(mask)


def completion_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(y_t | x, y_<t) for every completion token. (N,P),(N,P),(N,T),(N,T) -> (N,T).

    Only the logits that predict completion tokens are computed (`logits_to_keep`), so the LM
    head never runs over prompt positions. Values at masked positions are meaningless; mask them.
    """
    ids, mask, pos = _joined(prompt_ids, prompt_mask, completion_ids, completion_mask)
    T = completion_ids.shape[1]
    # The logit at position P-1+t predicts completion token t: keep the last T+1, drop the final one.
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False,
                   logits_to_keep=T + 1).logits[:, :-1]
    return token_logprobs(logits.float(), completion_ids, temperature=temperature)


def reward_scores(reward_model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                  completion_mask: Tensor) -> Tensor:
    """Scalar reward of each (prompt, completion): the one-output head applied at the last real
    token (the EOS when there is one). (N,P),(N,P),(N,T),(N,T) -> (N,).

    The pooling index is computed from the masks rather than by searching for pad tokens, so it
    stays right when pad == eos or when a completion is empty.
    """
    ids, mask, pos = _joined(prompt_ids, prompt_mask, completion_ids, completion_mask)
    backbone = getattr(reward_model, reward_model.base_model_prefix)
    hidden = backbone(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False).last_hidden_state
    last = prompt_ids.shape[1] - 1 + completion_mask.sum(-1)  # (N,)
    pooled = hidden[torch.arange(ids.shape[0], device=ids.device), last]
    return reward_model.score(pooled).squeeze(-1).float()
