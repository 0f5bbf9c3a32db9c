"""The importance weight's mu is the sampling engine's own log-probs (generation=vllm; docs/async.md),
at lag 0 (rl.is_correction for the engines' mismatch alone) and at lag 1 (the lagged engine: lag and
mismatch in one weight), against test_offpolicy.py's per-sequence reference given the engine's mu.

The engine is a stand-in for vllm.LLM behind rloo's real VLLMSampler (its rows, its sync through
`collective_rpc("reload_weights")`, its choice of mu): it samples with rloo's `sample` from its own
copy of the weights it was synced with and returns each sampled token's log-prob plus Gaussian noise
(NOISE per token) as its own, so mu differs from every log-prob the trainer could compute. The
reference takes mu from what the engine returned, not from the rollout: a VLLMSampler that handed the
update pi's recomputed log-probs as the behaviour fails (checked: docs/async.md)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch

from helpers.grads import GradRecorder
from rloo.algorithms import make_algorithm
from rloo.config import Sampling
from rloo.rollout.lagged import LaggedSampler
from rloo.rollout.sampler import sample_tokens
from rloo.rollout.vllm import VLLMSampler
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_BACKWARD, assert_close

from .test_offpolicy import PROMPTS, C, _cfg, _token_logprobs, reference_gradient, reward_fn

NOISE = 0.2  # per token, in log-prob: rho spreads to both sides of [1/C, C] on a batch of 12 rows


@dataclass
class Params:
    """The SamplingParams fields VLLMSampler reads and sets (rloo.rollout.vllm.request_params)."""

    temperature: float
    n: int
    seed: int | None = None

    def clone(self):
        return replace(self)


class Engine:
    """vllm.LLM's calls that VLLMSampler makes. `mu`: the last generate's log-probs per row (T_i,)."""

    def __init__(self, model, tokenizer, cfg):
        self.model, self.tok, self.cfg = copy.deepcopy(model).eval(), tokenizer, cfg
        self.noise, self.draws, self.mu, self.syncs = torch.Generator().manual_seed(7), torch.Generator(), [], 0
        self.draws.manual_seed(0)

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"]
        self.model.load_state_dict(dict(kwargs["weights_iterator"]))
        self.syncs += 1

    def reset_prefix_cache(self):
        pass

    @torch.no_grad()
    def generate(self, inputs, params, use_tqdm):
        cfg, eos, outs, self.mu = self.cfg, self.tok.eos_token_id, [], []
        for p in inputs:
            ids = torch.tensor([p["prompt_token_ids"]])
            s, mask = Sampling(cfg.max_new_tokens, ids.shape[1], cfg.temperature), torch.ones_like(ids).bool()
            pad = self.tok.pad_token_id
            c_ids, c_mask, lps = sample_tokens(
                self.model, ids, mask, s, k=cfg.k, eos_id=eos, pad_id=pad, generator=self.draws
            )
            rows = []
            for r in range(cfg.k):
                tokens = c_ids[r][c_mask[r]].tolist()
                noise = NOISE * torch.randn(len(tokens), generator=self.noise)
                mu = (lps[r][c_mask[r]].float() + noise).float()  # float32, as the rollout stores it
                self.mu.append(mu)
                steps = [{t: SimpleNamespace(logprob=float(v))} for t, v in zip(tokens, mu, strict=True)]
                finish = "stop" if tokens[-1] == eos else "length"
                rows.append(SimpleNamespace(token_ids=tuple(tokens), finish_reason=finish, logprobs=steps))
            outs.append(SimpleNamespace(outputs=rows))
        return outs


def standin(cfg, tokenizer, policy, engine: Engine) -> VLLMSampler:
    """rloo's VLLMSampler with `engine` for vllm.LLM: what its __init__ sets, then its first sync."""
    s = object.__new__(VLLMSampler)
    s.vllm, s.tokenizer, s.k, s.max_prompt_len = (
        SimpleNamespace(TokensPrompt=dict),
        tokenizer,
        cfg.k,
        cfg.max_prompt_tokens,
    )
    s.behaviour, s.metrics, s.device, s.llm = cfg.off_policy_correction is not None, {}, torch.device("cpu"), engine
    s.params = Params(cfg.temperature, cfg.k)
    s.sync(policy)
    return s


def _move(model, seed: int) -> None:
    """An "update": every weight changed by a distinguishable amount."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize(
    "correction,share,lag", [("tis", True, 0), ("mis", False, 0), ("tis", False, 1), ("mis_token", True, 1)]
)
def test_the_weight_uses_the_engines_own_logprobs(tiny_model_dir, tmp_path, monkeypatch, correction, share, lag):
    import rloo.rollout.versioned as versioned

    cfg = _cfg(tiny_model_dir, tmp_path, is_correction=correction, is_clip=C, share_prompt=share, max_staleness=lag)
    models = load_models(cfg, reward_fn=reward_fn)
    engine = Engine(models.policy, models.tokenizer, cfg)
    if lag == 0:  # generation=vllm at lag 0: the trainer's own engine, synced to the trained weights
        models.sampler = standin(cfg, models.tokenizer, models.policy, engine)
    else:  # the lagged sampler starts its engine from version 0; the trainer is at version 1
        monkeypatch.setattr(
            versioned, "VLLMSampler", lambda c, tok, model, precision=None: standin(c, tok, model, engine)
        )
        lagged = cfg.model_copy(update={"generation": "vllm"})
        models.sampler = LaggedSampler(models.policy, models.tokenizer, lagged)
        _move(models.policy, 3)
        models.sampler.sync(models.policy)
    opt = GradRecorder(models.policy)
    result = make_algorithm(cfg, models).step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    stats, roll = result.stats, result.rollout
    assert roll.lag == lag and engine.syncs == 1 and len(engine.mu) == len(roll.prompts)
    expected, weights = reference_gradient(models, roll, cfg, correction, mu=engine.mu)
    scale = max(g.abs().max().item() for g in expected.values())
    for name, g in expected.items():
        assert_close(opt.grads[name], g, TINY_MODEL_BACKWARD * C, scale=scale, msg=name)
    # the test can fail: with the sampling weights' own log-probs as mu (what pi recomputed would give)
    # the weights, and so the gradient, are another one
    seqs = [(roll.prompt_ids[i][roll.prompt_mask[i]], roll.completion_ids[i][roll.completion_mask[i]])
            for i in range(len(roll.prompts))]  # fmt: skip
    with torch.no_grad():
        own = [_token_logprobs(engine.model, x, y) for x, y in seqs]
    other, _ = reference_gradient(models, roll, cfg, correction, mu=own)
    off = max((opt.grads[n] - g).abs().max().item() for n, g in other.items())
    assert off > 100 * TINY_MODEL_BACKWARD * C * torch.finfo(torch.float32).eps * scale
    assert 0.0 < stats["is/truncated" if correction.startswith("tis") else "is/masked"] < 1.0, stats
    assert weights.min() < 1.0 and weights.max() > 0.0
