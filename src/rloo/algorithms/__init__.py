"""The RL methods. Each is an Algorithm (algorithms/base.py): a step plus, when it keeps something
between batches, a state the checkpoint saves; the loop in rloo.training.loop is shared.
`make_algorithm(cfg, models)` picks one by `cfg.algorithm` from the registry (algorithms/registry.py);
`add_method(spec, step)` adds one (its rloo.config.MethodSpec table entry and its step; a spec that
names an advantage and a loss of rloo.core.estimators needs no step: algorithms/clipped_group.py).
DPO is offline: rloo.training.dpo.

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

from rloo.algorithms.base import Algorithm, Models, Stateless, guarded_step, score_rollout
from rloo.algorithms.registry import REGISTRY, STEPS, add_method, make_algorithm, supports_distributed

__all__ = [
    "Algorithm",
    "Models",
    "Stateless",
    "guarded_step",
    "score_rollout",
    "REGISTRY",
    "STEPS",
    "add_method",
    "make_algorithm",
    "supports_distributed",
]
