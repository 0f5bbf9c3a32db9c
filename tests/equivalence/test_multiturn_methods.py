"""Multi-turn episodes for grpo, reinforce and raft (issue 30 item 6): each step's gradient on
episodes equals a plain per-trajectory reference over the policy's tokens only.

The reference shares nothing with rloo but the models and test_multiturn's environment: one
unpadded trajectory at a time, no KV cache; `lp_i` are the policy's log-probs of trajectory i's
policy tokens (with the gradient), `old_i` the sampled ones, `ref_i` the reference model's:
    eq. 1  R_i = r_i - beta * sum_t (old_i,t - ref_i,t)                         (k1, no gradient)
    reinforce (first batch: the baseline is the batch mean, a per-sequence scalar)
           loss = -1/N sum_i (R_i - mean R) * sum_t lp_i,t
    raft   b = argmax_k R over each group; loss = -sum_b sum_t lp_b,t / sum_b |policy tokens of b|
    grpo   A_i = (r_i - mean_g) / (std_g + 1e-6), rho = exp(lp - old), k3 = e^(ref-lp) - (ref-lp) - 1
           loss = 1/|all policy tokens| sum_i sum_t [-min(rho A_i, clip(rho, 1 +- eps) A_i) + beta k3]
Every mean and sum runs over policy tokens, so an environment token's log-prob changes nothing: the
same reference over every real token (observations counted) gives another gradient, checked too.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tests.equivalence.test_multiturn import BETA, PROMPTS, EchoEnv, K, Tok, _plain_logprobs, _rows, spec

from helpers.grads import GradRecorder
from helpers.tiny_archs import arch_per_row, tiny_lm
from rloo.algorithms.agents import episode_reward
from rloo.algorithms.base import Models
from rloo.algorithms.registry import make_algorithm
from rloo.config import RLConfig
from tolerance import TINY_MODEL_BACKWARD, TINY_MODEL_FORWARD, assert_close

EPS = 0.2


def _per_token(policy, ref, roll, counted):
    """Per trajectory: (lp with grad, sampled old, ref) at the `counted` tokens of its real ones."""
    out = []
    for i in range(len(roll.prompts)):
        prompt, traj, pol = _rows(roll, i)
        keep = counted(pol)
        lp = _plain_logprobs(policy, prompt, traj)[keep]
        with torch.no_grad():
            ref_lp = _plain_logprobs(ref, prompt, traj)[keep]
        old = roll.logprobs[i][roll.completion_mask[i]][keep]
        out.append((lp, old, ref_lp))
    return out


def _shaped(rows, scores):
    return torch.stack([scores[i] - BETA * (old - ref).sum() for i, (_, old, ref) in enumerate(rows)])


def _reinforce(rows, scores):
    r = _shaped(rows, scores)
    return -((r - r.mean()) * torch.stack([lp.sum() for lp, _, _ in rows])).mean()


def _raft(rows, scores):
    best = _shaped(rows, scores).view(-1, K).argmax(1) + torch.arange(len(rows) // K) * K
    kept = [rows[int(b)][0] for b in best]
    return -torch.cat(kept).sum() / sum(lp.numel() for lp in kept)


def _grpo(rows, scores):
    g = scores.view(-1, K)
    adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
    terms = []
    for (lp, old, ref), a in zip(rows, adv, strict=True):
        rho = torch.exp(lp - old)
        surrogate = torch.minimum(rho * a, rho.clamp(1 - EPS, 1 + EPS) * a)
        terms.append(-surrogate + BETA * (torch.expm1(ref - lp) - (ref - lp)))
    return torch.cat(terms).sum() / sum(t.numel() for t in terms)


REFERENCES = {"reinforce": _reinforce, "raft": _raft, "grpo": _grpo}
SETTINGS = {"grpo": {"ppo_epochs": 1, "num_minibatches": 1, "clip_eps": EPS}}


def _reference_grads(policy, ref, roll, scores, method, counted):
    policy.zero_grad(set_to_none=True)
    loss = REFERENCES[method](_per_token(policy, ref, roll, counted), scores)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}, loss


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in b)


# every method with and without the shared prompt, the architectures spread over those rows (6 cases,
# not 24: only modeling/ depends on the architecture)
CASES = arch_per_row(list(itertools.product(sorted(REFERENCES), [True, False])))


@pytest.mark.parametrize("method,share,arch", CASES)
def test_episode_gradient_equals_plain_reference(arch, method, share):
    """The step's first gradient on episodes is the reference's over the policy's tokens, and not
    the one that also counts the environment's tokens (so the mask is what the test checks)."""
    policy, ref = tiny_lm(arch), tiny_lm(arch, seed=1).requires_grad_(False).eval()
    cfg = RLConfig(
        policy="unused",
        algorithm=method,
        k=K,
        beta=BETA,
        lr=1e-2,
        max_grad_norm=1e6,
        share_prompt=share,
        algorithm_settings=SETTINGS.get(method, {}),
    )
    opt = GradRecorder(policy)
    models = Models(policy, ref, Tok(), episode_reward, env=spec())
    EchoEnv.log.clear()
    result = make_algorithm(cfg, models).step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    roll = result.rollout
    assert bool((~roll.policy_mask & roll.completion_mask).any()), "no environment tokens: nothing checked"
    assert result.stats["gen/length"] == pytest.approx(roll.policy_mask.sum(-1).float().mean().item())
    scores = episode_reward(roll).float()
    assert len(set(scores.tolist())) > 1, "every episode scored alike: no gradient to compare"
    grads, loss = _reference_grads(policy, ref, roll, scores, method, lambda pol: pol)
    key = {"raft": "loss/sft", "grpo": "loss/ppo"}.get(method, "loss/policy")
    if method != "grpo":  # grpo logs its surrogate without the KL term: the gradient checks the sum
        assert_close(result.stats[key], loss.item(), TINY_MODEL_FORWARD, scale=1 + abs(loss.item()))
    scale = max(float(g.abs().max()) for g in grads.values())
    for name, g in grads.items():
        assert_close(opt.grads[name], g, TINY_MODEL_BACKWARD, scale=scale, msg=name)
    counting_env, _ = _reference_grads(policy, ref, roll, scores, method, lambda pol: torch.ones_like(pol))
    assert _max_diff(counting_env, grads) > 1e-3 * scale, "environment tokens would not change the gradient"
