"""The online methods compared with RLOO. Each is a step function (plus, when it keeps something
between batches, a small state object the checkpoint saves); the loop in rloo.recipes.online is
shared. `make_algorithm(cfg, models)` picks one by `cfg.algorithm`. DPO is offline: rloo.recipes.dpo.

    algorithm    advantage                                   loss
    rloo         leave-one-out over K samples (eq. 4)        -A log pi(y|x) (eq. 5)
    reinforce    R - moving average of past R (eq. 3)        -A log pi(y|x)
    vanilla_pg   GAE(gamma, lambda=1) with a value model     -A_t log pi(y_t|.), no ratio, no clip
    ppo          GAE(gamma, lambda) with a value model       clipped surrogate, several epochs
    grpo         (R - group mean) / group std                clipped surrogate + beta k3-KL in loss
    raft         keep argmax_k R                             SFT on the kept samples
    dr_grpo      R - group mean (no std)                     clipped surrogate + k3-KL, token sum / constant
    reinforce_pp (G_t - batch mean) / batch std, G_t the      clipped surrogate, token mean
                 score minus the KL-to-go
"""

from __future__ import annotations

from rloo.algorithms.common import Stateless
from rloo.config import RLConfig


def make_algorithm(cfg: RLConfig, models):
    """The step (and state) of cfg.algorithm: an object with step(models, opt, prompts, cfg, gen),
    state_dict() and load_state_dict(state)."""
    name = cfg.algorithm
    if name == "rloo":
        from rloo.algorithms.rloo_ablations import is_plain_rloo, rloo_ablation_step
        from rloo.recipes.rl import rloo_step
        return Stateless(rloo_step if is_plain_rloo(cfg) else rloo_ablation_step)
    if name == "reinforce":
        from rloo.algorithms.reinforce import Reinforce
        return Reinforce(cfg)
    if name in ("ppo", "vanilla_pg"):
        from rloo.algorithms.ppo import PPO
        return PPO(cfg, models, vanilla=name == "vanilla_pg")
    if name == "grpo":
        from rloo.algorithms.grpo import grpo_step
        return Stateless(grpo_step)
    if name == "raft":
        from rloo.algorithms.raft import raft_step
        return Stateless(raft_step)
    if name in ("dr_grpo", "reinforce_pp"):
        from rloo.algorithms.dr_grpo import dr_grpo_step
        from rloo.algorithms.reinforce_pp import reinforce_pp_step
        return Stateless(dr_grpo_step if name == "dr_grpo" else reinforce_pp_step)
    raise ValueError(f"{name!r} is not an online method (dpo runs through rloo.recipes.dpo)")


__all__ = ["make_algorithm"]
