"""Plain references for every online method's update on samples of a behaviour policy mu (docs/async.md,
eq. A1-A3), sharing nothing with rloo but the models: one unpadded sequence at a time, the model's
float32 log-probs taken to float64 and everything after them in float64.

Per row i: lp_i (T_i,) log pi with the gradient (the current policy, which is also the proximal one:
one epoch of one minibatch), mu_i the sampler's stored log-probs, ref_i the reference's, s_i the score,
w_i (T_i,) the detached weight of pi / mu (a sequence weight repeated on its tokens). Eq. A3 with
pi_prox = pi: ratio r = exp(lp - lp.detach()), the surrogate min(r A, clip(r, 1 +- eps) A).
"""

from __future__ import annotations

import torch

SQRT_EPS = 1e-8  # whiten's variance epsilon (rloo.core.advantages.whiten)


def weights(lp: torch.Tensor, mu: torch.Tensor, correction: str, clip: float) -> torch.Tensor:
    """w (T,) of one row: tis min(rho, C), mis rho 1{1/C <= rho <= C}, none 1; rho per token (_token) or
    of the sequence (repeated)."""
    log_ratio = lp.detach() - mu
    if not correction.endswith("_token"):
        log_ratio = log_ratio.sum().expand_as(lp)
    rho = log_ratio.exp()
    if correction.startswith("tis"):
        return rho.clamp(max=clip)
    if correction.startswith("mis"):
        return torch.where((rho >= 1 / clip) & (rho <= clip), rho, torch.zeros_like(rho))
    return torch.ones_like(rho)


def _surrogate(lp, adv, eps):
    r = torch.exp(lp - lp.detach())
    return torch.minimum(r * adv, r.clamp(1 - eps, 1 + eps) * adv)


def _whiten(per_row: list[torch.Tensor]) -> list[torch.Tensor]:
    flat = torch.cat(per_row)
    mean = flat.mean()
    scale = 1 / torch.sqrt(((flat - mean) ** 2).mean() + SQRT_EPS)
    return [(a - mean) * scale for a in per_row]


def _k3(lp, ref):
    d = ref - lp
    return torch.expm1(d) - d


def current_rewards(rows, scores, beta):
    """Eq. A1: R_i = s_i - beta * sum_t (lp_it - ref_it), the current policy's KL, no gradient."""
    return torch.stack([s - beta * (lp.detach() - ref).sum() for (lp, _, ref, _), s in zip(rows, scores, strict=True)])


def reinforce(rows, scores, p):
    adv = current_rewards(rows, scores, p["beta"]) - p["baseline"]
    return -torch.stack([(w * a * lp).sum() for (lp, _, _, w), a in zip(rows, adv, strict=True)]).mean()


def _gae_zero_values(rows, scores, p, lam):
    """GAE with V = 0 (a zero-initialised value head), gamma = 1, token rewards -beta (lp - ref), the
    score added at the last token (eq. A1's KL of the current policy), whitened over the batch."""
    out = []
    for (lp, _, ref, _), s in zip(rows, scores, strict=True):
        rew = -p["beta"] * (lp.detach() - ref)
        rew[-1] = rew[-1] + s
        adv, run = torch.zeros_like(rew), torch.zeros((), dtype=rew.dtype)
        for t in reversed(range(len(rew))):
            run = rew[t] + lam * run
            adv[t] = run
        out.append(adv)
    return _whiten(out)


def _token_mean(terms):
    return torch.cat(terms).sum() / sum(t.numel() for t in terms)


def vanilla_pg(rows, scores, p):
    adv = _gae_zero_values(rows, scores, p, 1.0)
    return -_token_mean([w * a * lp for (lp, _, _, w), a in zip(rows, adv, strict=True)])


def ppo(rows, scores, p):
    adv = _gae_zero_values(rows, scores, p, p["gae_lambda"])
    return -_token_mean([w * _surrogate(lp, a, p["eps"]) for (lp, _, _, w), a in zip(rows, adv, strict=True)])


def _grouped(scores, k, normalise):
    g = scores.view(-1, k)
    centred = g - g.mean(1, keepdim=True)
    return (centred / (g.std(1, keepdim=True) + 1e-6) if normalise else centred).view(-1)


def _clipped_k3_terms(rows, adv, p):
    pairs = zip(rows, adv, strict=True)
    return [w * (-_surrogate(lp, a, p["eps"]) + p["beta"] * _k3(lp, ref)) for (lp, _, ref, w), a in pairs]


def grpo(rows, scores, p):
    return _token_mean(_clipped_k3_terms(rows, _grouped(scores, p["k"], True), p))


def dr_grpo(rows, scores, p):
    terms = _clipped_k3_terms(rows, _grouped(scores, p["k"], False), p)
    return torch.cat(terms).sum() / (len(rows) * p["norm_length"])


def reinforce_pp(rows, scores, p):
    returns = []
    for (lp, _, ref, _), s in zip(rows, scores, strict=True):
        kl = lp.detach() - ref
        returns.append(s - p["beta"] * kl.flip(0).cumsum(0).flip(0))
    adv = _whiten(returns)
    return -_token_mean([w * _surrogate(lp, a, p["eps"]) for (lp, _, _, w), a in zip(rows, adv, strict=True)])


def raft(rows, scores, p):
    """Best of k by the SAMPLER's shaped reward (s - beta sum (mu - ref)), SFT on it, no weight."""
    rewards = torch.stack([s - p["beta"] * (mu - ref).sum() for (_, mu, ref, _), s in zip(rows, scores, strict=True)])
    best = rewards.view(-1, p["k"]).argmax(1) + torch.arange(len(rows) // p["k"]) * p["k"]
    kept = [rows[int(b)][0] for b in best]
    return -torch.cat(kept).sum() / sum(lp.numel() for lp in kept)


LOSSES = {f.__name__: f for f in (reinforce, vanilla_pg, ppo, grpo, dr_grpo, reinforce_pp, raft)}
