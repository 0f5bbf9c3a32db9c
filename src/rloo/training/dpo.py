"""DPO (Rafailov et al. 2023) on the preference pairs the reward model was trained on.

Offline: nothing is sampled during training.
  1. the reward model's training pairs (pairs.jsonl next to cfg.reward_model, written by
     `rloo reward`), at most `algorithm_settings.dpo_pairs` of them; without a reward model, fresh reference
     pairs from `preference_pairs(task, algorithm_settings.dpo_pairs, seed)`
  2. the frozen reference is the SFT model (cfg.policy); its log-probs are computed once
  3. dpo_epochs passes of the DPO loss (eq. 7) over shuffled batches of pairs
Periodic and final evaluations are the online loop's (same prompts, same judge, same sampling).
Checkpoints and resume are SFT's and the reward model's (rloo.training.supervised.StageRun): every
`save_every` steps and on SIGINT/SIGTERM; `resume` continues bit for bit (the reference's log-probs,
a function of the frozen reference and the pairs, are computed again rather than saved).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rloo.algorithms.base import Models
from rloo.config import ONLINE_ALGORITHMS, RLConfig
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import dpo_loss
from rloo.data.collate import batches
from rloo.data.lengths import context_of, cut_metrics, report_cuts, save_cuts
from rloo.data.preferences import encode_pairs, pair_cuts, pair_rows, preference_pairs
from rloo.errors import ConfigError, RlooError
from rloo.modeling.dropout import maybe_disable_dropout
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.forward_shared import completion_logprobs_shared
from rloo.modeling.loading import frozen, load_policy, load_reward_model, save_pretrained_atomic
from rloo.rewards import RewardModelScorer
from rloo.runtime.checkpoint.resumecheck import prompts_digest
from rloo.runtime.inputs.fingerprint import fingerprints
from rloo.runtime.precision import stage_precision
from rloo.runtime.runfolder.reading import read_text
from rloo.runtime.tracking.log import progress, say
from rloo.tasks import get_task
from rloo.training.common import (
    adamw,
    after_step,
    batch_loss,
    check_device,
    prepare_output_dir,
    seed_everything,
    warmup_constant,
)
from rloo.training.evalset import EvalSet, eval_metrics, train_and_eval_prompts
from rloo.training.guard import StageGuard
from rloo.training.loop import RLResult
from rloo.training.supervised import Plan, StageRun, check_stage_resume, resume_point, steps_of, trainable


def _pair_logprobs(model, prompts, comps, idx, device, share: bool = True):
    """Summed completion log-probs of pairs idx: (chosen (n,), rejected (n,)), one forward pass. With
    `share`, each pair's rows sit side by side (a group of k=2 rows with one prompt), so the prompt is
    computed once for both (`completion_logprobs_shared`, the same values as the plain pass)."""
    p_ids, p_mask, c_ids, c_mask = pair_rows(prompts, comps, idx)
    args = (model, p_ids.to(device), p_mask.to(device), c_ids.to(device), c_mask.to(device))
    lp = completion_logprobs_shared(*args, k=2) if share else completion_logprobs(*args)
    seq = sequence_logprobs(lp, args[-1]).view(-1, 2)
    return seq[:, 0], seq[:, 1]


def load_pairs(cfg: RLConfig, task) -> list[tuple[str, str, str]]:
    """The reward model's own training pairs when it has them, else fresh reference pairs."""
    path = Path(cfg.reward_model).parent / "pairs.jsonl" if cfg.reward_model else None
    if path is not None and path.exists():
        pairs = [tuple(json.loads(line)) for line in read_text(path).splitlines() if line.strip()]  # no FIFO
        return pairs[: cfg.algorithm_settings.dpo_pairs]
    say(
        f"dpo: no reward-model pairs found{f' at {path}' if path else ''}; labeling "
        f"{cfg.algorithm_settings.dpo_pairs} fresh reference pairs"
    )
    return preference_pairs(task, cfg.algorithm_settings.dpo_pairs, cfg.seed)


def _load(cfg: RLConfig) -> Models:
    policy, tok = load_policy(cfg.policy, device=cfg.device)
    ref = frozen(load_policy(cfg.policy, device=cfg.device)[0])
    scorer = None
    if cfg.reward_model is not None:  # only for the RM score in evaluations; DPO never reads it
        rm, rm_tok = load_reward_model(cfg.reward_model, device=cfg.device)
        scorer = RewardModelScorer(frozen(rm), rm_tok, policy_tokenizer=tok)
    # DPO's loss compares the policy's and the reference's log-probs of the same pairs as one function
    maybe_disable_dropout(policy, cfg.disable_dropout)
    policy.train()
    return Models(policy, ref, tok, scorer)


def check_dpo_arguments(prompts, reward_fn) -> None:
    """`train(prompts=..., reward_fn=...)` with algorithm=dpo is refused rather than ignored.

    Using them would be a different method: DPO on pairs sampled from the policy and ranked by
    reward_fn is online DPO, whose pairs come from another distribution than the offline
    baseline's (the pairs the reward model was trained on), so it is not offered under this name.
    """
    given = [name for name, v in (("prompts", prompts), ("reward_fn", reward_fn)) if v is not None]
    if given:
        raise ConfigError(
            f"algorithm='dpo' trains offline on preference pairs (the reward model's pairs.jsonl, "
            f"or the task's) and samples nothing, so train({', '.join(g + '=...' for g in given)}) "
            f"would be ignored; call train(cfg) without {' and '.join(given)}, or pick an online "
            f"method (algorithm={', '.join(repr(n) for n in ONLINE_ALGORITHMS[:3])}, ...) to train on them"
        )


def dpo_plan(cfg: RLConfig) -> Plan:
    """DPO's passes over its pairs (rloo.training.supervised.Plan): its own epochs, batch size and lr."""
    s = cfg.algorithm_settings
    return Plan(s.dpo_epochs, s.dpo_batch_size, s.dpo_lr)


def _reference_logprobs(
    models: Models, prompts, comps, n: int, device, share: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen reference's summed log-probs of the `n` pairs, (chosen (n,), rejected (n,)), computed once."""
    with torch.no_grad():
        ref = [_pair_logprobs(models.ref, prompts, comps, idx, device, share) for idx in batches(n, 256, shuffle=False)]
    return torch.cat([c for c, _ in ref]), torch.cat([r for _, r in ref])


def _eval_set(cfg: RLConfig, task, models: Models) -> EvalSet:
    """The periodic evaluation's prompts: a dataset's held-out rows (rloo.data.split), never among the
    reward model's pairs, or the task's eval split."""
    if cfg.dataset is not None:
        return train_and_eval_prompts(cfg, task, None, models)[1]
    return EvalSet.of_task(task, task.examples(cfg.eval_split, cfg.eval_prompts, seed=cfg.seed))


def _train(run: StageRun, models: Models, eval_set: EvalSet, pair_loss, cut_stats: dict) -> tuple[list[dict], dict]:
    """The DPO steps from `run`'s position to its end, each `eval_every`-th preceded by an evaluation,
    then the final evaluation and model. `pair_loss(idx)`: (dpo_loss, stats) of pairs idx. Returns
    (the records logged by this process, the final evaluation)."""
    cfg, history = run.cfg, []
    log, bar = run.logger(), progress(run.total, cfg.algorithm, initial=run.step)

    def record(s, metrics):
        log.log(s, metrics)
        history.append({"step": s, **metrics})

    if cut_stats and run.step == 0:
        log.log(0, cut_stats)
    # the eval line's "step s/N": N is DPO's own step count, not the online methods' rl.steps
    ev_cfg = cfg.model_copy(update={"steps": run.total})
    try:  # closed however the loop ends (a signal, an error): no TensorBoard writer thread left running
        with run.stop:
            for idx in run.batches():
                if cfg.eval_every and run.step % cfg.eval_every == 0:
                    record(run.step, eval_metrics(models, eval_set, ev_cfg, run.step))
                # one pass, or rl.micro_batch_size pairs per pass (the DPO loss is a mean over pairs)
                loss, stats = batch_loss(idx, cfg.micro_batch_size, pair_loss)
                grad_norm, _ = run.guard.step(loss, run.step + 1, cfg.max_grad_norm)
                run.sched.step()
                if (run.step + 1) % cfg.log_every == 0:
                    record(run.step + 1, after_step(loss, stats)[1] | {"grad/norm": grad_norm})
                bar.update()
                run.end_step()  # a checkpoint every save_every steps, and on SIGINT/SIGTERM
            run.guard.finish()
            # past the last step a signal no longer interrupts (as in the online loop): finishing is
            # quicker than resuming
            final = eval_metrics(models, eval_set, ev_cfg, run.step)
            record(run.step, final)
            save_pretrained_atomic(models.policy, models.tokenizer, run.out / "model")
    finally:
        bar.close()
        log.close()
    return history, final


@stage_precision
def train_dpo(cfg: RLConfig, *, resume: bool = False, overwrite: bool = False) -> RLResult:
    """Fine-tune cfg.policy with DPO; returns the online loop's RLResult (history, final eval). `resume`
    continues from the newest whole checkpoint in `cfg.output_dir`, bit for bit (rloo.training.supervised)."""
    if cfg.reward_fn is not None:
        raise RlooError("dpo trains on the task's preference pairs; reward_fn does not apply")
    device = check_device(cfg.device)
    gen = seed_everything(cfg.seed)
    task = get_task(cfg.task)
    ckpt, state = resume_point(cfg) if resume else (None, None)
    models = _load(cfg)
    # 1. the reward model's pairs (same seed, same first n)
    pairs = load_pairs(cfg, task)
    prompts, comps = encode_pairs(models.tokenizer, pairs, cfg)
    cuts = report_cuts(cfg.algorithm, pair_cuts(prompts, comps, cfg), cfg.max_cut_share, context_of(models.policy))
    plan, data_sha, inputs = dpo_plan(cfg), prompts_digest([x for p in pairs for x in p]), fingerprints(cfg)
    if ckpt is not None and state is not None:  # every refusal before the run folder is touched
        how = "use the same preference pairs (algorithm_settings.dpo_pairs, the reward model's pairs.jsonl)"
        total = steps_of(plan, len(pairs))
        check_stage_resume(cfg, ckpt, state, total, data_sha, inputs, trainable(models.policy), how)
    out = prepare_output_dir(cfg, resume=resume, overwrite=overwrite, can_resume=True)
    save_cuts(out, cuts)
    # 2. the reference's log-probs, once
    ref_c, ref_r = _reference_logprobs(models, prompts, comps, len(pairs), device, cfg.share_prompt)
    eval_set = _eval_set(cfg, task, models)
    # 3. DPO epochs, from the newest checkpoint with `resume` (rloo.training.supervised)
    opt = adamw(models.policy.parameters(), plan.lr)
    sched = warmup_constant(opt, cfg.warmup_steps)
    guard = StageGuard(cfg.algorithm, models.policy.parameters(), opt, cfg.max_skipped_steps, cfg.max_param_growth)
    run = StageRun(
        cfg.algorithm, cfg, out, models.policy, models.tokenizer, opt, sched, gen, guard, len(pairs), data_sha, plan
    )
    run.inputs = inputs
    run.start(ckpt, state, resume)

    def pair_loss(idx):
        pc, pr = _pair_logprobs(models.policy, prompts, comps, idx, device, cfg.share_prompt)
        return dpo_loss(pc, pr, ref_c[idx], ref_r[idx], cfg.algorithm_settings.dpo_beta)

    history, final = _train(run, models, eval_set, pair_loss, cut_metrics(cuts))
    win = final["eval/win_rate"]
    say(f"dpo: saved {out / 'model'} after {run.step} steps on {len(pairs)} pairs (win rate {win:.3f})")
    return RLResult(out / "model", history, final)
