"""Off-policy RLOO (rl.max_staleness, rl.is_correction; docs/async.md) against a plain reference.

The reference, written here and sharing nothing with rloo but the model, one sequence at a time:
    eq. A1  R_i = r(x, y_i) - beta * (log pi(y_i|x) - log pi_ref(y_i|x))       pi: the CURRENT policy
    eq. 4   A_i = R_i - 1/(k-1) * sum_{j != i} R_j
    eq. A2  loss = -1/N sum_i w_i A_i log pi(y_i|x),   w_i = min(rho_i, C) (tis) or rho_i 1{1/C <= rho_i <= C}
            (mis), rho_i = pi(y_i|x) / mu(y_i|x); token variants: -1/N sum_i A_i sum_t w_it log pi(y_it|.)
where mu (the behaviour policy) is a perturbed copy of the policy that sampled the batch and
log mu are the log-probs the sampler stored. Tolerances: tests/tolerance.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.grads import GradRecorder
from rloo.algorithms import make_algorithm
from rloo.config import LoraSettings, RLConfig, Sampling
from rloo.data.prompts import PromptStream
from rloo.modeling.forward import completion_logprobs
from rloo.rollout import rollout
from rloo.rollout.lagged import LaggedSampler, shadow_copy
from rloo.rollout.producer import ProducerSampler
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_BACKWARD, TINY_MODEL_FORWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]
K, BETA, C = 4, 0.1, 1.3


def reward_fn(prompts, completions):
    pairs = zip(prompts, completions, strict=True)
    return [len(c.split()) / 4 - 0.5 * c.count(":") + 0.1 * len(p.split()) for p, c in pairs]


def _cfg(path, out, **kw) -> RLConfig:
    base = dict(policy=str(path), output_dir=out, k=K, beta=BETA, max_new_tokens=8, seed=0, max_grad_norm=1e6)
    return RLConfig(**(base | kw))


def _token_logprobs(model, x, y):
    """log pi(y_t|x, y_<t) of one unpadded prompt x (P,) and completion y (T,): a plain forward."""
    logits = model(input_ids=torch.cat([x, y])[None], use_cache=False).logits[0].float()
    return logits[len(x) - 1 : len(x) + len(y) - 1].log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)


def _weights(log_ratio: torch.Tensor, correction: str) -> torch.Tensor:
    rho = log_ratio.exp()
    if correction.startswith("tis"):
        return rho.clamp(max=C)
    if correction.startswith("mis"):
        return torch.where((rho >= 1 / C) & (rho <= C), rho, torch.zeros_like(rho))
    return torch.ones_like(rho)


def reference_gradient(models, roll, cfg, correction, kl_outside=False, mu=None):
    """mu: the behaviour's per-token log-probs of each row's real tokens (list of (T_i,)); by default
    the rollout's stored ones (`roll.logprobs`)."""
    policy = models.policy
    policy.eval()
    n = len(roll.prompts)
    ids, mask = roll.completion_ids, roll.completion_mask
    seqs = [(roll.prompt_ids[i][roll.prompt_mask[i]], ids[i][mask[i]]) for i in range(n)]
    lp = [_token_logprobs(policy, x, y) for x, y in seqs]
    mu = [m.double() for m in mu] if mu is not None else [roll.logprobs[i][mask[i]].double() for i in range(n)]
    with torch.no_grad():
        ref = torch.stack([_token_logprobs(models.ref, x, y).sum() for x, y in seqs]).double()
    scores = torch.tensor(reward_fn(roll.prompts, roll.completions), dtype=torch.float64)
    penalty = -cfg.beta * (torch.stack([t.sum() for t in lp]).detach().double() - ref)
    adv = _loo(scores + penalty)  # eq. A1, eq. 4
    # eq. A4 (is_kl=unweighted): only the scores' share of the advantage is weighted
    adv_w, adv_kl = (_loo(scores), _loo(penalty)) if kl_outside else (adv, torch.zeros_like(adv))
    loss, seen = 0.0, []
    for i in range(n):
        if correction.endswith("_token"):
            w = _weights(lp[i].detach().double() - mu[i], correction)
            loss = loss - float(adv_w[i]) * (w.float() * lp[i]).sum()
        else:
            w = _weights(lp[i].detach().double().sum() - mu[i].sum(), correction)
            loss = loss - float(adv_w[i]) * float(w) * lp[i].sum()
        loss = loss - float(adv_kl[i]) * lp[i].sum()
        seen.append(w.flatten())
    params = [(name, p) for name, p in policy.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss / n, [p for _, p in params])
    policy.train()
    return dict(zip([name for name, _ in params], grads, strict=True)), torch.cat(seen)


def _loo(rewards: torch.Tensor) -> torch.Tensor:
    """Eq. 4 on (N,) rewards in groups of K."""
    groups = rewards.view(-1, K)
    return (groups - (groups.sum(1, keepdim=True) - groups) / (K - 1)).view(-1)


LORA = dict(lora=LoraSettings(r=4, alpha=8))
KL_OUT = dict(is_kl="unweighted")
CHUNKED_CHECKPOINTED = dict(gradient_checkpointing=True, max_logits_mb=1e-3)  # LM head in chunks


@pytest.mark.parametrize(
    "correction,share,lag,extra",
    # lag 0 with a correction: a sampler whose log-probs differ from the trainer's (vLLM, bf16)
    [
        ("tis", True, 0, {}),
        ("mis", False, 1, {}),
        ("tis_token", False, 1, {}),
        ("mis_token", True, 2, {}),
        ("none", True, 1, {}),
        ("tis", True, 1, LORA),
        ("mis", True, 1, CHUNKED_CHECKPOINTED),
        # eq. A4: the KL's share outside the weights
        ("tis", True, 1, KL_OUT),
        ("mis_token", False, 2, KL_OUT),
        ("mis", True, 2, KL_OUT | LORA),
        ("tis", False, 1, KL_OUT | CHUNKED_CHECKPOINTED),
    ],
)
def test_corrected_gradient_matches_the_per_sequence_reference(tiny_model_dir, tmp_path, correction, share, lag, extra):
    kw = dict(is_correction=correction, is_clip=C, share_prompt=share, max_staleness=lag)
    cfg = _cfg(tiny_model_dir, tmp_path, **kw, **extra)
    models = load_models(cfg, reward_fn=reward_fn)
    behaviour = shadow_copy(models.policy)  # mu: the policy a few updates ago, here a perturbed copy
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in behaviour.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))

    def sample_with_mu(policy, prompts, rows=None, generator=None):
        s = Sampling(cfg.max_new_tokens, cfg.max_prompt_tokens, share_prompt=share)
        return rollout(behaviour, models.tokenizer, prompts, K, s, generator=torch.Generator().manual_seed(0))

    models.sampler = sample_with_mu
    if cfg.is_kl == "unweighted":  # trained away from the reference, or every KL (and A^kl) is 0
        with torch.no_grad():
            g = torch.Generator().manual_seed(2)
            for p in models.policy.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
    opt = GradRecorder(models.policy)
    result = make_algorithm(cfg, models).step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    stats, roll = result.stats, result.rollout
    kl_outside = cfg.is_kl == "unweighted"
    expected, weights = reference_gradient(models, roll, cfg, correction, kl_outside)
    scale = max(g.abs().max().item() for g in expected.values())
    for name, g in expected.items():
        assert_close(opt.grads[name], g, TINY_MODEL_BACKWARD * C, scale=scale, msg=name)
    if kl_outside:  # the KL inside the weights is another gradient, beyond the tolerance
        other, _ = reference_gradient(models, roll, cfg, correction, kl_outside=False)
        off = max((opt.grads[n] - g).abs().max().item() for n, g in other.items())
        assert off > 100 * TINY_MODEL_BACKWARD * C * torch.finfo(torch.float32).eps * scale
    if correction != "none":  # the batch must exercise both sides of the bound, or the test proves little
        assert 0.0 < stats["is/truncated" if correction.startswith("tis") else "is/masked"] < 1.0, stats
        assert weights.min() < 1.0 and weights.max() > 0.0


def test_on_policy_path_is_untouched_at_lag_zero(tiny_model_dir, tmp_path, monkeypatch):
    """max_staleness=0 without is_correction never reaches the off-policy code (the paper's update,
    tests/equivalence/test_gradient_matrix.py checks its gradient)."""
    import rloo.algorithms.rloo as rloo_mod

    monkeypatch.setattr(rloo_mod, "off_policy_loss", lambda *a: pytest.fail("off-policy path at lag 0"))
    cfg = _cfg(tiny_model_dir, tmp_path)
    assert cfg.off_policy_correction is None
    models = load_models(cfg, reward_fn=reward_fn)
    stats = (
        make_algorithm(cfg, models)
        .step(models, GradRecorder(models.policy), PROMPTS, cfg, torch.Generator().manual_seed(0))
        .stats
    )
    assert not any(k.startswith("is/") for k in stats)


@pytest.mark.parametrize("lag,kind", [(1, "in_process"), (2, "in_process"), (1, "producer"), (2, "producer")])
def test_lagged_batches_come_from_the_weights_of_update_t_minus_n(tiny_model_dir, tmp_path, lag, kind):
    """Fingerprint: batch t's stored log-probs are those of exactly the weights after update t - N
    (recomputed here from a saved copy), and not those of the versions next to it; in the trainer's
    process (LaggedSampler) and from the producer process (ProducerSampler)."""
    cfg = _cfg(tiny_model_dir, tmp_path, max_staleness=lag, batch_size=2)
    models = load_models(cfg, reward_fn=reward_fn)
    policy, stream = models.policy, PromptStream(PROMPTS, 2, seed=0)
    if kind == "producer":
        sampler = ProducerSampler(policy, models.tokenizer, cfg, copy.deepcopy(stream))
    else:
        sampler = LaggedSampler(policy, models.tokenizer, cfg)
    try:
        _check_versions(sampler, policy, stream, lag)
    finally:
        getattr(sampler, "close", lambda: None)()


def _check_versions(sampler, policy, stream, lag):
    versions = [shadow_copy(policy)]  # versions[v]: the weights after v updates
    for t in range(5):
        roll = sampler(policy, stream.next())
        assert roll.lag == min(t, lag)
        lps = [_logprobs(m, roll) for m in versions]
        want = max(0, t - lag)
        scale = roll.logprobs.abs().max().item()
        assert_close(roll.logprobs, lps[want], TINY_MODEL_FORWARD, scale=scale)
        others = [v for v in (want - 1, want + 1) if 0 <= v < len(versions)]
        for v in others:
            assert (lps[v] - roll.logprobs).abs().max() > 1e3 * TINY_MODEL_FORWARD * 1.2e-7 * scale
        with torch.no_grad():  # an "update": a distinguishable change of every weight
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + t)))
        versions.append(shadow_copy(policy))
        sampler.sync(policy)


def _logprobs(model, roll):
    with torch.no_grad():
        lp = completion_logprobs(model, roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
    return torch.where(roll.completion_mask, lp, torch.zeros_like(lp))
