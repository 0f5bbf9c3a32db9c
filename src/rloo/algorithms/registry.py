"""One registry: algorithm name (rloo.config.ALGORITHMS, where the names are written) -> how to
build it, and whether it may run under torchrun (declared here, by the algorithm, so
rloo.runtime.distributed never needs to know which methods exist)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rloo.algorithms import rloo as rloo_module
from rloo.algorithms.base import Algorithm, Models, Stateless
from rloo.algorithms.dr_grpo import dr_grpo_step
from rloo.algorithms.grpo import grpo_step
from rloo.algorithms.ppo import PPO
from rloo.algorithms.raft import raft_step
from rloo.algorithms.reinforce import Reinforce
from rloo.algorithms.reinforce_pp import reinforce_pp_step
from rloo.algorithms.rloo_ablations import is_plain_rloo, rloo_ablation_step
from rloo.config import ONLINE_ALGORITHMS, RLConfig
from rloo.errors import RlooError


def _never(cfg: RLConfig) -> bool:
    return False


@dataclass(frozen=True)
class Entry:
    build: Callable[[RLConfig, Models], Algorithm]
    distributed: Callable[[RLConfig], bool] = _never  # may this configuration run under torchrun?


def _rloo(cfg: RLConfig, models: Models) -> Algorithm:
    # looked up on the module at build time, so a test can wrap rloo_step (tests/reliability)
    if is_plain_rloo(cfg):
        return Stateless(rloo_module.rloo_step, distributed=True)
    if cfg.off_policy_correction is not None:
        raise RlooError("max_staleness > 0 and is_correction take plain rloo (no ablation settings)")
    return Stateless(rloo_ablation_step)


def _rloo_distributed(cfg: RLConfig) -> bool:
    return is_plain_rloo(cfg) and cfg.max_staleness == 0  # the lagged sampler keeps one process's weights


REGISTRY: dict[str, Entry] = {
    "rloo": Entry(_rloo, distributed=_rloo_distributed),
    "reinforce": Entry(lambda cfg, models: Reinforce(cfg)),
    "vanilla_pg": Entry(lambda cfg, models: PPO(cfg, models, vanilla=True)),
    "ppo": Entry(lambda cfg, models: PPO(cfg, models)),
    "grpo": Entry(lambda cfg, models: Stateless(grpo_step)),
    "raft": Entry(lambda cfg, models: Stateless(raft_step)),
    "dr_grpo": Entry(lambda cfg, models: Stateless(dr_grpo_step)),
    "reinforce_pp": Entry(lambda cfg, models: Stateless(reinforce_pp_step)),
}
if set(REGISTRY) != set(ONLINE_ALGORITHMS):  # the config's choices and the code must name the same methods
    raise ImportError(
        f"algorithm registry {sorted(REGISTRY)} != rloo.config.ONLINE_ALGORITHMS {sorted(ONLINE_ALGORITHMS)}"
    )


def make_algorithm(cfg: RLConfig, models: Models) -> Algorithm:
    """The step (and state) of cfg.algorithm: an object with step(models, opt, prompts, cfg, gen),
    state_dict(), load_state_dict(state) and `distributed`."""
    if cfg.algorithm not in REGISTRY:
        raise ValueError(f"{cfg.algorithm!r} is not an online method (dpo runs through rloo.training.dpo)")
    return REGISTRY[cfg.algorithm].build(cfg, models)


def supports_distributed(cfg: RLConfig) -> bool:
    """Whether cfg's method, with these settings, may run under torchrun."""
    entry = REGISTRY.get(cfg.algorithm)
    return entry is not None and entry.distributed(cfg)
