"""generation=vllm with rl.max_staleness > 0, without vLLM, in the default suite: the lagged samplers
(the producer's loop, its in-process stand-in) start their own engine, sync it once per weight version
and train on the engine's own log-probs as mu. The engine is a stand-in that samples with rloo's
sampler from its own copy of the weights it was last synced with (a sync that did not happen shows as
another version's tokens) and returns those log-probs shifted by DELTA as its own. The same on a real
engine: test_vllm_lagged.py (marked `vllm`)."""

from __future__ import annotations

import copy
import math
import sys

import pytest
import torch

from rloo import RLConfig
from tolerance import TINY_MODEL_FORWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : my dog ate tl;dr :"]
DELTA = -0.25  # the stand-in's log mu - log pi on every token: far above any rounding


class StandIn:
    """What rloo.rollout.versioned needs of rloo.rollout.vllm.VLLMSampler: (cfg, tokenizer, policy,
    precision=), `sync`, `__call__` and `part_metrics`, each engine made recorded in `made`."""

    made: list[StandIn] = []

    def __init__(self, cfg, tokenizer, policy, precision=None):
        self.cfg, self.tokenizer, self.weights, self.synced = cfg, tokenizer, copy.deepcopy(policy), []
        self.metrics: dict[str, float] = {}
        self.sync(policy)
        StandIn.made.append(self)

    def sync(self, policy):
        self.weights.load_state_dict(policy.state_dict())
        self.synced.append(float(sum(p.double().sum() for p in policy.state_dict().values())))

    def __call__(self, policy, prompts, rows=None, generator=None):
        from rloo.rollout.sampler import rollout

        roll = rollout(self.weights, self.tokenizer, prompts, self.cfg.k, self.cfg.sampling, generator=generator)
        mu = (roll.logprobs + DELTA).masked_fill(~roll.completion_mask, 0.0)
        roll.logprobs, roll.sampler_logprobs = mu, mu  # the behaviour under a correction, as VLLMSampler's
        self.metrics = {"vllm/kl_mu_pi": -DELTA}
        return roll

    def part_metrics(self):
        return self.metrics


@pytest.fixture
def standin(monkeypatch):
    import rloo.rollout.versioned as versioned
    import rloo.training.rl as rl

    StandIn.made = []
    monkeypatch.setattr(versioned, "VLLMSampler", StandIn)
    monkeypatch.setattr(rl, "check_lagged_vllm", lambda cfg, device: None)  # vLLM is absent here
    return StandIn


def _cfg(path, out, **kw) -> RLConfig:
    base = dict(policy=str(path), output_dir=out, generation="vllm", max_staleness=1, k=2, batch_size=3, steps=4)
    return RLConfig(**base | dict(max_new_tokens=5, max_prompt_tokens=16, eval_every=None, save_every=None) | kw)


def _perturbed(policy, seed: int):
    out = copy.deepcopy(policy)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return out


def test_the_producer_samples_each_batch_with_the_engine_synced_to_its_version(tiny_model_dir, tmp_path, standin):
    """rloo.rollout.producer.produce in this process, the trainer played by `wait` (it publishes version
    v when the producer first waits for it): batch j is sampled by the engine holding version
    max(0, j - 1), which got each version once, and its rows carry the engine's log-probs as mu."""
    from rloo.data.prompts import PromptStream
    from rloo.modeling.loading import load_policy
    from rloo.rollout.lagged import shadow_copy
    from rloo.rollout.producer import Job, produce
    from rloo.rollout.sampler import rollout
    from rloo.runtime.checkpoint.rng import batch_generator
    from rloo.runtime.link.weights import WeightRing

    policy, tok = load_policy(str(tiny_model_dir))
    cfg = _cfg(tiny_model_dir, tmp_path)
    versions = {0: policy}
    ring, items = WeightRing(policy, cfg.ring_lag), []

    def wait(v):
        if v > cfg.steps:  # the producer's last wait: the run is over
            return False
        if not ring.holds(v):
            versions[v] = _perturbed(policy, v)
            ring.publish(v, versions[v])
        return True

    stream = PromptStream(PROMPTS, cfg.batch_size, cfg.seed)
    produce(Job(cfg, shadow_copy(policy), tok, copy.deepcopy(stream), 0), ring, wait, lambda i: items.append(i) or True)
    assert [(j, v) for _, j, v, _, _ in items] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    (engine,) = standin.made
    assert len(engine.synced) == 3  # versions 0 (at its start), 1, 2: once each
    for _, j, v, parts, roll in items:
        own = rollout(versions[v], tok, stream.next(), cfg.k, cfg.sampling, generator=batch_generator(cfg.seed, j))
        assert torch.equal(roll.completion_ids, own.completion_ids), (j, v)
        # the engine's log-probs, sampled from its copy of the weights (another copy than `own`'s)
        assert torch.equal(roll.logprobs, roll.sampler_logprobs)
        assert_close(roll.logprobs, (own.logprobs + DELTA).masked_fill(~own.completion_mask, 0.0), TINY_MODEL_FORWARD)
        assert parts["vllm/kl_mu_pi"] == -DELTA and "time/producer_sample" in parts
    # the versions sample differently: an engine left on an older version would fail the check above
    a, b = (rollout(versions[v], tok, PROMPTS, cfg.k, cfg.sampling, generator=batch_generator(0, 3))
            for v in (1, 2))  # fmt: skip
    assert not torch.equal(a.completion_ids, b.completion_ids)


def test_a_lagged_run_trains_on_the_engines_logprobs(tiny_model_dir, tmp_path, standin, monkeypatch):
    """`rloo.train` with generation=vllm, max_staleness=1 on one thread (the lag in the trainer's process,
    rloo.rollout.lagged): one engine, synced once per version, its mismatch and the importance
    weights' stats logged each step. At lag 0 (step 1) the ratio pi/mu is exp(-DELTA) per token: the
    weight uses the engine's log-probs, not the trainer's own."""
    import rloo.rollout.producer as producer
    from rloo import train

    monkeypatch.setattr(producer.torch, "get_num_threads", lambda: 1)
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=3, is_correction="none", lr=1e-2, warmup_steps=0)
    history = [
        h for h in train(cfg, prompts=PROMPTS, reward_fn=lambda p, c: [0.0] * len(c)).history if "loss/policy" in h
    ]
    (engine,) = standin.made
    assert len(engine.synced) == 2  # versions 0 and 1 (batches 0, 1 take 0; batch 2 takes 1)
    assert [h["is/lag"] for h in history] == [0.0, 1.0, 1.0]
    assert all(h["vllm/kl_mu_pi"] == -DELTA for h in history)
    # lag 0: log pi - log mu = -DELTA on each of a row's >= 1 tokens, up to the recomputation's rounding
    # (per token about 2^8 eps (1 + |log p|), |log p| <= 10: tests/integration/test_async.py), <= 5 tokens
    rounding = 5 * 2**8 * torch.finfo(torch.float32).eps * 11
    assert history[0]["is/ratio_min"] >= math.exp(-DELTA - rounding)


def test_a_lagged_vllm_run_without_vllm_is_one_line_exit_2(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The trainer checks vLLM where the lagged engine will run (here: the producer process it starts),
    before the run folder is made."""
    from rloo.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)
    out = tmp_path / "out"
    args = [f"policy={tiny_model_dir}", f"output_dir={out}", "generation=vllm", "max_staleness=1", "steps=1"]
    rc = main(["train", *args, "reward_fn=math:fsum", "report_to=none"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert rc == 2 and len(errors) == 1 and errors[0].startswith("rloo train: error: generation=vllm needs vLLM")
    assert not out.exists()


class EngineStarted(Exception):
    """Raised by the stand-in engine once it is built: the test needs its dtype, not its samples."""


@pytest.mark.parametrize("here,trainer", [("float32", torch.bfloat16), ("bfloat16", None), ("bfloat16", "none")])
def test_the_producers_engine_computes_in_the_trainers_precision(tiny_model_dir, tmp_path, monkeypatch, here, trainer):
    """With dtype=auto the producer's machine (another CPU kind: its dtype=auto pinned to `here` by
    RLOO_AUTO_DTYPE) starts rloo's real VLLMSampler in the precision the trainer handed over
    (`trainer`: its compute dtype, None = fp32 without autocast), not its own resolution of dtype=auto:
    the engine's mu must be the distribution the trainer's precision samples. "none": a job without a
    precision, where the engine follows the producer's own rule (`sampling_precision`), as before."""
    from types import SimpleNamespace

    import rloo.rollout.vllm as vllm
    from rloo.data.prompts import PromptStream
    from rloo.modeling.loading import load_policy
    from rloo.rollout.lagged import shadow_copy
    from rloo.rollout.producer import Job, produce
    from rloo.runtime.link.weights import WeightRing
    from rloo.runtime.precision import Precision

    started = {}

    def start_engine(_vllm, _path, *, dtype, **kw):
        started["dtype"] = dtype
        raise EngineStarted

    monkeypatch.setattr(vllm, "import_vllm", lambda: SimpleNamespace(SamplingParams=dict))
    monkeypatch.setattr(vllm, "check_device", lambda v, device: None)
    monkeypatch.setattr(vllm, "start_engine", start_engine)
    monkeypatch.setenv("RLOO_AUTO_DTYPE", here)
    policy, tok = load_policy(str(tiny_model_dir))
    cfg = _cfg(tiny_model_dir, tmp_path, dtype="auto")
    precision = None if trainer == "none" else Precision("cpu", torch.float32, trainer, "the trainer's")
    job = Job(cfg, shadow_copy(policy), tok, PromptStream(PROMPTS, cfg.batch_size, cfg.seed), 0, precision=precision)
    with pytest.raises(EngineStarted):
        produce(job, WeightRing(policy, cfg.ring_lag), lambda v: True, lambda item: True)
    expected = here if precision is None else str(trainer or torch.float32).removeprefix("torch.")
    assert started["dtype"] == expected
