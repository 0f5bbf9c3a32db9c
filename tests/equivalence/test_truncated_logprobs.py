"""rl.logprobs_under=truncated through rloo's passes (docs/configs.md, "Sampling settings and the
log-probs"): the sampler stores log pi_K of the top-k/top-p truncated distribution it drew from,
and every training pass (plain, shared-prompt, LM head in chunks with its own backward) recomputes
the same values; rloo's on-policy gradient equals a plain per-sequence reference of RLOO on pi_K:

    log pi_K(y_t|s) = z_y / T - logsumexp_{v in K(s)} z_v / T,   K(s): the top_k largest logits
    eq. 1  R_i = s_i - beta (log pi_K(y_i|x) - log pi_ref(y_i|x))   (pi_ref: the full softmax)
    eq. 4, 5  A_i = R_i - mean_{j != i} R_j,   loss = -1/N sum_i A_i log pi_K(y_i|x)

Tolerances: tests/tolerance.py."""

from __future__ import annotations

import pytest
import torch

from helpers.grads import GradRecorder
from rloo.algorithms import make_algorithm
from rloo.algorithms.base import rollout_logprobs
from rloo.config import RLConfig
from rloo.rollout import rollout
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_BACKWARD, TINY_MODEL_FORWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]
K, BETA, TOP_K = 4, 0.1, 5


def score_fn(prompts, completions):
    pairs = zip(prompts, completions, strict=True)
    return [len(set(c.split())) / 4 + 0.1 * (sum(map(ord, c)) % 7) + 0.1 * len(p.split()) for p, c in pairs]


def _cfg(path, out, share, chunked, **kw) -> RLConfig:
    base = dict(policy=str(path), output_dir=out, k=K, beta=BETA, max_new_tokens=8, seed=0, max_grad_norm=1e6)
    return RLConfig(**base, share_prompt=share, max_logits_mb=1e-3 if chunked else 256, temperature=0.9, **kw)


COMBOS = [(True, False), (False, True), (True, True), (False, False)]


@pytest.mark.parametrize("share,chunked", COMBOS)
def test_the_trainer_recomputes_what_the_sampler_stored(tiny_model_dir, tmp_path, share, chunked):
    cfg = _cfg(tiny_model_dir, tmp_path, share, chunked, top_k=TOP_K, top_p=0.9)
    assert cfg.truncated_logprobs  # the default where top_k / top_p truncate
    models = load_models(cfg, reward_fn=score_fn)
    roll = rollout(models.policy, models.tokenizer, PROMPTS, K, cfg.sampling, generator=torch.Generator())
    mask = roll.completion_mask
    with torch.no_grad():
        lp, full = rollout_logprobs(models.policy, roll, cfg), rollout_logprobs(models.policy, roll, cfg, policy=False)
    scale = roll.logprobs[mask].abs().max().item()
    assert_close(lp[mask], roll.logprobs[mask], TINY_MODEL_FORWARD, scale=scale)
    # pi_K is not pi: the full distribution's log-probs are far outside the tolerance
    assert (full[mask] - roll.logprobs[mask]).abs().max() > 1e3 * TINY_MODEL_FORWARD * 1.2e-7 * scale


def test_the_chunked_head_backward_matches_autograd(tiny_model_dir, tmp_path):
    """The LM head in chunks has its own backward (rloo.core.logprobs._HeadLogprobs): under truncation
    its gradient equals autograd's through the plain pass."""
    grads = []
    for chunked in (False, True):
        cfg = _cfg(tiny_model_dir, tmp_path, False, chunked, top_k=TOP_K)
        models = load_models(cfg, reward_fn=score_fn)
        gen = torch.Generator().manual_seed(0)
        roll = rollout(models.policy, models.tokenizer, PROMPTS, K, cfg.sampling, generator=gen)
        lp = rollout_logprobs(models.policy, roll, cfg)
        coeff = torch.linspace(-1, 1, lp.numel()).view_as(lp)
        (lp * coeff).where(roll.completion_mask, 0.0).sum().backward()
        grads.append({n: p.grad.clone() for n, p in models.policy.named_parameters()})
    scale = max(g.abs().max().item() for g in grads[0].values())
    for name, g in grads[0].items():
        assert_close(grads[1][name], g, TINY_MODEL_BACKWARD, scale=scale, msg=name)


def _truncated_token_logprobs(model, x, y, temperature):
    """log pi_K(y_t|x, y_<t) of one unpadded sequence, plainly: the top_k largest logits kept."""
    logits = model(input_ids=torch.cat([x, y])[None], use_cache=False).logits[0].float() / temperature
    pred = logits[len(x) - 1 : len(x) + len(y) - 1]
    kth = pred.detach().sort(-1, descending=True).values[:, TOP_K - 1 : TOP_K]
    pred = pred.masked_fill(pred.detach() < kth, float("-inf"))
    return pred.log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)


def _full_token_logprobs(model, x, y, temperature):
    logits = model(input_ids=torch.cat([x, y])[None], use_cache=False).logits[0].float() / temperature
    return logits[len(x) - 1 : len(x) + len(y) - 1].log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)


def reference_gradient(models, roll, cfg):
    policy = models.policy
    policy.eval()
    n, mask = len(roll.prompts), roll.completion_mask
    seqs = [(roll.prompt_ids[i][roll.prompt_mask[i]], roll.completion_ids[i][mask[i]]) for i in range(n)]
    lp = [_truncated_token_logprobs(policy, x, y, cfg.temperature).sum() for x, y in seqs]
    with torch.no_grad():
        ref = torch.stack([_full_token_logprobs(models.ref, x, y, cfg.temperature).sum() for x, y in seqs]).double()
    scores = torch.tensor(score_fn(roll.prompts, roll.completions), dtype=torch.float64)
    groups = (scores - BETA * (torch.stack(lp).detach().double() - ref)).view(-1, K)
    adv = (groups - (groups.sum(1, keepdim=True) - groups) / (K - 1)).view(-1)
    loss = -sum(float(a) * s for a, s in zip(adv, lp, strict=True)) / n
    params = [(name, p) for name, p in policy.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in params])
    policy.train()
    return dict(zip([name for name, _ in params], grads, strict=True))


@pytest.mark.parametrize("share,chunked", COMBOS[:3])
def test_rloo_gradient_is_rloo_on_the_truncated_policy(tiny_model_dir, tmp_path, share, chunked):
    cfg = _cfg(tiny_model_dir, tmp_path, share, chunked, top_k=TOP_K)
    models = load_models(cfg, reward_fn=score_fn)
    with torch.no_grad():  # pi != pi_ref, so the KL term of eq. 1 is not 0
        g = torch.Generator().manual_seed(2)
        for p in models.policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    opt = GradRecorder(models.policy)
    result = make_algorithm(cfg, models).step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    expected = reference_gradient(models, result.rollout, cfg)
    scale = max(g.abs().max().item() for g in expected.values())
    assert scale > 1e-4
    for name, g in expected.items():
        assert_close(opt.grads[name], g, TINY_MODEL_BACKWARD, scale=scale, msg=name)
