"""Reward-model training on simulated preference pairs with the Bradley-Terry loss."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rloo.config import RewardConfig, Sampling
from rloo.core.losses import bradley_terry_loss
from rloo.data.collate import batches
from rloo.data.lengths import context_of, cut_metrics, report_cuts, save_cuts
from rloo.data.preferences import encode_pairs, pair_cuts, pair_rows, preference_pairs
from rloo.data.preflight import check_config
from rloo.data.split import text_field, train_eval_records
from rloo.errors import RlooError, option
from rloo.modeling.dropout import has_dropout, maybe_disable_dropout
from rloo.modeling.forward import reward_scores
from rloo.modeling.forward_shared import reward_scores_shared
from rloo.modeling.loading import (
    enable_gradient_checkpointing,
    load_policy,
    load_reward_model,
    model_options,
    save_pretrained_atomic,
)
from rloo.modeling.lora import add_lora, for_saving, trained_network
from rloo.rollout import rollout
from rloo.runtime.checkpoint.resumecheck import prompts_digest
from rloo.runtime.inputs.fingerprint import fingerprints
from rloo.runtime.precision import stage_precision
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.lock import holds_run_folder
from rloo.runtime.tracking.log import progress, say
from rloo.tasks import get_task
from rloo.training.callbacks import Callbacks
from rloo.training.common import (
    adamw,
    after_step,
    batch_loss,
    check_device,
    prepare_output_dir,
    seed_everything,
    supervised_step,
    warmup_cosine,
)
from rloo.training.guard import StageGuard
from rloo.training.supervised import StageRun, check_stage_resume, resume_point, steps_of, trainable


@dataclass
class RewardResult:
    model_path: Path
    accuracy_vs_labeler: float  # held-out pairs: RM agrees with the simulated labeler's choice
    accuracy_vs_gold: float | None  # held-out pairs with distinct gold scores: RM ranks like the gold judge
    # (None with a dataset: there is no gold judge)


def policy_sampler(model_path: str, cfg, generator: torch.Generator):
    """prompts -> one sampled completion each, from the causal LM at `model_path` (temperature 1)."""
    policy, tok = load_policy(model_path, device=cfg.device)
    policy.eval()

    s = Sampling(max_new_tokens=cfg.max_response_tokens, max_prompt_tokens=cfg.max_prompt_tokens)

    def sample_texts(prompts: list[str]) -> list[str]:
        out = []
        for i in range(0, len(prompts), 512):
            out += rollout(policy, tok, prompts[i : i + 512], 1, s, generator=generator).completions
        return out

    return sample_texts


def _score(model, prompts, comps, idx, device, share: bool = False):
    """Scores of pairs idx, as (chosen (n,), rejected (n,)); both in one forward pass. With `share`,
    each pair's rows sit side by side (a group of k=2 rows with one prompt), so the prompt is computed
    once for both (`reward_scores_shared`, the same values as the plain pass)."""
    p_ids, p_mask, c_ids, c_mask = pair_rows(prompts, comps, idx)
    args = (model, p_ids.to(device), p_mask.to(device), c_ids.to(device), c_mask.to(device))
    s = (reward_scores_shared(*args, k=2) if share else reward_scores(*args)).view(-1, 2)
    return s[:, 0], s[:, 1]


def _shares_prompts(model, cfg: RewardConfig) -> bool:
    """Can training score a pair's two rows with one prompt pass: the same function as two passes
    (no dropout to draw per row) and no gradient checkpointing (transformers' own would drop the
    prompt's keys/values inside checkpointed layers; the policy's shared pass has its own, this one not)."""
    return not cfg.gradient_checkpointing and not has_dropout(model)


@torch.no_grad()
def evaluate_reward_model(model, tokenizer, task, pairs, cfg, device) -> tuple[float, float | None]:
    model.eval()
    prompts, comps = encode_pairs(tokenizer, pairs, cfg)
    agree_label, agree_gold, n_gold = 0, 0, 0
    for idx in batches(len(pairs), cfg.batch_size, shuffle=False):
        c, r = _score(model, prompts, comps, idx, device, share=True)  # eval mode, no gradient
        agree_label += int((c > r).sum())
        if task is None:  # no gold judge (a dataset's pairs): agreement with the labels only
            continue
        for j, i in enumerate(idx.tolist()):
            p, ch, rj = pairs[i]
            gc, gr = task.gold_score(p, ch), task.gold_score(p, rj)
            if abs(gc - gr) > 1e-9:
                n_gold += 1
                agree_gold += int((c[j] > r[j]) == (gc > gr))
    return agree_label / len(pairs), (agree_gold / max(1, n_gold) if task is not None else None)


def _train(run: StageRun, log, loss_of) -> None:
    """The Bradley-Terry steps from `run`'s position to its end, logged to `log`. `loss_of(idx)`:
    (loss, stats) of pairs idx."""
    cfg = run.cfg
    bar = progress(run.total, "reward model", initial=run.step)
    run.model.train()
    try:
        for idx in run.batches():
            # one pass, or micro-batches of pairs (the Bradley-Terry loss is a mean over pairs)
            loss, stats = batch_loss(idx, cfg.micro_batch_size, loss_of)
            supervised_step(run.guard, run.opt, run.sched, loss, run.step + 1)
            value, stats = after_step(loss, stats)
            log.log(run.step + 1, {"loss/rm": value, **stats})
            bar.set_postfix(loss=f"{value:.3f}", acc=f"{stats['rm/accuracy']:.2f}")
            bar.update()
            run.end_step()  # a checkpoint every save_every steps, and on SIGINT/SIGTERM
    finally:
        bar.close()


def _reward_model(cfg: RewardConfig):
    """(the model to train: a one-output head on cfg.model or the SFT model, with LoRA adapters when
    asked, its score head then trained in full; its tokenizer)."""
    model, tokenizer = load_reward_model(cfg.model or cfg.sft_model, **model_options(cfg))
    model.config.pad_token_id = tokenizer.pad_token_id
    maybe_disable_dropout(model, cfg.disable_dropout)
    if cfg.lora is not None:
        model = add_lora(model, cfg.lora, score_head=True)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model, tokenizer


def _is_pair(p) -> bool:
    return isinstance(p, list) and len(p) == 3 and all(isinstance(x, str) for x in p)


def _pairs(cfg: RewardConfig, task, gen, state: dict | None):
    """(train pairs, held-out pairs) of the simulated labeler: from the resumed checkpoint (sampled
    once, with the generator the checkpoint restores), else sampled now (`policy_pairs` of them
    from the SFT model)."""
    if state is not None:
        saved = json.loads(state["extra"]).get("pairs")  # an object: rloo.runtime.checkpoint.verify.checked_state
        lists = [saved.get(k) if isinstance(saved, dict) else None for k in ("train", "held_out")]
        train, held_out = (v if isinstance(v, list) and all(_is_pair(p) for p in v) else None for v in lists)
        if train is None or held_out is None:
            raise RlooError(
                f"cannot resume from {cfg.output_dir}: its checkpoint's preference pairs are not the lists of "
                f"(prompt, chosen, rejected) texts rloo writes; the checkpoint was changed after it was written: "
                f"delete it, or rerun with {option('overwrite')} (nothing was changed)"
            )
        return [tuple(p) for p in train], [tuple(p) for p in held_out]
    sampler = policy_sampler(cfg.sft_model, cfg, gen) if cfg.policy_pairs > 0 else None
    pairs = preference_pairs(task, cfg.num_pairs + cfg.eval_pairs, cfg.seed, sampler, cfg.policy_pairs)
    return pairs[: cfg.num_pairs], pairs[cfg.num_pairs :]


@holds_run_folder
@stage_precision
def train_reward(
    cfg: RewardConfig, *, resume: bool = False, overwrite: bool = False, callbacks: list | None = None
) -> RewardResult:
    """Train r_psi(x, y) from the SFT model: loss = -log sigmoid(r(x, y_c) - r(x, y_r)). `resume`
    continues from the newest whole checkpoint in `cfg.output_dir`, bit for bit."""
    check_config(cfg)
    device = check_device(cfg.device)
    task = get_task(cfg.task)
    gen = seed_everything(cfg.seed)
    ckpt, state = resume_point(cfg) if resume else (None, None)
    model, tokenizer = _reward_model(cfg)
    net = trained_network(model)  # what the scoring passes call (the adapters in place under LoRA)
    # 1. preference pairs, the last eval_pairs held out (a dataset: its eval split or held-out rows,
    #    rloo.data.split, loaded before anything is written so that a bad dataset leaves no run folder;
    #    sampled ones come from the checkpoint when resuming)
    if cfg.dataset is not None:
        train_recs, held_recs = train_eval_records(
            cfg.dataset, ("prompt", "chosen", "rejected"), cfg.eval_pairs, tokenizer=tokenizer
        )
        train_pairs, held_out = (
            [(r.prompt, text_field(r.chosen), text_field(r.rejected)) for r in rs] for rs in (train_recs, held_recs)
        )
        task = None
    else:  # sampled before the run folder is touched, so that a refusal below writes nothing
        train_pairs, held_out = _pairs(cfg, task, gen, state)
    prompts, comps = encode_pairs(tokenizer, train_pairs, cfg)
    cuts = report_cuts("reward", pair_cuts(prompts, comps, cfg), cfg.max_cut_share, context_of(model))
    inputs = fingerprints(cfg)
    if ckpt is not None and state is not None:  # every refusal before the run folder is touched
        n = steps_of(cfg, len(train_pairs))
        check_stage_resume(cfg, ckpt, state, n, _digest(train_pairs), inputs, trainable(model))
    out = prepare_output_dir(cfg, resume=resume, overwrite=overwrite, can_resume=True)
    save_cuts(out, cuts)
    # kept so that DPO can train on exactly these pairs (rloo.training.dpo)
    atomic_write_text(out / "pairs.jsonl", "".join(json.dumps(p) + "\n" for p in train_pairs))
    # 2. Bradley-Terry training, from the newest checkpoint with `resume` (rloo.training.supervised)
    opt = adamw(model.parameters(), cfg.lr)
    total = steps_of(cfg, len(train_pairs))
    sched = warmup_cosine(opt, total, warmup=max(1, total // 20))
    guard = StageGuard("reward", model.parameters(), opt)
    run = StageRun(
        "reward model", cfg, out, model, tokenizer, opt, sched, gen, guard, len(train_pairs), _digest(train_pairs)
    )
    run.inputs = inputs
    run.callbacks = Callbacks(callbacks, cfg, total, model, tokenizer)
    if cfg.dataset is None:  # sampled: a resume reads them back rather than sampling again
        run.extra["pairs"] = {"train": train_pairs, "held_out": held_out}
    run.start(ckpt, state, resume)
    share = _shares_prompts(net, cfg)
    log = run.logger()
    if (cut_stats := cut_metrics(cuts)) and run.step == 0:
        log.log(0, cut_stats)
    try:  # closed however the stage ends (a signal, an error): no TensorBoard writer thread left running
        with run.stop:
            _train(run, log, lambda i: bradley_terry_loss(*_score(net, prompts, comps, i, device, share)))
            # 3. held-out accuracy against the labeler and against the gold judge
            acc_label, acc_gold = evaluate_reward_model(net, tokenizer, task, held_out, cfg, device)
            gold_metric = {"eval/accuracy_vs_gold": acc_gold} if acc_gold is not None else {}
            log.log(run.step, {"eval/accuracy_vs_labeler": acc_label} | gold_metric)
            if run.stop.signum is not None:  # arrived during the held-out evaluation: saved at the last step
                raise run.interrupted()
    finally:
        log.close()
    guard.finish()
    save_pretrained_atomic(for_saving(model, cfg.lora), tokenizer, out / "model")  # as sft and RL save
    atomic_write_text(out / "accuracy.json", json.dumps({"vs_labeler": acc_label, "vs_gold": acc_gold}, indent=2))
    gold = f", {acc_gold:.3f} vs gold judge" if acc_gold is not None else ""
    say(f"reward: held-out pairwise accuracy {acc_label:.3f} vs {'labeler' if task else 'dataset labels'}{gold}")
    return RewardResult(out / "model", acc_label, acc_gold)


def _digest(pairs) -> str:
    """The training pairs' digest a resume compares (rloo.runtime.checkpoint.resumecheck.prompts_digest)."""
    return prompts_digest([x for p in pairs for x in p])
