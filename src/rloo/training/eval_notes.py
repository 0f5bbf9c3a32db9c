"""The evaluation report's plain-language notes: who the judge is (and whether RL optimised it), and
what the KL column measures."""

from __future__ import annotations

from pathlib import Path

import yaml

from rloo.config import EvalConfig
from rloo.eval.judge import judge_kind

# How far above the evaluated model folder its training run's config.yaml may lie: <run>/model, or a
# checkpoint's <run>/checkpoints/step-N/model
_RUN_DEPTH = 3


def honest_notes(cfg: EvalConfig, judge) -> list[str]:
    """The report's notes on the judge (`judge_note`) and on the KL column (`kl_note`)."""
    return [n for n in (judge_note(judge, cfg.reward_model, optimised_sources(cfg.policy)), kl_note(cfg)) if n]


def judge_note(judge, reward_model: str | None, optimised: set[str]) -> str:
    """One line on the judge: a gold judge is independent of training; a reward model or a function that
    RL optimised (`optimised`: the policy run's reward sources) is not, and the line says so plainly."""
    kind = judge_kind(judge)
    if kind == "gold":
        return f"Judge: {judge.name}, the task's own judge, independent of the reward RL optimised."
    spec = reward_model if kind == "reward_model" else judge.name
    what = "reward model" if kind == "reward_model" else "reward function"
    if spec is not None and _key(spec) in optimised:
        return (
            f"**The score is the {what} RL optimised ({spec}), not an independent judge.** The policy was "
            "trained to raise it, so a higher score can be the policy gaming it (longer answers, answers "
            "cut at the length limit: see the length and truncated columns). For an independent result, judge "
            "with another function (judge=module:function; eval.judge= in the pipeline)."
        )
    return (
        f"Judge: {judge.name}, not a gold judge. If the policy was trained against it, it is not an independent "
        "judge and its score can be gamed."
    )


def kl_note(cfg: EvalConfig) -> str | None:
    """What "KL to ref (k3)" is (rloo.eval.judge's docstring derives it), and what it is not under greedy
    decoding; None without a reference model."""
    if not (cfg.reference_model or cfg.baseline):
        return None
    text = (
        "KL to ref (k3): per response, the sum over its tokens of exp(r) - 1 - r with r = log pi_ref/pi of the "
        "sampled token; never negative, unbiased for KL(pi || pi_ref) on sampled responses. summary.json's `kl` "
        "is k1 (sum of -r, the estimator of the RL reward), also unbiased but negative on some responses."
    )
    if cfg.temperature == 0:
        text += (
            " Greedy decoding (temperature 0): the responses are not samples of the policy, so neither is an "
            "estimate of KL(pi || pi_ref); k3 stays a non-negative distance along the greedy responses."
        )
    return text


def optimised_sources(policy: str) -> set[str]:
    """The reward sources (reward model path, reward function specs) of the RL run that wrote `policy`,
    from the nearest config.yaml above it; empty when there is none (a model from elsewhere)."""
    for folder in list(Path(policy).parents)[:_RUN_DEPTH]:
        path = folder / "config.yaml"
        if path.is_file():
            try:
                saved = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError):
                return set()
            fns = saved.get("reward_fn") or []
            specs = [saved.get("reward_model"), *([fns] if isinstance(fns, str) else fns)]
            return {_key(s) for s in specs if s}
    return set()


def _key(spec: str) -> str:
    """A path's absolute form (a reward model given as runs/x/reward/model or ./runs/...); a
    module:function spec as it is."""
    return str(Path(spec).resolve()) if Path(spec).exists() else spec
