"""`rloo bench`'s TRL worker samples as the bench's rloo worker does: TRL's config gets rloo's default
Sampling under Hugging Face's names (TRL itself is the optional `bench` extra: a stand-in module
records what its RLOOConfig is given)."""

from __future__ import annotations

import sys
import types

from rloo import RLConfig
from rloo.experiments.bench_trl import trl_args


def test_trl_draws_with_the_sampling_of_rloos_bench_worker(monkeypatch, tmp_path):
    trl = types.ModuleType("trl")
    trl.RLOOConfig = lambda **kw: kw  # type: ignore[attr-defined]  # the stand-in returns what it was given
    monkeypatch.setitem(sys.modules, "trl", trl)
    job = dict(batch_size=2, k=4, max_new_tokens=16, max_prompt_tokens=32, tmp=str(tmp_path), beta=0.05)
    job |= dict(lr=1e-5, batches=[["a", "b"]] * 3, seed=0, dtype="float32", device="cpu")
    args = trl_args(job)
    # the rloo worker's config (rloo.experiments.bench_workers.rloo_trainer), no variant keys
    rloo = RLConfig(policy="p", reward_model="r", max_new_tokens=16, max_prompt_tokens=32).sampling
    assert {k: args[k] for k in ("temperature", "top_p", "top_k")} == rloo.hf_draw()
    assert (args["temperature"], args["top_p"], args["top_k"]) == (1.0, 1.0, 0)  # nothing truncated
    assert args["max_completion_length"] == 16 and args["num_generations"] == 4 and args["max_steps"] == 3
