"""rloo's ablations on multi-turn episodes (issue 54 item 1): each one's first gradient equals a plain
per-trajectory reference over the policy's tokens only (an environment's tokens are not the
policy's actions: neither its loss nor its KL may count them).

The reference shares nothing with rloo but the models and test_multiturn's environment (as
test_multiturn_methods): one unpadded trajectory at a time, `lp_i` the policy's log-probs of
trajectory i's policy tokens (with the gradient), `old_i` the sampled ones, `ref_i` the reference's,
kl_i,t = old_i,t - ref_i,t (k1) or e^(ref-old) - (ref-old) - 1 (k3), LOO(x)_i = x_i - mean_{j != i} x_j:
    sequence  R_i = r_i - beta * sum_t kl_i,t;  A = LOO(R)
              loss = -1/N sum_i A_i sum_t lp_i,t                        (kl_estimator=k3 too)
    drop_zero_variance: the same over the rows of the groups whose scores are not all equal
    rloo_clip rho_i = exp(sum_t lp_i,t - sum_t old_i,t); loss = -1/N sum_i min(rho_i A_i, clip(rho_i) A_i)
    token     A_i,t = r_i - beta * sum_{s >= t} kl_i,s - mean_{j != i} R_j
              loss = -1/N sum_i sum_t A_i,t lp_i,t
    token + rloo_clip: rho_i,t = exp(lp_i,t - old_i,t); loss = token mean of -min(rho A, clip(rho) A)
The same reference with every real token counted (observations too) gives another gradient, checked
too: the mask is what is tested.
"""

from __future__ import annotations

import pytest
import torch
from tests.equivalence.test_multiturn import BETA, PROMPTS, EchoEnv, K, Tok, spec
from tests.equivalence.test_multiturn_methods import _max_diff, _per_token

from helpers.grads import GradRecorder
from helpers.tiny_archs import arch_per_row, tiny_lm
from rloo.algorithms.agents import EpisodeReward, episode_reward
from rloo.algorithms.base import Models
from rloo.algorithms.registry import make_algorithm
from rloo.config import RLConfig
from rloo.errors import ConfigError, EnvError
from tolerance import TINY_MODEL_BACKWARD, assert_close

EPS = 0.2
ONE_PASS = {"ppo_epochs": 1, "num_minibatches": 1, "clip_eps": EPS}  # the first gradient is the batch's
ABLATIONS = {
    "k3": {"kl_estimator": "k3"},
    "token": {"kl_level": "token"},
    "token_k3": {"kl_level": "token", "kl_estimator": "k3"},
    "clip": {"rloo_clip": True} | ONE_PASS,
    "token_clip": {"kl_level": "token", "rloo_clip": True} | ONE_PASS,
    "drop_zero_variance": {"drop_zero_variance": True},
}


class FirstGroupFlat(EpisodeReward):
    """The episodes' rewards with the first prompt's group all scored alike: a group to drop."""

    def __call__(self, roll) -> torch.Tensor:
        scores = super().__call__(roll).clone()
        scores[:K] = 1.0
        return scores


def _kl(old, ref, estimator):
    r = ref - old
    return -r if estimator == "k1" else torch.expm1(r) - r


def _loo(x):
    g = x.view(-1, K)
    return (g - (g.sum(1, keepdim=True) - g) / (K - 1)).view(-1)


def _clipped(rho, a):
    return -torch.minimum(rho * a, rho.clamp(1 - EPS, 1 + EPS) * a)


def _reference_loss(rows, scores, settings):
    est = settings.get("kl_estimator", "k1")
    kls = [_kl(old, ref, est) for _, old, ref in rows]
    rewards = torch.stack([s - BETA * kl.sum() for s, kl in zip(scores, kls, strict=True)])
    adv = _loo(rewards)
    if settings.get("kl_level") == "token":
        baseline = rewards - adv  # mean_{j != i} R_j
        to_go = [kl.flip(0).cumsum(0).flip(0) for kl in kls]
        token_adv = [s - BETA * g - b for s, g, b in zip(scores, to_go, baseline, strict=True)]
        if settings.get("rloo_clip"):
            terms = [_clipped(torch.exp(lp - old), a) for (lp, old, _), a in zip(rows, token_adv, strict=True)]
            return torch.cat(terms).sum() / sum(t.numel() for t in terms)
        return -torch.stack([(a * lp).sum() for (lp, _, _), a in zip(rows, token_adv, strict=True)]).mean()
    seq = torch.stack([lp.sum() for lp, _, _ in rows])
    if settings.get("rloo_clip"):
        old = torch.stack([o.sum() for _, o, _ in rows])
        return _clipped(torch.exp(seq - old), adv).mean()
    keep = torch.ones(len(rows), dtype=torch.bool)
    if settings.get("drop_zero_variance"):
        g = scores.view(-1, K)
        keep = (g != g[:, :1]).any(1).repeat_interleave(K)
    return -(adv * seq)[keep].mean()


def _reference_grads(policy, ref, roll, scores, settings, counted):
    policy.zero_grad(set_to_none=True)
    _reference_loss(_per_token(policy, ref, roll, counted), scores, settings).backward()
    return {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}


CASES = arch_per_row([(name, share) for name in ABLATIONS for share in (True, False)])


@pytest.mark.parametrize("ablation,share,arch", CASES)
def test_rloo_ablation_on_episodes_equals_plain_reference(ablation, share, arch):
    """The ablation's first gradient on episodes is the reference's over the policy's tokens, and not
    the one that also counts the environment's tokens."""
    settings = ABLATIONS[ablation]
    policy, ref = tiny_lm(arch), tiny_lm(arch, seed=1).requires_grad_(False).eval()
    cfg = RLConfig(
        policy="unused",
        k=K,
        beta=BETA,
        lr=1e-2,
        max_grad_norm=1e6,
        share_prompt=share,
        algorithm_settings=settings,
    )
    opt = GradRecorder(policy)
    dropping = settings.get("drop_zero_variance", False)
    scorer = FirstGroupFlat() if dropping else episode_reward
    models = Models(policy, ref, Tok(), scorer, env=spec())
    EchoEnv.log.clear()
    result = make_algorithm(cfg, models).step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    roll = result.rollout
    assert bool((~roll.policy_mask & roll.completion_mask).any()), "no environment tokens: nothing checked"
    assert result.stats["groups/dropped"] == float(dropping)
    scores = scorer(roll).float()
    assert len(set(scores.tolist())) > 1, "every episode scored alike: no gradient to compare"
    grads = _reference_grads(policy, ref, roll, scores, settings, lambda pol: pol)
    assert opt.grads is not None, "no optimizer step"
    scale = max(float(g.abs().max()) for g in grads.values())
    for name, g in grads.items():
        assert_close(opt.grads[name], g, TINY_MODEL_BACKWARD, scale=scale, msg=name)
    counting_env = _reference_grads(policy, ref, roll, scores, settings, lambda pol: torch.ones_like(pol))
    assert _max_diff(counting_env, grads) > 1e-3 * scale, "environment tokens would not change the gradient"


# The other steps that mask with roll.completion_mask (algorithms/ppo.py's value model and GAE,
# algorithms/offpolicy.py's importance-weighted update) never see an episode: env= refuses them.
REFUSED = {
    "ppo": ({"algorithm": "ppo"}, "value model"),
    "vanilla_pg": ({"algorithm": "vanilla_pg"}, "value model"),
    "rloo_max_staleness": ({"max_staleness": 1}, "on-policy only"),
    "rloo_is_correction": ({"is_correction": "tis"}, "on-policy only"),
    "reinforce_max_staleness": ({"algorithm": "reinforce", "max_staleness": 1}, "on-policy only"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_completion_mask_steps_are_refused_with_env(case):
    """env= with a method or setting whose step counts every real token is one line naming why."""
    overrides, why = REFUSED[case]
    with pytest.raises(ConfigError) as e:
        RLConfig(policy="unused", env="calculator", **overrides)
    assert why in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_ppo_step_refuses_episodes():
    """Past the config (an env given to the models directly), ppo's sampling stops before any update."""
    policy, ref = tiny_lm("gpt2"), tiny_lm("gpt2", seed=1).requires_grad_(False).eval()
    cfg = RLConfig(policy="unused", algorithm="ppo", k=K, beta=BETA, algorithm_settings={"value_model": "head"})
    models = Models(policy, ref, Tok(), episode_reward, env=spec())
    algo = make_algorithm(cfg, models)
    with pytest.raises(EnvError, match="does not train on multi-turn environments"):
        algo.step(models, GradRecorder(policy), PROMPTS, cfg, torch.Generator().manual_seed(0))
