"""PPO for RLHF (Schulman et al. 2017; Ouyang et al. 2022) and the paper's vanilla policy gradient.

Token-level actions:
  1. sample K completions per prompt, score them, reference log-probs
  2. per-token reward: -beta * KL_t on every token, the reward-model score added at the last one
  3. values V_t of the value model (a separate model, or a head on the policy); GAE(gamma, lambda)
     gives advantages and returns; advantages are whitened per batch
  4. ppo_epochs x num_minibatches steps on the clipped surrogate, the value model on its own loss
Vanilla policy gradient (Ahmadian et al. 2024 sec. 3): the same with lambda = 1, one pass, no ratio
and no clipping (`token_policy_gradient_loss`). Samples of an older policy (rl.max_staleness,
rl.is_correction): the KL reward of the current policy (eq. A1), decoupled clipping to it and the
weight of it to the sampler's (docs/async.md eq. A3), its log-probs from the value pass. The value
model and its optimizer are algorithm state: `state_dict` holds them for checkpoints.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

from rloo.algorithms.base import Accumulated, Models, StepResult, guarded_step, policy_truncation
from rloo.algorithms.common import (
    Timer,
    mean_stats,
    micro_parts,
    minibatches,
    require_scored,
    rollout_stats,
    sample_and_score,
    sequence_rewards,
)
from rloo.algorithms.offpolicy import floats, token_weights
from rloo.config import RLConfig
from rloo.core.accumulation import micro_shares
from rloo.core.advantages import gae, whiten
from rloo.core.kl import token_level_rewards
from rloo.core.logprobs import head_token_logprobs, token_logprobs
from rloo.core.losses import ppo_clip_loss, token_policy_gradient_loss, value_loss, weigh
from rloo.data.collate import position_ids
from rloo.modeling.dropout import maybe_disable_dropout
from rloo.modeling.forward import MAX_LOGITS_MB, chunked_head, reward_backbone
from rloo.modeling.loading import load_reward_model
from rloo.runtime.precision import refresh_casts_after_step


def hidden_states(model, p_ids, p_mask, c_ids, c_mask, want_logits: bool):
    """Final hidden states at the T positions that predict completion tokens, (N, T, H), and the
    logits there (N, T, V) when asked. Position P-1+t sees the prompt and y_<t: the state of step t."""
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    P, T = p_ids.shape[1], c_ids.shape[1]
    kw = dict(input_ids=ids, attention_mask=mask.long(), position_ids=position_ids(mask), use_cache=False)
    if want_logits:
        out = model(**kw, output_hidden_states=True, logits_to_keep=T + 1)
        return out.hidden_states[-1][:, P - 1 : P - 1 + T], out.logits[:, :-1]
    return reward_backbone(model)(**kw).last_hidden_state[:, P - 1 : P - 1 + T], None


class ValueFunction:
    """V(x, y_<t) per token. 'separate': its own model, started from the reward model (as in
    Ouyang et al. 2022) or from the policy when the reward is a function; 'head': a linear head
    on the policy's last hidden state, so the value loss also trains the policy's body."""

    def __init__(self, cfg: RLConfig, models: Models):
        self.kind = cfg.algorithm_settings.value_model
        if self.kind == "separate":
            self.model, _ = load_reward_model(cfg.reward_model or cfg.policy, device=cfg.device)
            maybe_disable_dropout(self.model, cfg.disable_dropout)
            self.model.train()
            params = list(self.model.parameters())
        else:
            width = cast(PretrainedConfig, models.policy.config).hidden_size
            self.model = nn.Linear(width, 1).to(cfg.device)
            nn.init.zeros_(self.model.weight)
            nn.init.zeros_(self.model.bias)
            params = list(self.model.parameters())
        self.params = params
        self.opt = refresh_casts_after_step(
            torch.optim.AdamW(params, lr=cfg.algorithm_settings.value_lr, betas=(0.9, 0.95))
        )

    def forward(
        self, policy, p_ids, p_mask, c_ids, c_mask, temperature: float, max_logits_mb: float = MAX_LOGITS_MB, trunc=None
    ) -> tuple[Tensor, Tensor]:
        """(token log-probs (N, T), values (N, T)) in one pass of the policy (+ the value model).
        Large vocabularies: the LM head runs in chunks, as in `rloo.modeling.forward.lm_token_logprobs`.
        trunc: the log-probs of the sampler's truncated distribution (`policy_truncation`)."""
        chunked = chunked_head(policy, c_ids.numel(), max_logits_mb)
        if chunked is None:
            hidden, logits = hidden_states(policy, p_ids, p_mask, c_ids, c_mask, want_logits=True)
            assert logits is not None
            logprobs = token_logprobs(logits.float(), c_ids, temperature=temperature, truncation=trunc)
        else:
            (head, chunk), (hidden, _) = chunked, hidden_states(policy, p_ids, p_mask, c_ids, c_mask, want_logits=False)
            logprobs = head_token_logprobs(hidden, head.weight, head.bias, c_ids, temperature, chunk, trunc)
        if self.kind == "head":
            return logprobs, self.model(hidden).squeeze(-1).float()
        v_hidden, _ = hidden_states(self.model, p_ids, p_mask, c_ids, c_mask, want_logits=False)
        score = cast(nn.Module, self.model.score)  # the reward model's one-output head
        return logprobs, score(v_hidden).squeeze(-1).float()

    def state_dict(self) -> dict:
        return {"value_model": self.model.state_dict(), "value_optimizer": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["value_model"])
        self.opt.load_state_dict(state["value_optimizer"])


class Targets(NamedTuple):
    """A batch's fixed targets: advantages (N,T) (times eq. A3's weights at another policy's samples),
    returns (N,T), the values before the update (N,T), the log-probs the ratio divides by (N,T)."""

    adv: Tensor
    returns: Tensor
    old_values: Tensor
    old_logprobs: Tensor


class PPO:
    """`vanilla=True` is the paper's vanilla policy gradient: lambda = 1, one pass, no ratio, no clip."""

    distributed = False  # the value model is neither wrapped nor sharded

    def __init__(self, cfg: RLConfig, models: Models, vanilla: bool = False):
        self.vanilla = vanilla
        self.value = ValueFunction(cfg, models)
        self.lam = 1.0 if vanilla else cfg.algorithm_settings.gae_lambda
        s = cfg.algorithm_settings
        self.epochs, self.parts = (1, 1) if vanilla else (s.ppo_epochs, s.num_minibatches)

    def state_dict(self) -> dict:
        return self.value.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.value.load_state_dict(state)

    def advantages(self, models: Models, roll, scores, ref_lp, cfg: RLConfig):
        """Per-token rewards, old values, GAE advantages (whitened if configured) and returns, and the
        log-probs the ratio divides by: the sampler's, or at another policy's samples the current ones
        (eq. A3's pi_prox: this pass's; eq. A1: the KL reward's too)."""
        mask = roll.completion_mask
        with torch.no_grad():
            prox, old_values = self.value.forward(
                models.policy,
                roll.prompt_ids,
                roll.prompt_mask,
                roll.completion_ids,
                mask,
                cfg.temperature,
                cfg.max_logits_mb,
                policy_truncation(cfg),
            )
        estimator = cfg.algorithm_settings.kl_estimator
        old = roll.logprobs if cfg.off_policy_correction is None else torch.where(mask, prox, torch.zeros_like(prox))
        rewards = token_level_rewards(scores, old, ref_lp, mask, cfg.beta, estimator)
        adv, returns = gae(rewards, old_values, mask, cfg.algorithm_settings.gamma, self.lam)
        if cfg.algorithm_settings.whiten_advantages:
            adv = whiten(adv, mask)
        return adv, returns, old_values, old

    def _losses(self, lp, values, rows, roll, tg: Targets, cfg: RLConfig):
        mask = roll.completion_mask[rows]
        if self.vanilla:
            pl, stats = token_policy_gradient_loss(lp, tg.adv[rows], mask)
        else:
            pl, stats = ppo_clip_loss(lp, tg.old_logprobs[rows], tg.adv[rows], mask, cfg.algorithm_settings.clip_eps)
        clip = None if self.vanilla else cfg.algorithm_settings.value_clip_eps
        vl, vstats = value_loss(values, tg.returns[rows], mask, tg.old_values[rows], clip)
        return pl, vl, stats | vstats

    def _forward(self, models: Models, roll, rows, cfg: RLConfig):
        args = (roll.prompt_ids[rows], roll.prompt_mask[rows], roll.completion_ids[rows], roll.completion_mask[rows])
        return self.value.forward(models.policy, *args, cfg.temperature, cfg.max_logits_mb, policy_truncation(cfg))

    def _micro_update(self, models: Models, opt, micro, roll, tg: Targets, cfg: RLConfig):
        """One minibatch's update in micro-batches (rl.micro_batch_size): policy and value losses are
        token means, so each micro-batch weighs by its tokens; one backward of their sum (the value
        head's weighted by vf_coef; a separate value model's parameters are disjoint from the policy's),
        then each model's clipped step; both are skipped when a loss or either gradient is not
        finite. (grad norm, stepped, stats)."""
        coef = cfg.algorithm_settings.vf_coef if self.value.kind == "head" else 1.0

        def loss_of(rows):
            pl, vl, stats = self._losses(*self._forward(models, roll, rows, cfg), rows, roll, tg, cfg)
            return pl + coef * vl, stats

        acc = Accumulated(micro, micro_shares(micro, roll.completion_mask), loss_of)
        self.value.opt.zero_grad(set_to_none=True)
        norm, ok = guarded_step(acc, list(models.policy.parameters()), opt, cfg.max_grad_norm)
        if self.value.kind == "separate":
            v_norm = torch.nn.utils.clip_grad_norm_(self.value.params, cfg.max_grad_norm)
            ok = ok and bool(torch.isfinite(v_norm))
        if ok:
            self.value.opt.step()
        self.value.opt.zero_grad(set_to_none=True)
        return norm, ok, acc.stats

    def step(self, models: Models, opt, prompts: list[str], cfg: RLConfig, gen: torch.Generator):
        timer = Timer()
        roll, scores, ref_lp = sample_and_score(models, prompts, cfg, gen, timer)
        require_scored(scores, cfg.algorithm)
        adv, returns, old_values, old = self.advantages(models, roll, scores, ref_lp, cfg)
        seq_rewards, kl = sequence_rewards(scores, roll, ref_lp, cfg, old)
        weights, is_stats = (None, {}) if cfg.off_policy_correction is None else token_weights(old, roll, cfg)
        tg = Targets(weigh(adv, weights), returns, old_values, old)  # eq. A3: w A in the surrogate, ratio to pi_prox
        records, norms, skipped = [], [], False
        policy_params = list(models.policy.parameters())
        for rows in minibatches(len(roll.prompts), self.parts, self.epochs, gen):
            if len(micro := micro_parts(rows, cfg)) > 1:
                norm, ok, stats = self._micro_update(models, opt, micro, roll, tg, cfg)
                records.append(stats)
                norms.append(norm)
                skipped |= not ok
                continue
            lp, values = self._forward(models, roll, rows, cfg)
            pl, vl, stats = self._losses(lp, values, rows, roll, tg, cfg)
            if self.value.kind == "head":  # one backward: the value loss also shapes the shared body
                self.value.opt.zero_grad(set_to_none=True)
                norm, ok = guarded_step(pl + cfg.algorithm_settings.vf_coef * vl, policy_params, opt, cfg.max_grad_norm)
                if ok:
                    self.value.opt.step()
                self.value.opt.zero_grad(set_to_none=True)
            else:
                norm, ok = guarded_step(pl, policy_params, opt, cfg.max_grad_norm)
                _, v_ok = guarded_step(vl, self.value.params, self.value.opt, cfg.max_grad_norm)
                ok = ok and v_ok
            records.append(stats)
            norms.append(norm)
            skipped |= not ok
        timer.lap("update")
        stats = mean_stats(records) | {"value/mean": old_values[roll.completion_mask].mean().item()} | floats(is_stats)
        stats |= rollout_stats(roll, scores, kl, seq_rewards, max(norms), skipped, timer)
        return StepResult(stats, roll, seq_rewards)
