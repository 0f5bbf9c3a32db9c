"""The method table: one `MethodSpec` per method, the one place a method's name is written (with
its step module). Every list of methods elsewhere (the `algorithm` choices, the methods that need
groups, tolerate unscored samples or take several updates per batch, `rloo compare`'s variants,
rloo.algorithms' registry) is derived from `METHOD_SPECS`; `add_method` extends it at run time
(`rloo.algorithms.add_method` adds the step too).

A method's settings are its own model (`MethodSpec.settings`: a pydantic model, built-in ones from the
sections of rloo.config.method_settings, or a dict of fields): `algorithm_settings:` is validated as
the model of the method `algorithm` names (`own_settings`), so a setting of another method, given
explicitly, is refused in one line naming the methods that take it, whatever its value
(rloo.config.method_choice).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from rloo.config.base import Strict
from rloo.config.method_settings import (
    DPOSettings,
    DrGRPOSettings,
    GRPOSettings,
    KLEstimatorSettings,
    PPOSettings,
    ReinforceSettings,
    RlooSettings,
    VanillaPGSettings,
    as_settings_model,
)

# ---- the table -----------------------------------------------------------------------------------

# MethodSpec's yes/no fields, the ones `capable` and `require` ask by name
Flag = Literal["unscored", "online", "value_model", "off_policy", "importance", "kl_outside", "bounded", "multi_turn"]


@dataclass(frozen=True)
class MethodSpec:
    """What the rest of rloo needs to know about a method (its step is in rloo.algorithms)."""

    name: str
    summary: str  # a few words, shown in the `algorithm` setting's description
    # its own settings, the keys of `algorithm_settings` it takes: a pydantic model or a dict of
    # fields as pydantic.create_model takes them ({"toy_scale": (float, 1.0)}); made a Strict model
    settings: type[BaseModel] | Mapping[str, Any]
    groups: str | None = None  # why it needs k >= 2 samples per prompt; None: it does not
    unscored: bool = False  # leaves a reward function's None out of its baseline (the others stop)
    # takes ppo_epochs x num_minibatches optimizer steps per batch: True, or the boolean setting
    # that switches it on (rloo's `rloo_clip`)
    several_updates: bool | str = False
    online: bool = True  # False: trains on preference pairs, not on samples (rloo.training.dpo)
    value_model: bool = False  # learns a value model (the comparison's GAE-lambda table)
    # implements rl.max_staleness > 0 / rl.is_correction, the update for samples of an older policy
    # (docs/async.md)
    off_policy: bool = False
    # with off_policy: weighs its update by rl.is_correction's importance ratio (default tis); False:
    # trains on the lagged samples as they are (default none, and is_correction's weights refused)
    importance: bool = True
    # with off_policy: takes rl.is_kl=unweighted, its KL penalty's share outside the weights (eq. A4)
    kl_outside: bool = False
    # with off_policy: takes the bounded estimators (rl.is_correction asymre, topr, cispo, rloo_clip:
    # rloo.core.bounded), which rewrite its sequence-level update (eq. A2)
    bounded: bool = False
    multi_turn: bool = False  # trains on env= episodes with the policy-token mask (docs/agents.md)
    tuned: tuple[str, str] = ("lr", "beta")  # the (learning rate, KL coefficient) `rloo compare` tunes
    variants: dict[str, dict] = field(default_factory=dict)  # more `rloo compare` runs: name -> rl overrides
    # its advantage estimator and policy loss, by their names in rloo.core.estimators (ADVANTAGES,
    # LOSSES); with both named and no step of its own, the shared clipped-group step trains it
    advantage: str | None = None
    loss: str | None = None
    # the advantage and loss its settings select, when they depend on them (rloo's ablations): a
    # function of the settings -> (advantage, loss); None: always `advantage` and `loss`
    choose: Callable[[Any], tuple[str, str]] | None = None
    # the step that trains it, by its name in rloo.algorithms.registry.STEPS: by default CLIPPED_GROUP
    # when advantage and loss are named, else its own name (a step of its own, as ppo's)
    step: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "settings", as_settings_model(self.name, self.settings))
        if self.step is None:
            shared = self.advantage is not None and self.loss is not None
            object.__setattr__(self, "step", CLIPPED_GROUP if shared else self.name)

    @property
    def settings_model(self) -> type[Strict]:
        """Its settings as a Strict model (what `settings` holds after construction)."""
        assert isinstance(self.settings, type) and issubclass(self.settings, Strict)
        return self.settings

    def estimators(self, settings: Any) -> tuple[str | None, str | None]:
        """The advantage and loss (rloo.core.estimators' names) that trains it with these settings."""
        return (self.advantage, self.loss) if self.choose is None else self.choose(settings)

    def sets(self, flag: Flag) -> bool:
        """The yes/no field `flag` of this spec."""
        flags = {"unscored": self.unscored, "online": self.online, "value_model": self.value_model}
        flags |= {"off_policy": self.off_policy, "importance": self.importance, "kl_outside": self.kl_outside}
        flags |= {"bounded": self.bounded, "multi_turn": self.multi_turn}
        return flags[flag]

    def takes_several_updates(self, algorithm_settings: dict) -> bool:
        """With these `algorithm_settings` overrides, does it take several optimizer steps per batch?"""
        if isinstance(self.several_updates, str):
            return bool(algorithm_settings.get(self.several_updates, False))
        return self.several_updates


def rloo_estimators(settings: Any) -> tuple[str, str]:
    """rloo's advantage and loss by its settings: eq. 4 on the shaped reward and eq. 5 (the paper's),
    kl_level=token charges each token the KL still to come (leave_one_out_token_kl), and rloo_clip
    takes PPO's clipped ratio, of the whole response with sequence-level KL, per token with token-level."""
    token = settings.kl_level == "token"
    advantage = "leave_one_out_token_kl" if token else "leave_one_out"
    return advantage, ("clip" if token else "clip_sequence") if settings.rloo_clip else "policy_gradient"


_GROUP = "{} needs k >= 2 samples per prompt ({})"
CLIPPED_GROUP = "clipped_group"  # the shared step of the methods that name an advantage and a loss

METHOD_SPECS: dict[str, MethodSpec] = {
    s.name: s
    for s in (
        MethodSpec(
            "rloo",
            "the paper's, default",
            RlooSettings,
            groups="leave-one-out needs k >= 2 samples per prompt (the baseline of one sample is the mean of "
            "the other k-1)",
            unscored=True,
            several_updates="rloo_clip",
            off_policy=True,
            kl_outside=True,
            bounded=True,
            multi_turn=True,
            advantage="leave_one_out",
            loss="policy_gradient",
            choose=rloo_estimators,
            step="rloo",  # the paper's update in one pass (algorithms/rloo.py), the ablations in the group step
            variants={
                "rloo_k2": {"k": 2},
                "rloo_token_kl": {"algorithm_settings": {"kl_level": "token"}},
                "rloo_k3_kl": {"algorithm_settings": {"kl_estimator": "k3"}},
                "rloo_clip": {"algorithm_settings": {"rloo_clip": True}},
            },
        ),
        MethodSpec("reinforce", "moving-average baseline", ReinforceSettings, off_policy=True, multi_turn=True),
        MethodSpec("vanilla_pg", "", VanillaPGSettings, value_model=True, off_policy=True),
        MethodSpec(
            "ppo",
            "",
            PPOSettings,
            several_updates=True,
            value_model=True,
            off_policy=True,
            variants={"ppo_lambda1": {"algorithm_settings": {"gae_lambda": 1.0}}},
        ),
        MethodSpec(
            "grpo",
            "",
            GRPOSettings,
            groups=_GROUP.format("grpo", "each advantage is normalised by the mean and std of its prompt's group"),
            unscored=True,
            several_updates=True,
            off_policy=True,
            multi_turn=True,
            advantage="group_normalized",
            loss="clip_k3",
        ),
        MethodSpec("raft", "", KLEstimatorSettings, off_policy=True, importance=False, multi_turn=True),
        MethodSpec(
            "dpo",
            "offline, on the reward model's pairs",
            DPOSettings,
            online=False,
            tuned=("algorithm_settings.dpo_lr", "algorithm_settings.dpo_beta"),
        ),
        MethodSpec(
            "dr_grpo",
            "group mean, no std, constant length norm",
            DrGRPOSettings,
            groups=_GROUP.format("dr_grpo", "each advantage subtracts the mean of its prompt's group"),
            unscored=True,
            several_updates=True,
            off_policy=True,
            advantage="group_mean",
            loss="clip_k3_constant_length",
        ),
        MethodSpec(
            "reinforce_pp",
            "batch-level baseline",
            GRPOSettings,
            unscored=True,
            several_updates=True,
            off_policy=True,
            advantage="batch_whitened_returns",
            loss="clip",
        ),
    )
}
DEFAULT_METHOD = next(iter(METHOD_SPECS))  # rloo: the paper's method, and the comparison's baseline


def add_method(spec: MethodSpec) -> None:
    """Add a method to the table (rloo.algorithms.add_method also registers its step). Its settings
    model may bring keys of its own; `cfg.algorithm_settings` is an instance of it in its runs."""
    if spec.name in METHOD_SPECS or spec.name in compare_variants():
        raise ValueError(
            f"a method or comparison variant named {spec.name!r} already exists (is the module that adds it "
            "imported twice, once as a file and once as a module?)"
        )
    METHOD_SPECS[spec.name] = spec


def names(*, online: bool | None = None) -> tuple[str, ...]:
    """The methods' names in table order (only the online or offline ones when asked)."""
    return tuple(n for n, s in METHOD_SPECS.items() if online is None or s.online == online)


def compare_variants() -> dict[str, tuple[str, dict]]:
    """`rloo compare`'s runs: name -> (method, overrides of the shared rl settings); each method
    under its own name, then its variants."""
    out: dict[str, tuple[str, dict]] = {}
    for spec in METHOD_SPECS.values():
        out[spec.name] = (spec.name, {})
        out |= {v: (spec.name, over) for v, over in spec.variants.items()}
    return out


def spec_of_variant(variant: str) -> MethodSpec:
    """The method a comparison variant runs."""
    return METHOD_SPECS[compare_variants()[variant][0]]


def several_updates_variants() -> tuple[str, ...]:
    """Comparison variants that take ppo_epochs x num_minibatches optimizer steps per batch."""
    return tuple(
        v
        for v, (m, over) in compare_variants().items()
        if METHOD_SPECS[m].takes_several_updates(over.get("algorithm_settings", {}))
    )


def capable(flag: Flag) -> list[str]:
    """The methods whose spec sets `flag` (e.g. "off_policy", "multi_turn")."""
    return [n for n, s in METHOD_SPECS.items() if s.sets(flag)]


def why_not_multi_turn(spec: MethodSpec) -> str:
    """Why a method without `multi_turn` does not train on episodes (docs/agents.md's table), a few words."""
    if spec.value_model:
        return "its value model and GAE would run over the environment's tokens, which are not the policy's actions"
    if not spec.online:
        return "it trains offline on a reward model's preference pairs, which an environment does not give"
    return "not wired for episodes (its per-token terms need the policy-token review of docs/agents.md)"


def require(flag: Flag, algorithm: str, what: str) -> None:
    """Refuse `what` for a method whose spec does not set `flag` (a MethodSpec field), naming those that do."""
    if not METHOD_SPECS[algorithm].sets(flag):
        raise ValueError(f"{what} are implemented for {one_of(capable(flag))} only, got {algorithm}")


def takers(setting: str) -> list[str]:
    """The methods whose settings include `setting`."""
    return [n for n, s in METHOD_SPECS.items() if setting in s.settings_model.model_fields]


def one_of(items: list[str] | tuple[str, ...], last: str = "or") -> str:
    """'a, b or c'."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"
