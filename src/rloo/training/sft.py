"""Supervised fine-tuning on the task's reference responses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rloo.config import SFTConfig
from rloo.core.losses import sft_loss
from rloo.data.collate import Encoded, encode_completions, encode_prompts, environment_token_mask, trim_left, trim_right
from rloo.data.lengths import context_of, cut_metrics, prompt_cut, report_cuts, save_cuts, target_cut
from rloo.data.preflight import check_config
from rloo.data.split import text_field, train_records
from rloo.errors import RlooError
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.loading import (
    build_llama,
    enable_gradient_checkpointing,
    load_policy,
    load_tokenizer,
    model_options,
    save_pretrained_atomic,
)
from rloo.modeling.lora import add_lora, for_saving
from rloo.runtime.checkpoint.resumecheck import prompts_digest
from rloo.runtime.inputs.fingerprint import fingerprints
from rloo.runtime.precision import stage_precision
from rloo.runtime.runfolder.lock import holds_run_folder
from rloo.runtime.tracking.log import progress, say
from rloo.tasks import Example, get_task
from rloo.tasks.base import MarksEnvironmentWords
from rloo.tasks.tokenizer import build_tokenizer
from rloo.training.callbacks import Callbacks
from rloo.training.common import (
    adamw,
    after_step,
    batch_loss,
    check_device,
    note_builtin_task,
    prepare_output_dir,
    seed_everything,
    supervised_step,
    warmup_cosine,
)
from rloo.training.guard import StageGuard
from rloo.training.supervised import StageRun, check_stage_resume, resume_point, steps_of, trainable


@dataclass
class SFTResult:
    model_path: Path
    final_loss: float


def _loss(model, prompts, targets, loss_mask, idx, device):
    """sft_loss of examples idx over their `loss_mask` tokens (the policy's: targets.mask less the
    environment's words in an episode trace): prompts and targets trimmed to the longest, one pass."""
    p_ids, p_mask = trim_left(prompts.ids[idx], prompts.mask[idx])
    c_ids, c_mask = trim_right(targets.ids[idx], targets.mask[idx])
    lp = completion_logprobs(model, p_ids.to(device), p_mask.to(device), c_ids.to(device), c_mask.to(device))
    return sft_loss(lp, loss_mask[idx][:, : c_ids.shape[1]].to(device))


def sft_loss_mask(task, tokenizer, examples: list[Example], targets: Encoded, policy_only: bool) -> torch.Tensor:
    """The target tokens SFT trains on: all of them, or with `policy_only` less the words the environment
    wrote in a task's episode traces (Task.environment_words; sft.observation_loss=false), said in one line."""
    env_words = task.environment_words if policy_only and isinstance(task, MarksEnvironmentWords) else None
    if env_words is None:
        return targets.mask
    refs = [e.reference for e in examples]
    env = environment_token_mask(tokenizer, refs, [env_words(r) for r in refs], targets)
    if env.any():
        say(f"sft: {int(env.sum())} environment tokens of {int(env.any(-1).sum())} episode traces left out of the loss")
    return targets.mask & ~env


def _train(run: StageRun, loss_of, mask, cut_stats: dict) -> None:
    """The SFT steps from `run`'s position to its end. `loss_of(idx)`: (sft_loss, stats) of rows idx;
    `cut_stats`: what the length limits cut (rloo.data.lengths), logged at step 0 when not empty."""
    cfg, opt = run.cfg, run.opt
    log, bar = run.logger(), progress(run.total, "sft", initial=run.step)
    if cut_stats and run.step == 0:
        log.log(0, cut_stats)
    run.model.train()
    try:  # closed however the loop ends (a signal, an error): no TensorBoard writer thread left running
        with run.stop:
            for idx in run.batches():
                # one pass, or micro-batches weighted by their target tokens (sft_loss is a token mean)
                loss, stats = batch_loss(idx, cfg.micro_batch_size, loss_of, mask)
                lr = supervised_step(run.guard, opt, run.sched, loss, run.step + 1)
                value, stats = after_step(loss, stats)
                ema = run.extra.get("loss_ema")
                run.extra["loss_ema"] = loss_ema = value if ema is None else 0.95 * ema + 0.05 * value
                log.log(run.step + 1, {**stats, "lr": lr})
                bar.set_postfix(loss=f"{loss_ema:.3f}")
                bar.update()
                run.end_step()  # a checkpoint every save_every steps, and on SIGINT/SIGTERM
    finally:
        bar.close()
        log.close()


@holds_run_folder
@stage_precision
def sft(cfg: SFTConfig, *, resume: bool = False, overwrite: bool = False, callbacks: list | None = None) -> SFTResult:
    """Fine-tune a causal LM on (prompt, reference) pairs; loss on response tokens only. `resume`
    continues from the newest whole checkpoint in `cfg.output_dir`, bit for bit. `callbacks`: hooks
    into the loop (rloo.training.callbacks)."""
    check_config(cfg)
    device = check_device(cfg.device)
    task = get_task(cfg.task)
    gen = seed_everything(cfg.seed)
    ckpt, state = resume_point(cfg) if resume else (None, None)
    # 1. tokenizer and model: loaded by path, or built for the task
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.trust_remote_code) if cfg.tokenizer else None
    if cfg.lora is not None and cfg.lora.save == "adapter" and not cfg.model:
        raise RlooError("sft: lora.save=adapter needs model=PATH (adapters name their base model on disk)")
    if cfg.model:
        model, model_tok = load_policy(cfg.model, **model_options(cfg))
        tokenizer = tokenizer or model_tok
        note_builtin_task(cfg, tokenizer, task, cfg.model)
        model = add_lora(model, cfg.lora) if cfg.lora is not None else model
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
    elif cfg.dataset is not None and tokenizer is None:
        raise RlooError(
            "sft on a dataset needs model=PATH (or tokenizer=PATH): the built-in word tokenizer "
            "only knows the built-in task's words"
        )
    else:
        tokenizer = tokenizer or build_tokenizer(task)
        # transformers wraps PreTrainedModel.to with functools.wraps, which its types read as unbound
        model = build_llama(cfg.arch, tokenizer, cfg.seed).to(device)  # pyright: ignore[reportArgumentType]
        model = add_lora(model, cfg.lora) if cfg.lora is not None else model
    # 2. data: the dataset's (prompt, completion) pairs, less its held-out rows, or the task's
    #    mixed-quality references
    if cfg.dataset is not None:
        examples = [
            Example(r.prompt, text_field(r.completion))
            for r in train_records(cfg.dataset, ("prompt", "completion"), tokenizer=tokenizer)
        ]
    else:
        examples = task.examples("sft", cfg.num_examples, seed=cfg.seed)
    prompts, _ = encode_prompts(tokenizer, [e.prompt for e in examples], cfg.max_prompt_tokens)
    targets = encode_completions(tokenizer, [e.reference for e in examples], cfg.max_response_tokens)
    cuts = [prompt_cut(prompts, cfg.max_prompt_tokens), target_cut(targets, cfg.max_response_tokens)]
    report_cuts("sft", cuts, cfg.max_cut_share, context_of(model))  # refused: nothing written
    data_sha, inputs = prompts_digest([x for e in examples for x in (e.prompt, e.reference)]), fingerprints(cfg)
    if ckpt is not None and state is not None:  # every refusal before the run folder is touched
        check_stage_resume(cfg, ckpt, state, steps_of(cfg, len(examples)), data_sha, inputs, trainable(model))
    out = prepare_output_dir(cfg, resume=resume, overwrite=overwrite, can_resume=True)
    save_cuts(out, cuts)
    # 3. train, from the newest checkpoint with `resume` (rloo.training.supervised)
    opt = adamw(model.parameters(), cfg.lr, cfg.weight_decay)
    total = steps_of(cfg, len(examples))
    sched = warmup_cosine(opt, total, warmup=max(1, total // 20))
    guard = StageGuard("sft", model.parameters(), opt)
    run = StageRun("sft", cfg, out, model, tokenizer, opt, sched, gen, guard, len(examples), data_sha)
    run.inputs = inputs
    run.callbacks = Callbacks(callbacks, cfg, total, model, tokenizer)
    run.start(ckpt, state, resume)
    policy_only = cfg.dataset is None and not cfg.observation_loss  # a dataset's completions are the policy's
    loss_mask = sft_loss_mask(task, tokenizer, examples, targets, policy_only)
    _train(run, lambda i: _loss(model, prompts, targets, loss_mask, i, device), loss_mask, cut_metrics(cuts))
    guard.finish()
    # as RL saves: full weights, or with LoRA the adapters merged in (lora.save=merged) or alone
    save_pretrained_atomic(for_saving(model, cfg.lora), tokenizer, out / "model")
    loss_ema = run.extra["loss_ema"]
    say(f"sft: saved {out / 'model'} (loss {loss_ema:.3f} after {run.step} steps)")
    return SFTResult(out / "model", float(loss_ema))
