"""One registry: algorithm name (rloo.config.METHOD_SPECS, the method table where the names are
written) -> how to build it, and whether it may run under torchrun (declared here, by the
algorithm, so rloo.runtime.distributed never needs to know which methods exist). `add_method` is
the extension point: one table entry and one step, from any module."""

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
from rloo.config import MethodSpec, RLConfig
from rloo.config.methods import add_method as add_spec
from rloo.config.methods import names
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
    return is_plain_rloo(cfg)  # at max_staleness > 0 each process samples its share (rloo.rollout.producer)


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
if set(REGISTRY) != set(names(online=True)):  # the table's online methods and the code must be the same
    raise ImportError(f"algorithm registry {sorted(REGISTRY)} != the method table's {sorted(names(online=True))}")


def add_method(
    spec: MethodSpec,
    step: Callable | None = None,
    *,
    build: Callable[[RLConfig, Models], Algorithm] | None = None,
    distributed: Callable[[RLConfig], bool] = _never,
) -> None:
    """Add an online method: its table entry (rloo.config.methods.MethodSpec: its own settings,
    groups, comparison variants) and its code, either a stateless `step(models, opt, prompts, cfg,
    gen) -> StepResult` or `build(cfg, models) -> Algorithm` (a class with state, as `Reinforce`),
    which reads its settings as `cfg.algorithm_settings.<key>`. After it, `algorithm=<spec.name>`
    trains through `rloo train` and `rloo compare` runs it (from the command line: --plugin, the
    module that calls this)."""
    if (step is None) == (build is None):
        raise ValueError("add_method takes a step or a build, not both")
    if not spec.online:
        raise ValueError(f"{spec.name}: add_method adds online methods (offline ones need their own loop)")
    if build is None:
        assert step is not None
        stateless = step
        build = lambda cfg, models: Stateless(stateless)  # noqa: E731
    add_spec(spec)
    REGISTRY[spec.name] = Entry(build, distributed)


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
