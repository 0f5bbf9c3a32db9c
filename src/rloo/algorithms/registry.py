"""The steps that train the methods of the table (rloo.config.METHOD_SPECS, where each method is
declared once): STEPS maps a step's name (MethodSpec.step) to how to build it and whether it may run
under torchrun (declared here, by the step, so rloo.runtime.distributed never needs to know which
methods exist). REGISTRY is the table read through STEPS: method name -> its step's Entry.

A method that names an advantage and a loss (rloo.core.estimators) is trained by the shared
clipped-group step and needs no step of its own. `add_method` is the extension point: one table
entry, and a step or a build unless it names an advantage and a loss, from any module."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial

from rloo.algorithms import rloo as rloo_module
from rloo.algorithms.base import Algorithm, Models, Stateless
from rloo.algorithms.clipped_group import clipped_group_step
from rloo.algorithms.ppo import PPO
from rloo.algorithms.raft import raft_step
from rloo.algorithms.reinforce import Reinforce
from rloo.config import MethodSpec, RLConfig
from rloo.config.methods import CLIPPED_GROUP, METHOD_SPECS, names
from rloo.config.methods import add_method as add_spec
from rloo.core.estimators import ADVANTAGES, LOSSES
from rloo.errors import RlooError


def _never(cfg: RLConfig) -> bool:
    return False


@dataclass(frozen=True)
class Entry:
    build: Callable[[RLConfig, Models], Algorithm]
    distributed: Callable[[RLConfig], bool] = _never  # may this configuration run under torchrun?


def is_plain_rloo(cfg: RLConfig) -> bool:
    """The paper's rloo: its default estimators (eq. 4, eq. 5), the k1 KL, every group kept."""
    a, spec = cfg.algorithm_settings, METHOD_SPECS["rloo"]
    default = spec.estimators(a) == (spec.advantage, spec.loss)
    return default and a.kl_estimator == "k1" and not a.drop_zero_variance


def _rloo(cfg: RLConfig, models: Models) -> Algorithm:
    """The paper's update in algorithms/rloo.py's one pass (the sampler's prompt pass reused; the
    off-policy update, torchrun); its ablations (other estimators of the table, k3, dropped groups)
    in the group step, over the same registered estimators."""
    # looked up on the module at build time, so a test can wrap rloo_step (tests/reliability)
    if is_plain_rloo(cfg):
        return Stateless(rloo_module.rloo_step, distributed=True)
    if cfg.off_policy_correction is not None:
        raise RlooError("max_staleness > 0 and is_correction take plain rloo (no ablation settings)")
    return Stateless(partial(clipped_group_step, METHOD_SPECS["rloo"]))


def _rloo_distributed(cfg: RLConfig) -> bool:
    return is_plain_rloo(cfg)  # at max_staleness > 0 each process samples its share (rloo.rollout.producer)


def _clipped_group(cfg: RLConfig, models: Models) -> Algorithm:
    return Stateless(partial(clipped_group_step, METHOD_SPECS[cfg.algorithm]))


# by step name; a method's own step is named as the method (MethodSpec.step's default)
STEPS: dict[str, Entry] = {
    "rloo": Entry(_rloo, distributed=_rloo_distributed),
    "reinforce": Entry(lambda cfg, models: Reinforce(cfg)),
    "vanilla_pg": Entry(lambda cfg, models: PPO(cfg, models, vanilla=True)),
    "ppo": Entry(lambda cfg, models: PPO(cfg, models)),
    "raft": Entry(lambda cfg, models: Stateless(raft_step)),
    CLIPPED_GROUP: Entry(_clipped_group),
}


class _Registry(Mapping[str, Entry]):
    """The online methods of the table, each with its step's Entry (a live view: a method added later
    is in it)."""

    def __getitem__(self, name: str) -> Entry:
        spec = METHOD_SPECS.get(name)
        if spec is None or not spec.online or spec.step not in STEPS:
            raise KeyError(name)
        return STEPS[spec.step]  # type: ignore[index]

    def __iter__(self) -> Iterator[str]:
        return iter(n for n in names(online=True) if METHOD_SPECS[n].step in STEPS)

    def __len__(self) -> int:
        return sum(1 for _ in self)


REGISTRY: Mapping[str, Entry] = _Registry()


def check_spec(spec: MethodSpec) -> None:
    """ValueError unless the spec's step, advantage and loss are registered."""
    _check_estimators(spec)
    if spec.step not in STEPS:
        raise ValueError(f"{spec.name}: no step {spec.step!r} (name an advantage and a loss, or give a step)")


def _check_estimators(spec: MethodSpec) -> None:
    if spec.advantage is not None and spec.advantage not in ADVANTAGES:
        raise ValueError(f"{spec.name}: no advantage estimator {spec.advantage!r}; registered: {', '.join(ADVANTAGES)}")
    if spec.loss is not None and spec.loss not in LOSSES:
        raise ValueError(f"{spec.name}: no loss {spec.loss!r}; registered: {', '.join(LOSSES)}")


for _spec in METHOD_SPECS.values():  # the table's online methods and the code must agree, at import
    if _spec.online:
        try:
            check_spec(_spec)
        except ValueError as e:
            raise ImportError(f"the method table and rloo.algorithms disagree: {e}") from None


def add_method(
    spec: MethodSpec,
    step: Callable | None = None,
    *,
    build: Callable[[RLConfig, Models], Algorithm] | None = None,
    distributed: Callable[[RLConfig], bool] = _never,
) -> None:
    """Add an online method: its table entry (rloo.config.methods.MethodSpec: its own settings,
    groups, comparison variants) and its code: either nothing, when the spec names an advantage and
    a loss (rloo.core.estimators; the shared clipped-group step trains it), or a stateless
    `step(models, opt, prompts, cfg, gen) -> StepResult`, or `build(cfg, models) -> Algorithm` (a
    class with state, as `Reinforce`), which reads its settings as `cfg.algorithm_settings.<key>`.
    After it, `algorithm=<spec.name>` trains through `rloo train` and `rloo compare` runs it (from
    the command line: --plugin, the module that calls this)."""
    if step is not None and build is not None:
        raise ValueError("add_method takes a step or a build, not both")
    if not spec.online:
        raise ValueError(f"{spec.name}: add_method adds online methods (offline ones need their own loop)")
    if spec.name == CLIPPED_GROUP:
        raise ValueError(f"{CLIPPED_GROUP!r} names the shared step; choose another name")
    if step is not None or build is not None:
        if build is None:
            assert step is not None
            stateless = step
            build = lambda cfg, models: Stateless(stateless)  # noqa: E731
        _check_estimators(spec)
        add_spec(replace(spec, step=spec.name))  # its own step, whatever advantage and loss it names
        STEPS[spec.name] = Entry(build, distributed)
        return
    check_spec(spec)
    add_spec(spec)


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
