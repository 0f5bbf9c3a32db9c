"""Checks of a stage's config that need no model, run before any model loads or any file is
written: every model/tokenizer/dataset name exists (rloo.runtime.names), there is a reward source and
something to judge with, and the user's Python callables import.

Light on purpose: the CLI runs `check_config` before importing torch-heavy stage code, so a typo
costs a second, not a model load. The stages call it too (the Python API gets the same checks).
"""

from __future__ import annotations

from rloo.config import METHOD_SPECS, EvalConfig, PipelineConfig, RLConfig, SFTConfig, normalize_report_to
from rloo.data.datasets import load_records
from rloo.errors import ConfigError, RlooError
from rloo.runtime.names import check_local, check_name
from rloo.runtime.trackers import check_wandb_installed
from rloo.runtime.user_code import load_callable

MODEL_KEYS = ("model", "tokenizer", "policy", "baseline", "reference_model", "reward_model", "sft_model")


def check_config(cfg, *, reward_fn=None) -> None:
    """Raise one RlooError line for the first problem of `cfg` (any stage's config, or the
    pipeline's). `reward_fn`: a callable given to the API in place of cfg.reward_fn."""
    check_wandb_installed(normalize_report_to(cfg.report_to))
    names = [(key, value, "model") for key, value in _model_names(cfg)]
    for key, ds in _datasets(cfg):
        names.append((f"{key}.path", ds.path, "dataset"))
        if ds.eval_split is not None and _looks_like_file(ds.eval_split):
            names.append((f"{key}.eval_split", ds.eval_split, "dataset"))
    for key, value, _ in names:  # every local typo first: they need no network
        check_local(value, key)
    for key, value, repo_type in names:
        check_name(value, key, repo_type)
    if isinstance(cfg, SFTConfig) and cfg.dataset is not None and cfg.model is None and cfg.tokenizer is None:
        raise ConfigError(
            "sft on a dataset needs model=PATH (or tokenizer=PATH): the built-in word tokenizer "
            "only knows the built-in task's words"
        )
    if isinstance(cfg, RLConfig):
        _check_reward_source(cfg, reward_fn)
    if isinstance(cfg, (RLConfig, EvalConfig, PipelineConfig)):
        check_judge(cfg)
    if isinstance(cfg, PipelineConfig):
        _check_pipeline(cfg)


def _model_names(cfg):
    # the pipeline's stage outputs (sft/model, ...) do not exist yet: only the names a user gave
    for key in MODEL_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, str):
            yield key, value
    reward = getattr(cfg, "reward", None)
    if isinstance(getattr(reward, "model", None), str):
        yield "reward.model", reward.model


def _datasets(cfg):
    if getattr(cfg, "dataset", None) is not None:
        yield "dataset", cfg.dataset
    reward = getattr(cfg, "reward", None)
    if getattr(reward, "dataset", None) is not None:
        yield "reward.dataset", reward.dataset


def _looks_like_file(split: str) -> bool:
    return "/" in split or "." in split


def _check_reward_source(cfg, reward_fn) -> None:
    specs = [cfg.reward_fn] if isinstance(cfg.reward_fn, str) else list(cfg.reward_fn or [])
    if cfg.reward_model is None and not specs and reward_fn is None and METHOD_SPECS[cfg.algorithm].online:
        raise ConfigError(
            "no reward source: set reward_model=PATH or reward_fn=module:function (or path/to/file.py:function)"
        )
    if reward_fn is None:
        for spec in specs:
            load_callable(spec, "reward_fn")


def judge_spec(cfg) -> str | None:
    """The judge a config asks for: eval.judge of RL and pipeline configs, judge of `rloo eval`."""
    ev = getattr(cfg, "eval", None)
    return ev.judge if ev is not None else getattr(cfg, "judge", None)


def check_judge(cfg) -> None:
    """The judge exists and can be built from what the config provides."""
    spec = judge_spec(cfg)
    has_rm = isinstance(cfg, PipelineConfig) or getattr(cfg, "reward_model", None) is not None
    if spec == "gold":
        if cfg.dataset is not None:
            raise ConfigError(
                "judge 'gold' is the built-in task's judge, and a dataset replaces the task; "
                "use judge=reward_model or judge=module:function"
            )
    elif spec == "reward_model":
        if not has_rm:
            raise ConfigError("judge 'reward_model' needs a reward model: set reward_model=PATH")
    elif spec is not None:
        load_callable(spec, "judge")
    elif isinstance(cfg, EvalConfig) and cfg.dataset is not None and not has_rm:
        raise ConfigError(
            "nothing to judge the responses with: on a dataset, set judge=module:function "
            "(or path/to/file.py:function), or reward_model=PATH to judge with a reward model"
        )


def _check_pipeline(cfg) -> None:
    """What the pipeline's stages will need from the data, read now rather than after SFT."""
    if cfg.dataset is None:
        if cfg.reward.dataset is not None:
            raise ConfigError(
                "reward.dataset is set but dataset is not: the pipeline's SFT, RL and eval "
                "stages need dataset.path too (prompts and reference completions)"
            )
        return
    if cfg.model is None and cfg.tokenizer is None:
        raise ConfigError(
            "a pipeline on your own dataset needs model=PATH (the causal LM SFT starts from) "
            "or tokenizer=PATH: the built-in word tokenizer only knows the built-in tasks' words"
        )
    load_records(cfg.dataset, ("prompt", "completion"))
    try:
        load_records(cfg.reward.dataset or cfg.dataset, ("prompt", "chosen", "rejected"))
    except RlooError as e:
        if cfg.reward.dataset is not None:
            raise
        raise RlooError(f"{e}; or give the reward stage its own preference data: reward.dataset.path=FILE") from e
