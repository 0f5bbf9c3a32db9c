"""The asynchronous rollout producer (rl.max_staleness = N > 0, docs/async.md): "a sampler that runs
ahead", in its own process, so sampling overlaps the trainer's scoring and update.

Trainer side, `ProducerSampler` (a `Models.sampler`): `__call__(policy, prompts)` takes the next batch
from a bounded queue, `sync(policy)` publishes the weights after each update into a shared-memory
`WeightRing` (rloo.runtime.weights). Producer side, `_produce`: batch j is sampled with exactly the
weights of update max(oldest, j - N) (oldest: 0, or the oldest a resumed run's checkpoint had), with
the generator `batch_generator(seed, j)`, the prompts from its own copy of the prompt stream (the
trainer checks they are the prompts it expected). The process lives and dies with the trainer
(rloo.runtime.child). With a `score` (rloo.algorithms.base.Scoring, built by rloo.training.rl) the
producer also scores each batch (reward model or function, reference log-probs) and hands over a
`ScoredRollout`, so that the trainer's step is its update only (docs/async.md measures why).
"""

from __future__ import annotations

import copy
import itertools
import time
from dataclasses import dataclass, fields

import torch

from rloo.config import RLConfig
from rloo.errors import RlooError
from rloo.rollout.lagged import LaggedSampler, shadow_copy
from rloo.rollout.sampler import Rollout, rollout
from rloo.rollout.settings import sampling_settings
from rloo.runtime.child import ChildProcess, die_with_parent, put_until, wait_until
from rloo.runtime.rng import batch_generator
from rloo.runtime.weights import WeightRing


@dataclass
class ScoredRollout(Rollout):
    """A Rollout with step 2 done where it was sampled: (scores (N,), reference log-probs (N,T)),
    which `rloo.algorithms.base.score_rollout` returns instead of scoring again."""

    scored: tuple[torch.Tensor, torch.Tensor] | None = None


def scored_rollout(roll: Rollout, score) -> ScoredRollout:
    return ScoredRollout(**{f.name: getattr(roll, f.name) for f in fields(roll)}, scored=score(roll))


def thread_split(total: int) -> tuple[int, int]:
    """(producer, trainer) intra-op threads out of `total`: half each, the trainer the odd one
    (docs/async.md measures it on 2 cores)."""
    producer = max(1, total // 2)
    return producer, max(1, total - producer)


def _produce(parent_pid, stop, out, cfg: RLConfig, model, tokenizer, stream, ring: WeightRing, start, threads, score):
    """The producer process's body: sample (and score, with `score`) batch j = start, start+1, ...
    with weights max(oldest, j - N) and the generator of (seed, j)."""
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)
    oldest = ring.oldest()  # read before the trainer's first publish
    try:
        for j in itertools.count(start):
            version = max(oldest, j - cfg.max_staleness)
            t0 = time.perf_counter()
            if not wait_until(lambda v=version: ring.holds(v), stop, parent_pid):
                return
            t1 = time.perf_counter()
            ring.load_into(version, model)
            gen = batch_generator(cfg.seed, j)
            roll = rollout(model, tokenizer, stream.next(), cfg.k, **sampling_settings(cfg), generator=gen)
            t2 = time.perf_counter()
            parts = {"time/producer_idle": t1 - t0, "time/producer_sample": t2 - t1}
            if score is not None:  # logged only when the producer scores: which side did is in the metrics
                roll = scored_rollout(roll, score)
                parts |= score.part_metrics() | {"time/producer_score": time.perf_counter() - t2}
            if not put_until(out, ("batch", j, version, parts, roll), stop, parent_pid):
                return
    except Exception as e:  # reported to the trainer, which stops with it (one line)
        put_until(out, ("error", f"{type(e).__name__}: {e}"), stop, parent_pid)


class ProducerSampler:
    """The trainer's end of the producer. `version`: steps made (a resumed run starts at its step,
    its ring refilled with the checkpoint's older versions, `older`)."""

    def __init__(self, policy: torch.nn.Module, tokenizer, cfg: RLConfig, stream, start=0, score=None, older=None):
        self.k, self.version, self.next_batch = cfg.k, start, start
        self.ring = WeightRing(policy, cfg.max_staleness, shared=True, version=start)
        self.ring.refill(older or {}, policy, start)
        self.threads_before = torch.get_num_threads()
        producer, trainer = thread_split(self.threads_before)
        # the stream is copied at the trainer's position: both draw the same prompts in the same order
        args = (cfg, shadow_copy(policy), tokenizer, copy.deepcopy(stream), self.ring, start, producer, score)
        self.child = ChildProcess(_produce, args, name="rollout producer", queue_size=max(1, cfg.max_staleness))
        torch.set_num_threads(trainer)
        self.trainer_wait, self.producer_parts = 0.0, {}  # seconds waited for the last batch; its producer metrics

    @property
    def pid(self) -> int | None:
        return self.child.pid

    def __call__(self, policy: torch.nn.Module, prompts: list[str]) -> Rollout:
        t0 = time.perf_counter()
        item = self.child.get()  # ChildDied (one line) if the producer ended: the loop saves and says --resume
        self.trainer_wait = time.perf_counter() - t0
        if item[0] == "error":
            raise RlooError(f"the rollout producer failed: {item[1]}")
        _, j, version, self.producer_parts, roll = item
        if j != self.next_batch or roll.prompts[:: self.k] != list(prompts):
            raise RlooError(f"the rollout producer is out of step: batch {j}, expected {self.next_batch}")
        self.next_batch += 1
        roll.lag = self.version - version
        return roll

    def part_metrics(self) -> dict[str, float]:
        """Logged each step: who waited for whom, the producer's sampling and scoring times (docs/async.md),
        and the reward's part metrics where the producer scored."""
        return self.producer_parts | {"time/trainer_wait": self.trainer_wait}

    def sync(self, policy: torch.nn.Module) -> None:
        self.version += 1
        self.ring.publish(self.version, policy)

    def close(self) -> None:
        self.child.close()
        torch.set_num_threads(self.threads_before)


def stale_sampler(cfg: RLConfig, models, stream, start: int, score=None, older=None):
    """The sampler of a run with max_staleness > 0 from step `start`: the producer process (scoring
    its batches with `score` when given), or with a single thread (no core to give it) the same lag
    simulated in the trainer's process (LaggedSampler; the trainer scores). `older`: a resumed run's
    older weight versions from its checkpoint (WeightRing.older_versions), for an exact resume."""
    if torch.get_num_threads() < 2:
        return LaggedSampler(models.policy, models.tokenizer, cfg, version=start, older=older)
    return ProducerSampler(models.policy, models.tokenizer, cfg, stream, start, score, older)
