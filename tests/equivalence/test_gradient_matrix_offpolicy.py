"""The bounded off-policy estimators of rl.is_correction (asymre, topr, cispo, clipped_surrogate; rloo.core.bounded,
docs/async.md "Bounded estimators") against a plain per-sequence reference, at lag 0 (the sampler is
the policy: mu = pi up to rounding) and lag 1 (the real lagged sampler, rloo.rollout.lagged.LaggedSampler:
batch 1 is sampled with the weights of update 0 while the trainer holds those of update 1).

The reference, written here and sharing nothing with rloo but the model, one sequence at a time:
    eq. A1  R_i = s_i - beta * (log pi(y_i|x) - log pi_ref(y_i|x)),  A_i = R_i - mean_{j != i} R_j (eq. 4)
    asymre     loss_i = -(A_i + delta) log pi(y_i|x)
    topr       loss_i = -w_i A_i log pi(y_i|x),   w_i = 1 if A_i >= 0 else min(rho_i, 1)
    cispo      loss_i = -A_i sum_t sg(min(max(rho_it, c_low), C)) log pi(y_it|.)
    clipped_surrogate  loss_i = -min(rho_i A_i, clip(rho_i, 1 - eps, 1 + eps) A_i),  rho_i with the gradient
    loss = 1/N sum_i loss_i;  rho = pi / mu with mu the sampler's stored log-probs.
Each estimator also has a mutation of the library (its defining detail removed) that must fail the
comparison: test_mutation_fails. Tolerances: tests/tolerance.py.
"""

from __future__ import annotations

import pytest
import torch

from helpers.grads import GradRecorder
from rloo.algorithms import make_algorithm
from rloo.rollout.lagged import LaggedSampler
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_BACKWARD, tolerance

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]
K, BETA, C, C_LOW, DELTA, EPS = 4, 0.1, 1.3, 0.8, 0.3, 0.2
ESTIMATORS = ("asymre", "topr", "cispo", "clipped_surrogate")


def score_fn(prompts, completions):
    pairs = zip(prompts, completions, strict=True)
    return [len(set(c.split())) / 4 + 0.1 * (sum(map(ord, c)) % 7) + 0.1 * len(p.split()) for p, c in pairs]


def _cfg(path, out, estimator, lag):
    from rloo.config import RLConfig

    own = {"asymre": {"is_baseline_shift": DELTA}, "cispo": {"is_clip": C, "is_clip_low": C_LOW}}
    algo = {"clip_eps": EPS} if estimator == "clipped_surrogate" else {}
    kw = dict(policy=str(path), output_dir=out, k=K, beta=BETA, max_new_tokens=8, seed=0, max_grad_norm=1e6)
    return RLConfig(**kw, max_staleness=lag, is_correction=estimator, algorithm_settings=algo, **own.get(estimator, {}))


def _token_logprobs(model, x, y):
    logits = model(input_ids=torch.cat([x, y])[None], use_cache=False).logits[0].float()
    return logits[len(x) - 1 : len(x) + len(y) - 1].log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)


def _row_loss(estimator, lp, mu, adv):
    """One sequence's loss term: lp (T,) with the gradient, mu (T,) float64, adv a float."""
    if estimator == "asymre":
        return -(adv + DELTA) * lp.sum()
    if estimator == "topr":
        rho = float(torch.exp(lp.detach().double().sum() - mu.sum()))
        return -(1.0 if adv >= 0 else min(rho, 1.0)) * adv * lp.sum()
    if estimator == "cispo":
        w = torch.exp(lp.detach().double() - mu).clamp(C_LOW, C)
        return -adv * (w.float() * lp).sum()
    rho = torch.exp(lp.sum() - mu.sum().float())  # clipped_surrogate: the ratio carries the gradient
    return -torch.minimum(rho * adv, rho.clamp(1 - EPS, 1 + EPS) * adv)


def reference_gradient(models, roll, estimator):
    policy = models.policy
    policy.eval()
    n, mask = len(roll.prompts), roll.completion_mask
    seqs = [(roll.prompt_ids[i][roll.prompt_mask[i]], roll.completion_ids[i][mask[i]]) for i in range(n)]
    lp = [_token_logprobs(policy, x, y) for x, y in seqs]
    with torch.no_grad():
        ref = torch.stack([_token_logprobs(models.ref, x, y).sum() for x, y in seqs]).double()
    scores = torch.tensor(score_fn(roll.prompts, roll.completions), dtype=torch.float64)
    rewards = scores - BETA * (torch.stack([t.sum() for t in lp]).detach().double() - ref)
    groups = rewards.view(-1, K)
    adv = (groups - (groups.sum(1, keepdim=True) - groups) / (K - 1)).view(-1)
    mu = [roll.logprobs[i][mask[i]].double() for i in range(n)]
    loss = sum(_row_loss(estimator, lp[i], mu[i], float(adv[i])) for i in range(n)) / n
    params = [(name, p) for name, p in policy.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in params])
    policy.train()
    return dict(zip([name for name, _ in params], grads, strict=True))


def _lagged(models, cfg):
    """The real lagged sampler at lag 1: it holds update 0's weights, the trainer then takes an
    "update" (a distinguishable change of every weight) and publishes it; the next batch is
    sampled with update 0's weights (roll.lag = 1)."""
    sampler = LaggedSampler(models.policy, models.tokenizer, cfg)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in models.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    sampler.sync(models.policy)
    return sampler


def run(path, out, estimator, lag):
    """rloo's first recorded gradient and the reference's, their max |difference| and the tolerance."""
    cfg = _cfg(path, out, estimator, lag)
    models = load_models(cfg, reward_fn=score_fn)
    models.sampler = _lagged(models, cfg) if lag else None
    opt = GradRecorder(models.policy)
    result = make_algorithm(cfg, models).step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    expected = reference_gradient(models, result.rollout, estimator)
    scale = max(g.abs().max().item() for g in expected.values())
    assert scale > 1e-4  # a gradient to compare, not 0 with 0
    err = max((opt.grads[name] - g).abs().max().item() for name, g in expected.items())
    # weights up to C (cispo), 1 + eps (clipped_surrogate), 1 (topr); asymre's shift enters the scale
    tol = tolerance(None, TINY_MODEL_BACKWARD * max(C, 1 + EPS), scale=scale)
    return err, tol, result.stats, result.rollout


@pytest.mark.parametrize("lag", [0, 1])
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_bounded_gradient_matches_the_per_sequence_reference(tiny_model_dir, tmp_path, estimator, lag):
    err, tol, stats, roll = run(tiny_model_dir, tmp_path, estimator, lag)
    assert err <= tol, (estimator, lag, err, tol)
    assert roll.lag == lag and stats["is/lag"] == lag
    if lag == 0:  # mu = pi: every ratio 1 up to the sampler's rounding, nothing clipped
        assert stats["is/ratio_max"] - 1 < 1e-4 and 1 - stats["is/ratio_min"] < 1e-4, stats
        assert abs(stats["is/weight_mean"] - 1) < 1e-4, stats
        if estimator in ("cispo", "clipped_surrogate"):  # (topr truncates rho < 1 by rounding's width: weight 1 - 1e-7)
            assert stats["is/clipped"] == 0.0, stats
    elif estimator != "asymre":  # the batch exercises both sides of the bound, or the test proves little
        assert 0.0 < stats["is/clipped"] < 1.0, stats


def _drop_cispo_stop_gradient(monkeypatch):
    """The weight carries the gradient: the detach is removed where rloo applies it (the log ratio,
    the clipped weight and the loss each detach, so all three)."""
    import rloo.core.bounded as b

    def log_ratio(logprobs, behaviour, mask):
        return torch.where(mask, logprobs - behaviour, torch.zeros_like(logprobs))

    def weights(lr, mask, low, high):
        return torch.where(mask, torch.exp(lr).clamp(low, high), torch.zeros_like(lr))

    def loss(logprobs, mask, adv, w):
        out = -(adv * (w * logprobs).where(mask, 0.0).sum(-1)).mean()
        return out, {"loss/policy": out.detach()}

    monkeypatch.setattr(b, "token_log_ratio", log_ratio)
    monkeypatch.setattr(b, "cispo_weights", weights)
    monkeypatch.setattr(b, "weighted_policy_gradient_loss", loss)


def _mutate(estimator, monkeypatch):
    import rloo.core.bounded as b

    if estimator == "asymre":  # the baseline above the mean instead of below
        original = b.asymmetric_advantages
        monkeypatch.setattr(b, "asymmetric_advantages", lambda a, shift: original(a, -shift))
    elif estimator == "topr":  # positive advantages truncated too (plain tis at C = 1)
        monkeypatch.setattr(b, "topr_weights", lambda lr, a: torch.exp(lr.detach().clamp(max=0.0)))
    elif estimator == "cispo":
        _drop_cispo_stop_gradient(monkeypatch)
    else:  # clipped_surrogate without its clip: the plain ratio-weighted surrogate
        original = b.ppo_clip_loss
        monkeypatch.setattr(b, "ppo_clip_loss", lambda lp, old, a, clip_eps: original(lp, old, a, clip_eps=1e6))


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_mutation_fails(tiny_model_dir, tmp_path, estimator, monkeypatch):
    """Each estimator's defining detail matters to the comparison above: removed, the gradient leaves
    the tolerance by far (at lag 1, where the weights differ from 1)."""
    _mutate(estimator, monkeypatch)
    err, tol, _, _ = run(tiny_model_dir, tmp_path, estimator, 1)
    assert err > 100 * tol, (estimator, err, tol)
