"""Gradient variance of policy-gradient estimators at a fixed policy: the paper's premise, measured.

Ahmadian et al. 2024 argue that starting from a strong (SFT) model the gradient estimate is
already low-variance, so PPO's machinery for variance reduction does not pay. Here every estimator
estimates the same gradient of E[score] at a frozen snapshot, written in one form,
    g = grad of (1/N) sum_i sum_t A_{i,t} log pi(y_{i,t} | x_i, y_{i,<t})
(A_{i,t} = A_i for the whole-response estimators), from N completions per batch. Over R
independent batches we report the total variance tr Cov(g) = E||g - E g||^2, the squared norm of
the mean gradient (debiased: ||mean g||^2 - tr Cov / R) and their ratio (noise-to-signal).
The snapshot is its own reference, so the KL term of eq. (1) is zero and R = score.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rloo.algorithms.base import rollout_logprobs
from rloo.algorithms.ppo import ValueFunction, hidden_states
from rloo.config import CompareConfig, PipelineConfig, RLConfig, Sampling
from rloo.config.methods import capable
from rloo.core.advantages import gae, leave_one_out
from rloo.core.kl import token_level_rewards
from rloo.core.losses import sequence_sum_policy_gradient_loss, value_loss
from rloo.experiments.readback import read_variance
from rloo.modeling.loading import frozen, load_policy, load_reward_model
from rloo.rewards import RewardModelScorer
from rloo.rollout import rollout
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.tracking.log import say
from rloo.tasks import get_task
from rloo.training.sft import sft

ESTIMATORS = (
    "no baseline",
    "moving-average baseline",
    "leave-one-out k=2",
    "leave-one-out k=4",
    "PPO GAE (lambda 0.95)",
)


class _Snapshot:
    """A frozen-in-place policy (parameters keep requires_grad for the measured gradients)."""

    def __init__(self, path: str, rm_path: str, cfg: CompareConfig, seed: int, task_name: str):
        self.policy, self.tok = load_policy(path, device=cfg.device)
        rm, rm_tok = load_reward_model(rm_path, device=cfg.device)
        self.scorer = RewardModelScorer(frozen(rm), rm_tok, policy_tokenizer=self.tok)
        self.cfg, self.gen = cfg, torch.Generator().manual_seed(20_000 + seed)
        self.prompts = [e.prompt for e in get_task(task_name).examples("train", 4096, seed=seed + 777)]
        self.pos = 0

    def batch(self, n_prompts: int, k: int):
        if self.pos + n_prompts > len(self.prompts):
            self.pos = 0
        prompts = self.prompts[self.pos : self.pos + n_prompts]
        self.pos += n_prompts
        roll = rollout(
            self.policy,
            self.tok,
            prompts,
            k,
            Sampling(self.cfg.rl.max_new_tokens, self.cfg.max_prompt_tokens, temperature=self.cfg.rl.temperature),
            generator=self.gen,
        )
        return roll, self.scorer(roll)

    def gradient(self, roll, advantages) -> torch.Tensor:
        """Flattened gradient of the common form above; advantages (N,) or (N, T)."""
        # k samples per prompt (the leave-one-out estimators): each prompt computed once, as in training
        lp = rollout_logprobs(self.policy, roll, self.cfg.rl)
        if advantages.dim() == 1:
            advantages = advantages[:, None].expand_as(lp)
        loss, _ = sequence_sum_policy_gradient_loss(lp, advantages, roll.completion_mask)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(-loss, params)])


def _fit_value(snap: _Snapshot, cfg: CompareConfig, rm_path: str, steps: int) -> ValueFunction:
    """A separate value model (from the reward model, as PPO's) regressed on Monte-Carlo returns."""
    vcfg = RLConfig(  # the settings of a method with a value model (value_model, value_lr)
        policy="unused",
        reward_model=rm_path,
        device=cfg.device,
        algorithm=capable("value_model")[0],
        algorithm_settings={"value_model": "separate"},
    )
    value = ValueFunction(vcfg, models=None)
    for _ in range(steps):
        roll, scores = snap.batch(cfg.variance_samples, 1)
        with torch.no_grad():
            rewards = token_level_rewards(scores, roll.logprobs, roll.logprobs, roll.completion_mask, 0.0)
            _, returns = gae(rewards, torch.zeros_like(rewards), roll.completion_mask, 1.0, 1.0)
        v_hidden, _ = hidden_states(
            value.model, roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask, want_logits=False
        )
        loss, _ = value_loss(value.model.score(v_hidden).squeeze(-1).float(), returns, roll.completion_mask)
        value.opt.zero_grad(set_to_none=True)
        loss.backward()
        value.opt.step()
    return value


def _advantages(name: str, snap: _Snapshot, cfg: CompareConfig, baseline: float, value: ValueFunction):
    n = cfg.variance_samples
    k = {"leave-one-out k=2": 2, "leave-one-out k=4": 4}.get(name, 1)
    roll, scores = snap.batch(n // k, k)
    if k > 1:
        return roll, leave_one_out(scores.view(-1, k)).view(-1)
    if name == "no baseline":
        return roll, scores
    if name == "moving-average baseline":
        return roll, scores - baseline
    mask = roll.completion_mask
    with torch.no_grad():
        v_hidden, _ = hidden_states(value.model, roll.prompt_ids, roll.prompt_mask, roll.completion_ids, mask, False)
        values = value.model.score(v_hidden).squeeze(-1).float()
        rewards = token_level_rewards(scores, roll.logprobs, roll.logprobs, mask, 0.0)
        adv, _ = gae(rewards, values, mask, 1.0, 0.95)
    return roll, adv


def measure(snap: _Snapshot, cfg: CompareConfig, rm_path: str) -> dict[str, dict[str, float]]:
    """Variance statistics of every estimator at one snapshot."""
    R = cfg.variance_batches
    # what a converged moving average of the rewards holds at this policy
    baseline = torch.cat([snap.batch(cfg.variance_samples, 1)[1] for _ in range(4)]).mean().item()
    value = _fit_value(snap, cfg, rm_path, steps=2 * R)
    out = {}
    for name in ESTIMATORS:
        total, sq = None, 0.0
        for _ in range(R):
            roll, adv = _advantages(name, snap, cfg, baseline, value)
            g = snap.gradient(roll, adv)
            total = g if total is None else total + g
            sq += float(g.pow(2).sum())
        mean = total / R
        var = (sq - R * float(mean.pow(2).sum())) / (R - 1)  # tr Cov, unbiased
        signal = float(mean.pow(2).sum()) - var / R  # ||E g||^2, debiased
        out[name] = {"variance": var, "signal": signal, "noise_to_signal": var / signal if signal > 0 else None}
    return out


def variance_cell(cfg: CompareConfig, task_name: str, seed: int, runs: Path) -> dict:
    """Measure at the SFT model and at a weak model (SFT on a small share of the data) of (task, seed)."""

    root = runs / task_name / f"seed-{seed}"
    out_file = root / "gradient_variance.json"
    if out_file.exists():
        return read_variance(out_file)
    pipe = PipelineConfig(
        task=task_name,
        seed=seed,
        device=cfg.device,
        output_dir=root,
        sft=cfg.sft,
        reward=cfg.reward,
        max_prompt_tokens=cfg.max_prompt_tokens,
        max_response_tokens=cfg.max_response_tokens,
    )
    sft_cfg = pipe.stage_configs()[0]
    weak_dir = root / "weak_sft"
    if not (weak_dir / "model").exists():
        n = max(cfg.sft.batch_size, int(cfg.sft.num_examples * cfg.weak_sft_fraction))
        sft(sft_cfg.model_copy(update={"output_dir": weak_dir, "num_examples": n, "epochs": 1}), overwrite=True)
    rm_path = str(root / "reward" / "model")
    result = {}
    for label, path in (("sft", root / "sft" / "model"), ("weak", weak_dir / "model")):
        say(f"== {task_name}: gradient variance at the {label} model")
        torch.manual_seed(seed)
        result[label] = measure(_Snapshot(str(path), rm_path, cfg, seed, task_name), cfg, rm_path)
    atomic_write_text(out_file, json.dumps(result, indent=2))  # read by other compare processes
    return result
