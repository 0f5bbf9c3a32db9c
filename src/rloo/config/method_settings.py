"""Each built-in method's own settings model, built from small sections several methods share, and
`AlgorithmSettings`, every built-in key in one model: what `--help-config` lists and what the type
checker reads `cfg.algorithm_settings` as. A run's `algorithm_settings` is an instance of its method's
own model (its table entry, rloo.config.methods, which also refuses a setting of another method).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import BaseModel, Field, create_model

from rloo.config.base import MAX_BETA, MAX_LR, Strict

# ---- the settings, in sections several methods share ---------------------------------------------


class KLEstimatorSettings(Strict):
    kl_estimator: Literal["k1", "k3"] = Field(
        default="k1",
        description="KL estimator in the shaped reward (k3: lower-variance, Schulman 2020). RLOO ablation when k3.",
    )


class RlooAblationSettings(Strict):
    kl_level: Literal["sequence", "token"] = Field(
        default="sequence",
        description="RLOO ablation: 'token' gives each token only the KL penalty of itself and later tokens.",
    )
    rloo_clip: bool = Field(
        default=False,
        description="RLOO ablation: PPO ratio + clipping on top of RLOO "
        "(ppo_epochs x num_minibatches updates per batch).",
    )


class BaselineSettings(Strict):
    baseline_momentum: float = Field(
        default=0.9, ge=0, lt=1, description="reinforce: moving-average baseline momentum (eq. 3)."
    )


class DiscountSettings(Strict):
    gamma: float = Field(default=1.0, gt=0, le=1, description="ppo/vanilla_pg: discount of GAE.")


class GAESettings(Strict):
    gae_lambda: float = Field(default=0.95, ge=0, le=1, description="ppo: GAE lambda (vanilla_pg always uses 1).")


class ClipSettings(Strict):
    clip_eps: float = Field(default=0.2, gt=0, description="ppo/grpo/rloo_clip: ratio clip range.")
    ppo_epochs: int = Field(default=2, ge=1, description="ppo/grpo/rloo_clip: passes over each batch of samples.")
    num_minibatches: int = Field(default=2, ge=1, description="ppo/grpo/rloo_clip: minibatches per pass.")


class ValueSettings(Strict):
    value_model: Literal["separate", "head"] = Field(
        default="separate",
        description="ppo/vanilla_pg: a separate value model (from the reward model) or a head on the policy.",
    )
    value_lr: float = Field(
        default=1e-4, gt=0, le=MAX_LR, description="ppo/vanilla_pg: learning rate of the value model/head."
    )
    vf_coef: float = Field(
        default=0.5, ge=0, description="ppo/vanilla_pg with value_model=head: weight of the value loss."
    )


class ValueClipSettings(Strict):
    value_clip_eps: float | None = Field(default=0.2, description="ppo: value clipping range (null: off).")


class WhitenSettings(Strict):
    whiten_advantages: bool = Field(default=True, description="ppo/vanilla_pg: normalise GAE advantages per batch.")


class ZeroVarianceSettings(Strict):
    drop_zero_variance: bool = Field(
        default=False,
        description="rloo/grpo/dr_grpo/reinforce_pp: leave groups whose k scores are all equal out of the update "
        "(logged as groups/dropped).",
    )


class NormLengthSettings(Strict):
    norm_length: int | None = Field(
        default=None,
        ge=1,
        description="dr_grpo: the constant a completion's token sum is divided by (null: max_new_tokens).",
    )


class DPOSettings(Strict):
    dpo_beta: float = Field(default=0.1, gt=0, le=MAX_BETA, description="dpo: beta of the DPO loss.")
    dpo_pairs: int = Field(default=6000, ge=1, description="dpo: preference pairs (the reward model's first pairs).")
    dpo_epochs: int = Field(default=1, ge=1, description="dpo: passes over the pairs.")
    dpo_batch_size: int = Field(default=64, ge=1, description="dpo: pairs per optimizer step.")
    dpo_lr: float = Field(default=1e-4, gt=0, le=MAX_LR, description="dpo: learning rate.")


# ---- each method's own settings ------------------------------------------------------------------


class RlooSettings(ZeroVarianceSettings, ClipSettings, RlooAblationSettings, KLEstimatorSettings):
    pass


class ReinforceSettings(BaselineSettings, KLEstimatorSettings):
    pass


class VanillaPGSettings(WhitenSettings, ValueSettings, DiscountSettings, KLEstimatorSettings):
    pass


class PPOSettings(
    WhitenSettings, ValueClipSettings, ValueSettings, ClipSettings, GAESettings, DiscountSettings, KLEstimatorSettings
):
    pass


class GRPOSettings(ZeroVarianceSettings, ClipSettings, KLEstimatorSettings):
    pass


class DrGRPOSettings(NormLengthSettings, ZeroVarianceSettings, ClipSettings, KLEstimatorSettings):
    pass


class AlgorithmSettings(
    DPOSettings,
    NormLengthSettings,
    ZeroVarianceSettings,
    WhitenSettings,
    ValueClipSettings,
    ValueSettings,
    ClipSettings,
    GAESettings,
    DiscountSettings,
    BaselineSettings,
    RlooAblationSettings,
    KLEstimatorSettings,
):
    """Every built-in method's settings keys (each method takes its own model's: `METHOD_SPECS[name].settings`;
    RLOO's are its ablations: kl_level, kl_estimator, rloo_clip). The type `cfg.algorithm_settings`
    is declared as; the value is the method's own model, which holds only its keys."""


def as_settings_model(method: str, settings: type[BaseModel] | Mapping[str, Any]) -> type[Strict]:
    """A method's settings as a Strict model (unknown keys and bad values refused like every
    section's): a Strict model as it is, another pydantic model with Strict's rules added, or a dict
    of fields as pydantic.create_model takes them ({"scale": (float, Field(1.0, gt=0))})."""
    title = "".join(p.title() for p in method.split("_")) + "Settings"
    if isinstance(settings, Mapping):
        return create_model(title, __base__=Strict, **dict(settings))
    if isinstance(settings, type) and issubclass(settings, Strict):
        return settings
    if isinstance(settings, type) and issubclass(settings, BaseModel):
        return cast("type[Strict]", create_model(title, __base__=(settings, Strict)))  # a Strict subclass
    raise TypeError(f"{method}: settings must be a pydantic model or a dict of fields, got {settings!r}")
