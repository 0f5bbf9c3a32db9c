"""The worker processes of `rloo bench`: one trainer each (rloo's step, or TRL's RLOOTrainer: bench_trl.py), which
takes one step when the parent says go and sends back its time, tokens, widths and peak memory.
Each runs in a process of its own, so each one's peak memory is its own.

rloo with generation=vllm (trainer rloo-vllm): the same worker, its RLConfig saying generation=vllm, so
load_models starts vLLM's engine in the worker's process (rloo.rollout.vllm_engine); a step's time
includes the reload of the updated weights into the engine (phase time/weight_sync), as in `rloo train`.

rloo at max_staleness = N > 0 (docs/async.md): the worker starts the rollout producer as `rloo train`
does (rloo.rollout.producer.ProducerSampler, scoring in the producer, threads split 1 + 1 on 2) and
publishes the weights after each update, as the loop does. A step's time is the trainer's: its wait
for the producer's batch, the update and the weight hand-off. The producer runs only during its own
trainer's steps: it is stopped (SIGSTOP) while the other trainers take their turn, so it neither
takes their CPU nor gets ahead by their time; each step sees the queue as back-to-back steps leave it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import torch

from rloo.algorithms.rloo import rloo_step
from rloo.config import RLConfig
from rloo.experiments.bench_machine import peak_memory_gb, release_cache
from rloo.rollout.producer import ProducerSampler
from rloo.runtime.precision import resolve_precision
from rloo.training.common import adamw, seed_everything
from rloo.training.rl import load_models, producer_scoring

# ---------------------------------------------------------------- rloo worker


def rloo_trainer(job: dict):
    """rloo's trainer as the bench runs it, from a bench job (rloo.experiments.bench.bench_job):
    (models, AdamW, its RLConfig, the seeded generator)."""
    torch.set_num_threads(job["threads"])
    cfg = RLConfig(
        policy=job["policy"],
        reward_model=job["reward"],
        k=job["k"],
        beta=job["beta"],
        lr=job["lr"],
        batch_size=job["batch_size"],
        max_new_tokens=job["max_new_tokens"],
        warmup_steps=0,
        max_prompt_tokens=job["max_prompt_tokens"],
        share_prompt=job["share_prompt"],
        seed=job["seed"],
        gradient_checkpointing=job.get("gradient_checkpointing", False),
        device=job["device"],
        dtype=job["dtype"],
        max_staleness=job.get("max_staleness", 0),
        generation=job.get("generation", "sampler"),  # vllm: load_models starts the engine in this process
        **job.get("rl", {}),  # a variant's own keys (benchmarks/gpu_bench.py: captured_decode, micro_batch_size)
    )
    gen = seed_everything(cfg.seed)
    models = load_models(cfg)
    return models, adamw(models.policy.parameters(), cfg.lr), cfg, gen


def _rloo_worker(conn, job: dict) -> None:
    models, opt, cfg, gen = rloo_trainer(job)
    producer = None
    if cfg.max_staleness:  # as rloo.training.rl starts it, on the bench's batches
        score = producer_scoring(models, cfg)
        producer = models.sampler = ProducerSampler(
            models.policy, models.tokenizer, cfg, Batches(job["batches"]), 0, score
        )
        _signal(producer, signal.SIGSTOP)
    conn.send({"ready": True, "rss_gb": peak_memory_gb(cfg.device)})
    try:
        for i, _ in enumerate(iter(conn.recv, "stop")):
            result = timed_rloo_step(models, opt, cfg, gen, job["batches"][i], producer)
            release_cache(job)
            conn.send(result)
    finally:  # a stopped producer could neither stop nor be reaped
        if producer is not None:
            _signal(producer, signal.SIGCONT)
            producer.close()


def timed_rloo_step(models, opt, cfg, gen, batch: list[str], producer) -> dict:
    """One step (with the producer: let it run, step, publish the weights, stop it), what it took."""
    _signal(producer, signal.SIGCONT)
    t0 = time.perf_counter()
    # as `rloo train` runs it: under the stage's precision, rows= as in rloo.runtime.distributed.step_kwargs
    with resolve_precision(cfg.dtype, cfg.device).autocast():
        result = rloo_step(models, opt, batch, cfg, gen, rows=(0, len(batch) * cfg.k))
        stats, roll = result.stats, result.rollout
    if producer is not None:  # rloo.training.loop publishes the new weights after each update
        producer.sync(models.policy)
        # the trainer's wait; not the producer's time/producer_*: its clock runs on while it is stopped
        stats["time/trainer_wait"] = producer.part_metrics()["time/trainer_wait"]
    elif models.sampler is not None:  # vLLM's copy of the weights, reloaded after each update as the loop does
        t_sync = time.perf_counter()
        models.sampler.sync(models.policy)
        stats["time/weight_sync"] = time.perf_counter() - t_sync
    if cfg.device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    _signal(producer, signal.SIGSTOP)
    return {
        "time": dt,
        "tokens": int(roll.completion_mask.sum()),
        "lengths": roll.completion_mask.sum(-1).tolist(),
        "width": roll.completion_ids.shape[1],
        "rss_gb": peak_memory_gb(cfg.device),
        "phases": {k: float(v) for k, v in stats.items() if k.startswith("time/")},
        "lag": float(stats["is/lag"]) if "is/lag" in stats else None,
        "producer_rss_gb": _vm_hwm_gb(producer.pid) if producer is not None and cfg.device == "cpu" else None,
    }


class Batches:
    """The bench's batches as the producer's prompt stream (`next()`, as rloo.data.prompts.PromptStream),
    wrapping round: the producer samples up to N + 1 batches past the last one its trainer takes."""

    def __init__(self, batches: list[list[str]]):
        self.batches, self.i = batches, 0

    def next(self) -> list[str]:
        self.i += 1
        return self.batches[(self.i - 1) % len(self.batches)]


def _signal(producer, signum: int) -> None:
    if producer is not None and producer.pid is not None:
        os.kill(producer.pid, signum)


def _vm_hwm_gb(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of process `pid`, GB."""
    try:
        lines = open(f"/proc/{pid}/status").read().splitlines()
    except OSError:
        return None
    return next((int(ln.split()[1]) / 1e6 for ln in lines if ln.startswith("VmHWM:")), None)


# ---------------------------------------------------------------- starting a worker (in the parent)


def _start(target, job):
    return _ready(_spawn(target, job))


def _spawn(target, job):
    """Start one worker process; `_ready` waits for its "ready" (several may load at once)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    # a daemon cannot start the rollout producer: that worker ends when the parent says stop, or at
    # the EOF of its pipe when the parent dies (the producer with it: rloo.runtime.link.child)
    proc = ctx.Process(target=target, args=(child, job), daemon=not job.get("max_staleness"))
    proc.start()
    child.close()  # the worker's end lives in the worker: if it dies, recv() raises instead of waiting for ever
    return proc, parent


def _ready(started):
    proc, parent = started
    return proc, parent, parent.recv()
