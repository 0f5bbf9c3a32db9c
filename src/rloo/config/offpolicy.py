"""Which methods and settings combine with the asynchronous / off-policy update (rl.max_staleness,
is_correction, is_kl, producer_address; docs/async.md): one function of the RL
settings, run by RLSettings' validator (also for `rloo compare`'s shared section, whose every method
would run the off-policy update)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from rloo.config.generation import truncating
from rloo.config.methods import METHOD_SPECS, require

BOUNDED = ("asymre", "topr", "cispo", "clipped_surrogate")  # rloo.core.bounded's estimators
IsCorrection = Annotated[
    Literal["tis", "mis", "tis_token", "mis_token", "asymre", "topr", "cispo", "clipped_surrogate", "none"] | None,
    Field(
        description="Importance correction for samples from another policy (docs/async.md): tis (ratio "
        "truncated at is_clip), mis (masked outside [1/is_clip, is_clip]), token-level variants; rloo only: "
        "asymre (no weight, baseline lowered by is_baseline_shift), topr (negative advantages' ratio "
        "truncated at 1), cispo (token ratio clipped to [is_clip_low, is_clip], detached), "
        "clipped_surrogate (rloo_clip's clipped surrogate with the sampler as the old policy, clip_eps); "
        "none; null: tis when max_staleness > 0 (raft: none), none (the paper's update) at 0."
    ),
]
IsKL = Annotated[
    Literal["weighted", "unweighted"],
    Field(
        description="rloo with is_correction: eq. 1's KL penalty inside the importance-weighted reward (weighted) "
        "or its leave-one-out share outside the weights (unweighted: biased by the lag, but its pull towards "
        "the reference does not vanish with the weights; docs/async.md eq. A4)."
    ),
]
IsBaselineShift = Annotated[
    float, Field(ge=0, description="is_correction=asymre: delta, how far below the leave-one-out mean the baseline is.")
]
IsClipLow = Annotated[
    float, Field(ge=0, lt=1, description="is_correction=cispo: lower bound of the clipped token weight (0: none).")
]
IsToprSplit = Annotated[
    Literal["advantage", "reward"],
    Field(
        description="is_correction=topr: the sign that puts a sample on the truncated (negative) side: its "
        "leave-one-out advantage (advantage, rloo's rule) or its shaped reward (reward, the TOPR paper's)."
    ),
]
LogprobsUnder = Annotated[
    Literal["truncated", "full"] | None,
    Field(
        description="The distribution whose log-probs, ratios and KL are trained: truncated (the top_k/top_p set "
        "the sampler kept, renormalised: the policy that was sampled, unbiased) or full (softmax(logits / "
        "temperature), the paper's; biased when top_k/top_p truncate). null: truncated when top_p < 1 or "
        "top_k > 0 (rloo's sampler, no min_new_tokens or repetition_penalty, single-turn), else full."
    ),
]


def check_off_policy(s: Any) -> None:
    """Raises ValueError, one line, for a combination the off-policy update does not define. `s`: an
    RLSettings (its off_policy_correction, algorithm and the settings named above)."""
    if (correction := s.off_policy_correction) is not None:
        spec, what = METHOD_SPECS[s.algorithm], "max_staleness > 0 and is_correction"
        if not spec.online:
            raise ValueError(f"{what}: {s.algorithm} is offline (it trains on fixed pairs: no sampler to lag)")
        require("off_policy", s.algorithm, what)
        if correction in BOUNDED:
            require("bounded", s.algorithm, f"is_correction={correction}")
            if s.is_kl == "unweighted":
                raise ValueError(f"is_kl=unweighted: {correction} rewrites the whole advantage; use is_kl=weighted")
        if not spec.importance and correction != "none":
            raise ValueError(
                f"is_correction={correction}: {s.algorithm} trains on lagged samples as they are (SFT on the "
                "best of k, whose selection has no tractable importance ratio); leave it unset or none"
            )
    if s.is_kl == "unweighted":
        if correction is None:
            raise ValueError(
                "is_kl=unweighted: for the importance-weighted update (max_staleness > 0 or is_correction)"
            )
        require("kl_outside", s.algorithm, "updates with is_kl=unweighted")
    _check_bounded_settings(s, correction)
    if s.producer_address is not None and not s.max_staleness:
        raise ValueError("producer_address: the producer samples ahead of the trainer, set max_staleness >= 1")


# the settings only one correction reads: set away from their defaults with another, they would do
# nothing. Compared with the default, not by "was it given": a run's saved config.yaml gives every key.
# (is_clip is refused only beside the estimators that have no C: it predates them.)
_OWN = {"is_baseline_shift": ("asymre",), "is_clip_low": ("cispo",), "is_topr_split": ("topr",)}
_NO_C = {"clipped_surrogate": "algorithm_settings.clip_eps", "topr": "1, the paper's", "asymre": "no weight"}


def _check_bounded_settings(s: Any, correction: str | None) -> None:
    fields = type(s).model_fields
    for name, takers in _OWN.items():
        if dict(s)[name] != fields[name].default and correction not in takers:  # a model iterates (field, value)
            raise ValueError(f"{name}: for is_correction={' or '.join(takers)}, got {correction or 'none (on-policy)'}")
    if s.is_clip != fields["is_clip"].default and correction in _NO_C:
        raise ValueError(f"is_clip: is_correction={correction} takes no C (its bound: {_NO_C[correction]})")


def truncates_logprobs(s: Any) -> bool:
    """rl.logprobs_under resolved: True when the trained log-probs are the truncated distribution's.
    Raises ValueError, one line, where truncated was asked for and cannot be honoured. `s`: an
    RLSettings, or an RLConfig (whose env= multi-turn sampler keeps the full log-probs)."""
    truncates = truncating(s)
    why_not = (
        "generation=vllm (its log-probs are recomputed by the trainer: docs/configs.md)"
        if s.generation != "sampler"
        else "env= (the multi-turn sampler stores the full log-probs)"
        if dict(s).get("env") is not None  # an RLConfig's field (RLSettings has none)
        else "min_new_tokens or repetition_penalty (a shaping the trainer's pass does not repeat)"
        if s.min_new_tokens > 0 or s.repetition_penalty != 1.0
        else None
    )
    if s.logprobs_under == "truncated":
        if not truncates:
            raise ValueError("logprobs_under=truncated: nothing truncates; set top_p < 1 or top_k > 0 (or unset it)")
        if why_not is not None:
            raise ValueError(f"logprobs_under=truncated: not with {why_not}; use logprobs_under=full")
        return True
    return s.logprobs_under is None and truncates and why_not is None
