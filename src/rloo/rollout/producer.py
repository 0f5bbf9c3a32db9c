"""The asynchronous rollout producer (rl.max_staleness = N > 0, docs/async.md): "a sampler that runs
ahead", in its own process, so sampling overlaps the trainer's scoring and update.

Trainer side, `ProducerSampler` (a `Models.sampler`): `__call__(policy, prompts)` takes the next batch
from a bounded queue, `sync(policy)` publishes the weights after each update into a shared-memory
`WeightRing` (rloo.runtime.link.weights). Producer side, `_produce`: batch j is sampled with exactly the
weights of update max(oldest, j - N) (oldest: 0, or the oldest a resumed run's checkpoint had), with
the generator `batch_generator(seed, j)`, the prompts from its own copy of the prompt stream (the
trainer checks they are the prompts it expected), in the trainer's precision (`Job.precision`: the
RL stage's autocast does not cross a process). The process lives and dies with the trainer
(rloo.runtime.link.child). With a `score` (rloo.algorithms.base.Scoring, built by rloo.training.rl) the
producer also scores each batch (reward model or function, reference log-probs) and hands over a
`ScoredRollout`, so that the trainer's step is its update only (docs/async.md measures why).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from rloo.config import RLConfig
from rloo.errors import RlooError
from rloo.modeling.lora import AdapterDisabled
from rloo.rollout.lagged import LaggedSampler, shadow_copy
from rloo.rollout.remote import TAG_BATCH, TAG_CONTROL, ReceivedVersions, RemoteProducer
from rloo.rollout.sampler import Rollout
from rloo.rollout.settings import sampling_precision
from rloo.rollout.versioned import VersionSampler
from rloo.runtime.checkpoint.rng import batch_generator
from rloo.runtime.distributed import Dist, unwrap
from rloo.runtime.link.address import resolve
from rloo.runtime.link.child import ChildProcess, die_with_parent, put_until, wait_until
from rloo.runtime.link.gloo import Link, LinkClosed
from rloo.runtime.link.weights import WeightRing
from rloo.runtime.precision import Precision
from rloo.runtime.tracking.log import say


@dataclass
class ScoredRollout(Rollout):
    """A Rollout with step 2 done where it was sampled: (scores (N,), reference log-probs (N,T)),
    which `rloo.algorithms.base.score_rollout` returns instead of scoring again."""

    scored: tuple[torch.Tensor, torch.Tensor] | None = None


def scored_rollout(roll: Rollout, score) -> ScoredRollout:
    # getattr: a field named by the dataclass's own table (fields()): a shallow copy into the subclass
    return ScoredRollout(**{f.name: getattr(roll, f.name) for f in fields(roll)}, scored=score(roll))


def thread_split(total: int) -> tuple[int, int]:
    """(producer, trainer) intra-op threads out of `total`: half each, the trainer the odd one
    (docs/async.md measures it on 2 cores)."""
    producer = max(1, total // 2)
    return producer, max(1, total - producer)


@dataclass
class Job:
    """What the producer samples with, handed over once: the policy's copy (its weights are set
    from the ring per batch), the prompt stream at the trainer's position, the first batch, the
    scoring (None: the trainer scores), under torchrun the trainer process it serves (`dist`: it
    samples that process's share of each global batch, `Dist.shard`), and the trainer's precision
    (rloo.rollout.settings.sampling_precision; None: resolved from the config where it samples)."""

    cfg: RLConfig
    model: torch.nn.Module
    tokenizer: Any
    stream: Any
    start: int
    score: Any = None
    dist: Dist = field(default_factory=Dist)
    precision: Precision | None = None


def produce(job: Job, ring, wait, put) -> None:
    """The producer's loop: sample (and score, with `job.score`) batch j = start, start+1, ... with
    weights max(oldest, j - N) of `ring` and the generator of (seed, j). `wait(version)` blocks
    until the ring holds it, `put(item)` hands a batch over; either returns False to stop."""
    cfg = job.cfg
    if job.score is not None and job.score.ref is None:  # LoRA: pi_ref is the policy with its adapters off
        job.score.ref = AdapterDisabled(job.model)
    # The stage's autocast does not reach this process (or machine): without the trainer's precision
    # here, mu at dtype=bfloat16 would be the fp32 policy and step 2 another computation, while the
    # trainer (N = 0, the in-process lag) samples and scores under bf16 autocast.
    precision = job.precision or sampling_precision(cfg, job.model)
    oldest = ring.oldest()  # read before the trainer's first publish
    # rloo's sampler, or vLLM started here (generation=vllm), whose dtype is this precision's too: on
    # another machine its own dtype=auto could pick bf16 where the trainer runs fp32, or the reverse
    sampler = VersionSampler(cfg, job.tokenizer, precision)
    for j in range(job.start, cfg.steps):  # the run's batches, no more (N may exceed the steps left)
        version = max(oldest, j - cfg.max_staleness)
        t0 = time.perf_counter()
        if not wait(version):
            return
        t1 = time.perf_counter()
        ring.load_into(version, job.model)
        gen = batch_generator(cfg.seed, j)
        prompts, rows = job.dist.shard(job.stream.next(), cfg.k)  # as the trainer's loop draws them
        with precision.autocast():  # per batch: no cast of the weights outlives their version
            roll = sampler(job.model, version, prompts, gen, rows)
            t2 = time.perf_counter()
            parts = {"time/producer_idle": t1 - t0, "time/producer_sample": t2 - t1} | sampler.part_metrics()
            if job.score is not None:  # logged only when the producer scores: which side did is in the metrics
                roll = scored_rollout(roll, job.score)
                parts |= job.score.part_metrics() | {"time/producer_score": time.perf_counter() - t2}
        if not put(("batch", j, version, parts, roll)):
            return
    wait(cfg.steps + 1)  # a version never published: stay (the trainer still takes the batches) until told to stop


def _produce(parent_pid, stop, out, job: Job, ring: WeightRing, threads: int):
    """The local producer process's body (a ChildProcess)."""
    die_with_parent(parent_pid)
    torch.set_num_threads(threads)
    try:
        produce(
            job,
            ring,
            lambda v: wait_until(lambda: ring.holds(v), stop, parent_pid),
            lambda item: put_until(out, item, stop, parent_pid),
        )
    except Exception as e:  # reported to the trainer, which stops with it (one line)
        put_until(out, ("error", f"{type(e).__name__}: {e}"), stop, parent_pid)


def serve(address: str, threads: int | None, connect_timeout: float) -> None:
    """`rloo produce`: join the trainer at `address` (rl.producer_address), sample (and score) its
    batches until it stops (rloo.rollout.remote). `threads`: None keeps torch's default."""
    resolve(address, "address")  # a name that does not resolve: one line now, not a wait
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    say(f"connecting to the trainer at {address} (waiting up to {connect_timeout:g} s)")
    connected = False
    try:
        link = Link(address, 1, connect_timeout)
        connected = True
        job, versions, names = link.recv_object(TAG_CONTROL)
        say(f"connected: sampling from batch {job.start} with {threads} thread(s)")
        ring = ReceivedVersions(link, versions, names, job.model)
        sent: dict[int, list] = {}  # batch -> its sends

        def put(item) -> bool:
            # batches <= j - N - 1 are the trainer's: it consumed them before publishing j - N
            for b in [b for b in sent if b <= item[1] - job.cfg.max_staleness - 1]:
                link.settle(sent.pop(b))
            sent[item[1]] = link.send_object(item, TAG_BATCH)
            return True

        try:
            produce(job, ring, ring.wait, put)
        except LinkClosed:
            raise
        except Exception as e:  # the trainer stops with it (one line), as with the local producer
            link.settle(link.send_object(("error", f"{type(e).__name__}: {e}"), TAG_BATCH))
            raise
    except LinkClosed as e:
        raise RlooError(f"the trainer at {address} {'went away' if connected else 'is not there'} ({e})") from e
    say("the trainer's run ended: stopping")


class ProducerSampler:
    """The trainer's end of the producer. `version`: steps made (a resumed run starts at its step,
    its ring refilled with the checkpoint's older versions, `older`). The producer is a local
    process (the weights in shared memory, the threads split), or with rl.producer_address one on
    another machine (rloo.rollout.remote; this process keeps its threads)."""

    def __init__(
        self, policy: torch.nn.Module, tokenizer, cfg: RLConfig, stream, start=0, score=None, older=None, dist=None
    ):
        self.k, self.version, self.next_batch = cfg.k, start, start
        remote = cfg.producer_address is not None
        self.ring = WeightRing(policy, cfg.ring_lag, shared=not remote, version=start)
        self.ring.refill(older or {}, policy, start)
        self.threads_before = torch.get_num_threads()
        # the stream is copied at the trainer's position: both draw the same prompts in the same order
        job = Job(
            cfg,
            shadow_copy(policy),
            tokenizer,
            copy.deepcopy(stream),
            start,
            score,
            dist or Dist(),
            sampling_precision(cfg, policy),  # this stage's: dtype=auto decided once, by the trainer
        )
        if cfg.producer_address is not None:  # remote
            self.remote = self.child = RemoteProducer(
                cfg.producer_address, job, self.ring, policy, cfg.producer_connect_timeout_s
            )
        else:
            self.remote, (producer, trainer) = None, thread_split(self.threads_before)
            args = (job, self.ring, producer)
            self.child = ChildProcess(_produce, args, name="rollout producer", queue_size=max(1, cfg.ring_lag))
            torch.set_num_threads(trainer)
        self.trainer_wait, self.producer_parts = 0.0, {}  # seconds waited for the last batch; its producer metrics

    @property
    def pid(self) -> int | None:
        return self.child.pid

    def __call__(self, policy: torch.nn.Module, prompts: list[str], rows=None, generator=None) -> Rollout:
        """The next batch: `prompts` (and `rows`, which the producer derives itself from the `dist` it
        was given) are what the trainer expects it to hold."""
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
        if self.remote is not None:
            self.remote.before_publish(self.version)
        self.ring.publish(self.version, policy)
        if self.remote is not None:
            self.remote.published(self.version)

    def close(self) -> None:
        self.child.close()
        torch.set_num_threads(self.threads_before)


def stale_sampler(cfg: RLConfig, models, stream, start: int, score=None, older=None, dist=None):
    """The sampler of a run with max_staleness > 0 from step `start`: the producer (scoring its
    batches with `score` when given), on another machine with rl.producer_address, else a process
    here, or with a single thread (no core to give it) the same lag simulated in the trainer's
    process (LaggedSampler; the trainer scores). `older`: a resumed run's older weight versions
    from its checkpoint (WeightRing.older_versions), for an exact resume. Under torchrun (`dist`)
    each trainer process has its own sampler (the DDP replicas hold the same weights)."""
    policy = unwrap(models.policy)  # the weights, not the DDP wrapper around them
    if cfg.producer_address is None and torch.get_num_threads() < 2:
        return LaggedSampler(policy, models.tokenizer, cfg, version=start, older=older)
    return ProducerSampler(policy, models.tokenizer, cfg, stream, start, score, older, dist)
