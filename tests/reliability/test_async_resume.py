"""Exact resume at rl.max_staleness = N > 0 (docs/async.md): a run stopped by SIGTERM at step s and
resumed logs the same metrics, samples the same tokens and ends with the same weights, bit for bit,
as a run that never stopped; in the trainer's process (LaggedSampler, 1 thread) and with the rollout
producer process (2 threads). The checkpoint holds the older weight versions the next N batches are
sampled with, and batch t's sampling generator depends on (seed, t) alone."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import rloo.algorithms.rloo as rl
import rloo.rollout.producer as producer
from rloo import train
from rloo.errors import Interrupted
from rloo.runtime.checkpoint.verify import latest_checkpoint, step_of

from ._helpers import PROMPTS, assert_same_params
from .conftest import rl_config


def reward_short(prompts, completions):
    """A module-level reward: the producer can import it and scores its batches."""
    return [-len(c.split()) / 10 for c in completions]


def _record_batches(monkeypatch, threads: int, batches: list) -> None:
    """Force the in-process sampler (1) or the producer (2), and record each batch the trainer
    takes: its sampled tokens and their behaviour log-probs."""
    monkeypatch.setattr(producer.torch, "get_num_threads", lambda: threads)
    for cls in (producer.ProducerSampler, producer.LaggedSampler):

        def call(self, policy, prompts, rows=None, generator=None, f=cls.__call__):
            roll = f(self, policy, prompts, rows=rows, generator=generator)
            batches.append((roll.completion_ids.clone(), roll.logprobs.detach().clone()))
            return roll

        monkeypatch.setattr(cls, "__call__", call)


def _signal_in_step(monkeypatch, at_step: int) -> None:
    real, calls = rl.rloo_step, {"n": 0}

    def step(*a, **kw):
        calls["n"] += 1
        out = real(*a, **kw)
        if calls["n"] == at_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(rl, "rloo_step", step)


def _metrics(out: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock times (which no two runs share)."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def _run(tiny_model_dir, out, n: int, threads: int, monkeypatch, batches: list, stop_at=None, resume=False, **kw):
    _record_batches(monkeypatch, threads, batches)
    if stop_at is not None:
        _signal_in_step(monkeypatch, stop_at)
    cfg = rl_config(tiny_model_dir, out, max_staleness=n, lr=1e-2, **kw)  # 6 steps, checkpoints at 2, 4, 6
    try:
        train(cfg, prompts=PROMPTS, reward_fn=reward_short, resume=resume)
    finally:
        monkeypatch.undo()
        torch.set_num_threads(int(os.environ.get("RLOO_TEST_THREADS", "2")))  # the producer's close() set it


def _check_exact_resume(tiny_model_dir, tmp_path, monkeypatch, n, threads, stops, **kw) -> Path:
    """A never-stopped run, and one stopped by SIGTERM at each step of `stops` in turn (each stop in a
    run resumed from the one before), then resumed to its end."""
    ref = tmp_path / "ref"
    want, got, out = [], [], tmp_path / "run"
    _run(tiny_model_dir, ref, n, threads, monkeypatch, want, **kw)
    done = 0
    for stop_at in stops:
        with pytest.raises(Interrupted, match=f"stopped at step {stop_at}/6"):
            _run(tiny_model_dir, out, n, threads, monkeypatch, got, stop_at=stop_at - done, resume=done > 0, **kw)
        assert step_of(latest_checkpoint(out)) == stop_at
        done = stop_at
    _run(tiny_model_dir, out, n, threads, monkeypatch, got, resume=True, **kw)
    assert len(got) == len(want) == 6  # the batches the trainer took (a producer's extra ones were dropped)
    for t, ((tokens, lp), (want_tokens, want_lp)) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(tokens, want_tokens) and torch.equal(lp, want_lp), f"batch {t} differs"
    assert _metrics(out) == _metrics(ref)
    assert [r["is/lag"] for r in _metrics(out) if "is/lag" in r] == [min(t, n) for t in range(6)]
    assert_same_params(ref / "model", out / "model")
    return out


# N = 2: stopped at 1, before the lag is N, resumed, stopped again at 3, after it, resumed to the end
# (one never-stopped run for both stops); the LoRA case below stops a fresh run at 3 at N = 2
@pytest.mark.parametrize(("n", "stops"), [(1, (3,)), (2, (1, 3))], ids=["1-stop3", "2-stop1-stop3"])
def test_in_process_lag_resumes_exactly(tiny_model_dir, tmp_path, monkeypatch, n, stops):
    _check_exact_resume(tiny_model_dir, tmp_path, monkeypatch, n, threads=1, stops=stops)


@pytest.mark.slow  # three producer processes started: 39-43 s each at load average 4 on 2 cores
@pytest.mark.parametrize("n", [1, 2])  # the default suite has N = 1 in test_async_processes.py (SIGKILL, --resume)
def test_producer_resumes_exactly(tiny_model_dir, tmp_path, monkeypatch, n):
    _check_exact_resume(tiny_model_dir, tmp_path, monkeypatch, n, threads=2, stops=(3,))


def test_lora_resumes_exactly_from_the_adapters_alone(tiny_model_dir, tmp_path, monkeypatch):
    """Under LoRA the base weights are every version's: a checkpoint's older versions are the adapters."""
    pytest.importorskip("peft")
    from rloo.config import LoraSettings

    lora = LoraSettings(r=4, save="merged")
    out = _check_exact_resume(tiny_model_dir, tmp_path, monkeypatch, 2, threads=1, stops=(3,), lora=lora)
    ring = {f.name: load_file(f) for f in sorted((out / "checkpoints" / "step-000004" / "ring").iterdir())}
    assert list(ring) == ["version-000002.safetensors", "version-000003.safetensors"] and all(ring.values())
    assert all("lora_" in name for v in ring.values() for name in v)
