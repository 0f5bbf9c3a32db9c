"""Checks of a stage's config that need no model, run before any model loads or any file is
written: every model/tokenizer/dataset name exists (rloo.runtime.inputs.names), there is a reward source and
something to judge with, and the user's Python callables import.

Light on purpose: the CLI runs `check_config` before importing torch-heavy stage code, so a typo
costs a second, not a model load. The stages call it too (the Python API gets the same checks).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rloo.config import (
    METHOD_SPECS,
    TASK_SPECS,
    EvalConfig,
    PipelineConfig,
    RewardConfig,
    RLConfig,
    RLSettings,
    SFTConfig,
    normalize_report_to,
)
from rloo.config.tasks import episode_tasks
from rloo.data.datasets import read_records
from rloo.data.split import check_sides, eval_records, split_records, train_eval_records, train_records
from rloo.data.survey import survey_pipeline
from rloo.errors import ConfigError, RlooError
from rloo.runtime.inputs.names import check_local, check_name
from rloo.runtime.inputs.sizes import check_generation, check_memory, check_ring_memory, shape_of
from rloo.runtime.inputs.user_code import load_callable
from rloo.runtime.inputs.vllm_models import vllm_cannot_run
from rloo.runtime.inputs.weightfiles import check_model_files, check_tokenizer_files, check_weight_files
from rloo.runtime.link.address import check_trainer_address
from rloo.runtime.tracking.trackers import check_wandb_installed

# the configs `check_config` reads (one per stage, and the pipeline's)
StageConfig = SFTConfig | RewardConfig | RLConfig | EvalConfig | PipelineConfig

MODEL_KEYS = ("model", "tokenizer", "policy", "baseline", "reference_model", "reward_model", "sft_model")


def check_config(cfg: StageConfig, *, reward_fn=None) -> None:
    """Raise one RlooError line for the first problem of `cfg` (any stage's config, or the
    pipeline's). `reward_fn`: a callable given to the API in place of cfg.reward_fn."""
    check_wandb_installed(normalize_report_to(cfg.report_to))
    _check_required(cfg)
    names = [(key, value, "model") for key, value in _model_names(cfg)]
    for key, ds in _datasets(cfg):
        if not ds.path:
            raise ConfigError(f"missing required key '{key}.path': a Hub name, file or folder (in Python: dataset=)")
        names.append((f"{key}.path", ds.path, "dataset"))
        if ds.eval_split is not None and _looks_like_file(ds.eval_split):
            names.append((f"{key}.eval_split", ds.eval_split, "dataset"))
    for key, value, _ in names:  # every local typo first: they need no network
        check_local(value, key)
    for key, value, repo_type in names:
        check_name(value, key, repo_type)
        if repo_type == "model":
            check_model_files(value, key)  # first: a FIFO there would be waited on by the checks below
            check_tokenizer_files(value, key)
            check_weight_files(value, key)
    if isinstance(cfg, SFTConfig) and cfg.dataset is not None and cfg.model is None and cfg.tokenizer is None:
        raise ConfigError(
            "sft on a dataset needs model=PATH (or tokenizer=PATH): the built-in word tokenizer "
            "only knows the built-in task's words"
        )
    if isinstance(cfg, RLConfig):
        _check_reward_source(cfg, reward_fn)
    if isinstance(cfg, (EvalConfig, PipelineConfig)):
        _check_env(cfg)
    if isinstance(cfg, (RLConfig, EvalConfig, PipelineConfig)):
        check_judge(cfg)
        checker = cfg.checker if isinstance(cfg, EvalConfig) else cfg.eval.checker
        if checker is not None:
            load_callable(checker, "checker" if isinstance(cfg, EvalConfig) else "eval.checker")
    if isinstance(cfg, PipelineConfig):
        _check_pipeline(cfg)
    _check_sizes(cfg)
    _check_vllm(cfg)
    _check_async(cfg)
    _check_output_dir(Path(cfg.output_dir))
    if not isinstance(cfg, PipelineConfig) and cfg.dataset is not None:  # last: the slowest
        _check_stage_data(cfg)


def _check_required(cfg) -> None:
    """The model keys a stage cannot run without: typed with an empty default so that the Python API
    can fill them with an object it was handed (rloo.training.handed)."""
    if isinstance(cfg, RLConfig) and not cfg.policy:
        raise ConfigError(
            "missing required key 'policy': the starting policy's path (in Python: model=, a loaded model)"
        )
    if isinstance(cfg, RewardConfig) and not (cfg.sft_model or cfg.model):
        raise ConfigError(
            "missing required key 'sft_model': the SFT model's path (or model=PATH; in Python: model=, a loaded model)"
        )
    if isinstance(cfg, RewardConfig) and not cfg.sft_model and cfg.dataset is None and cfg.policy_pairs > 0:
        raise ConfigError(
            f"policy_pairs={cfg.policy_pairs} samples responses from sft_model=PATH, which is not set; "
            f"set it, or policy_pairs=0, or give a dataset"
        )


def _check_stage_data(cfg) -> None:
    """The rows the stage will read, read now: a wrong column or split costs a second, not a model load."""
    ds = cfg.dataset
    if isinstance(cfg, SFTConfig):
        train_records(ds, ("prompt", "completion"))
    elif isinstance(cfg, RewardConfig):
        train_eval_records(ds, ("prompt", "chosen", "rejected"), 1)
    elif isinstance(cfg, RLConfig):
        train_eval_records(ds, ("prompt",), 1)
    elif isinstance(cfg, EvalConfig):  # episodes need no reference completions
        eval_records(ds, ("prompt",) if cfg.env is not None else ("prompt", "completion"), 1)


def _check_output_dir(out: Path) -> None:
    """An output_dir that is (or lies under) a symbolic link loop can be neither read nor made."""
    try:
        os.stat(out)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(
                f"output_dir {str(out)!r} cannot be used: it is or lies under a symbolic link loop; "
                "remove the link or choose another output_dir"
            ) from None


def _check_sizes(cfg) -> None:
    """Completions within the model's context, batches within memory (rloo.runtime.inputs.sizes)."""
    if isinstance(cfg, PipelineConfig):
        shape, model, rl, ev = shape_of(cfg.model, cfg.sft.arch), cfg.model, cfg.rl, cfg.eval
        new_tokens, rl_keys, ev_keys = rl.max_new_tokens, "rl.batch_size x rl.k", "eval.batch_size"
    elif isinstance(cfg, (RLConfig, EvalConfig)):
        shape, model, new_tokens = shape_of(cfg.policy), cfg.policy, cfg.max_new_tokens
        rl, ev = (cfg, cfg.eval) if isinstance(cfg, RLConfig) else (None, cfg)
        rl_keys, ev_keys = "batch_size x k", "eval.batch_size" if rl is not None else "batch_size"
    else:
        return
    what = f"model {model!r}" if model else "the model built from sft.arch"
    check_generation(
        shape, what, "rl.max_new_tokens" if isinstance(cfg, PipelineConfig) else "max_new_tokens", new_tokens
    )
    tokens = cfg.max_prompt_tokens + new_tokens
    world = max(1, int(os.environ.get("WORLD_SIZE", "1")))  # under torchrun each process holds its share
    if rl is not None:
        check_memory(
            shape, cfg.device, f"{rl_keys} = {rl.batch_size} x {rl.k}", -(-rl.batch_size * rl.k // world), tokens, True
        )
    if TASK_SPECS[cfg.task].checker is not None:  # pass@k samples pass_samples per problem at once
        key = ev_keys.replace("batch_size", "pass_samples")
        check_memory(shape, cfg.device, f"{key}={ev.pass_samples}", max(ev.batch_size, ev.pass_samples), tokens, False)


def _check_vllm(cfg) -> None:
    """A policy generation=vllm cannot run, refused here at every max_staleness: at N > 0 the engine
    starts only where the producer first samples, after the run folder is written (rloo.runtime.inputs.vllm_models)."""
    if isinstance(cfg, RLConfig) and cfg.generation == "vllm":
        reason = vllm_cannot_run(cfg.policy, "policy")
    elif isinstance(cfg, PipelineConfig) and cfg.rl.generation == "vllm":  # the RL policy is SFT's from `model`
        reason = vllm_cannot_run(cfg.model, "model")
    else:
        return
    if reason is not None:
        raise RlooError(reason)


def _check_async(cfg) -> None:
    """An asynchronous run's weight ring fits in memory; its producer address is this machine's, free."""
    rl, prefix = (cfg.rl, "rl.") if isinstance(cfg, PipelineConfig) else (cfg, "")
    if not isinstance(rl, RLSettings) or not rl.max_staleness:
        return
    if isinstance(cfg, RLConfig):  # the ring's versions and the sampler's copy
        check_ring_memory(cfg.policy, cfg.device, f"max_staleness={cfg.max_staleness}", cfg.ring_lag + 2)
    if rl.producer_address is not None:
        check_trainer_address(rl.producer_address, f"{prefix}producer_address")


def _model_names(cfg: StageConfig):
    # the pipeline's stage outputs (sft/model, ...) do not exist yet: only the names a user gave
    fields = dict(cfg)  # a pydantic model iterates over its (field, value) pairs; each stage has some MODEL_KEYS
    for key in MODEL_KEYS:
        value = fields.get(key)
        if isinstance(value, str) and value:
            yield key, value
    if isinstance(cfg, PipelineConfig) and isinstance(cfg.reward.model, str):
        yield "reward.model", cfg.reward.model


def _datasets(cfg: StageConfig):
    if cfg.dataset is not None:
        yield "dataset", cfg.dataset
    if isinstance(cfg, PipelineConfig) and cfg.reward.dataset is not None:
        yield "reward.dataset", cfg.reward.dataset


def _looks_like_file(split: str) -> bool:
    return "/" in split or "." in split


def _check_env(cfg: RLConfig | EvalConfig | PipelineConfig) -> bool:
    """Whether `cfg` plays episodes (env=); a user's environment class must load."""
    env = cfg.env
    if env is not None and env not in episode_tasks():  # a built-in one is a task's (TaskSpec.env)
        load_callable(env, "environment")
    return env is not None


def _check_reward_source(cfg: RLConfig, reward_fn) -> None:
    if _check_env(cfg):  # the environment is the reward
        return
    specs = [cfg.reward_fn] if isinstance(cfg.reward_fn, str) else list(cfg.reward_fn or [])
    if cfg.reward_model is None and not specs and reward_fn is None and METHOD_SPECS[cfg.algorithm].online:
        raise ConfigError(
            "no reward source: set reward_model=PATH or reward_fn=module:function (or path/to/file.py:function)"
        )
    if reward_fn is None:
        for spec in specs:
            load_callable(spec, "reward_fn")


def judge_spec(cfg: RLConfig | EvalConfig | PipelineConfig) -> str | None:
    """The judge a config asks for: eval.judge of RL and pipeline configs, judge of `rloo eval`."""
    return cfg.judge if isinstance(cfg, EvalConfig) else cfg.eval.judge


def check_judge(cfg: RLConfig | EvalConfig | PipelineConfig) -> None:
    """The judge exists and can be built from what the config provides."""
    spec = judge_spec(cfg)
    has_rm = isinstance(cfg, PipelineConfig) or cfg.reward_model is not None
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
    elif isinstance(cfg, EvalConfig) and cfg.dataset is not None and not has_rm and cfg.env is None:
        raise ConfigError(
            "nothing to judge the responses with: on a dataset, set judge=module:function "
            "(or path/to/file.py:function), or reward_model=PATH to judge with a reward model"
        )


def _check_pipeline(cfg) -> None:
    """What the pipeline's stages will need from the data, read now rather than after SFT."""
    fns = cfg.rl.reward_fn
    for spec in [fns] if isinstance(fns, str) else list(fns or []):
        load_callable(spec, "rl.reward_fn")
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
    rows = read_records(cfg.dataset, ("prompt", "completion"))
    pairs = None
    if cfg.trains_reward_model():
        try:
            pairs = read_records(cfg.reward.dataset or cfg.dataset, ("prompt", "chosen", "rejected"))
        except RlooError as e:
            if cfg.reward.dataset is not None:  # its keys are reward.dataset.*, not dataset.*
                raise RlooError(str(e).replace(" dataset.", " reward.dataset.")) from e
            raise RlooError(f"{e}; or give the reward stage its own preference data: reward.dataset.path=FILE") from e
    # both sides of the split are needed: SFT, RM and RL train on one, the evaluations read the other
    for settings, records in ((cfg.dataset, rows), (cfg.reward.dataset, pairs)):
        if settings is not None and records is not None and settings.eval_split is None:
            check_sides(settings, split_records(records, settings.eval_fraction), len(records))
    survey_pipeline(cfg)  # a later stage that would refuse its cut data refuses now, not after SFT
