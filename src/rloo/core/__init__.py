"""Pure tensor math for RLHF: advantages, KL, losses, log-probs. No I/O, no config objects."""

from .advantages import (
    gae,
    group_normalized,
    leave_one_out,
    moving_average_advantages,
    moving_average_update,
    whiten,
)
from .kl import kl_per_token, sequence_kl, shaped_reward, token_level_rewards
from .logprobs import (
    completion_mask,
    masked_mean,
    masked_sum,
    sequence_logprobs,
    token_logprobs,
)
from .losses import (
    bradley_terry_loss,
    dpo_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    raft_select,
    sft_loss,
    value_loss,
)

__all__ = [
    "bradley_terry_loss",
    "completion_mask",
    "dpo_loss",
    "gae",
    "group_normalized",
    "kl_per_token",
    "leave_one_out",
    "masked_mean",
    "masked_sum",
    "moving_average_advantages",
    "moving_average_update",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "raft_select",
    "sequence_kl",
    "sequence_logprobs",
    "sft_loss",
    "shaped_reward",
    "token_level_rewards",
    "token_logprobs",
    "value_loss",
    "whiten",
]
