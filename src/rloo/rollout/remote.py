"""The rollout producer on another machine (rl.producer_address = HOST:PORT, docs/async.md "Across
machines"): the same producer as rloo.rollout.producer's process, over a torch.distributed link
(rloo.runtime.link.gloo) instead of shared memory and a queue.

The trainer (`RemoteProducer`, rank 0) hosts HOST:PORT and waits for `rloo produce
address=HOST:PORT` (rloo.rollout.producer.serve, rank 1). It sends everything the producer needs once (`Job`: the
config, the policy, tokenizer, prompt stream at the trainer's position, scoring; and the weight
versions a resumed run's next batches are sampled with), so the producer's machine needs rloo
and nothing of the run; then each published version's trainable tensors (control [WEIGHTS, v],
then the tensors in `trainable_names` order), and STOP when the run ends. The producer sends
each batch as the local producer queues it. Batch j is sampled with exactly version
max(oldest, j - N): the producer receives the versions in order, one per batch, so at most N + 1
batches are ever in flight (no other bound needed).
"""

from __future__ import annotations

import torch

from rloo.errors import option
from rloo.runtime.link.child import ChildDied
from rloo.runtime.link.gloo import Link, LinkClosed, LinkTimeout
from rloo.runtime.tracking.log import say

TAG_CONTROL, TAG_WEIGHTS, TAG_BATCH = 0, 1, 2
WEIGHTS, STOP = 0, 1


def trainable_names(model: torch.nn.Module) -> list[str]:
    """The state-dict entries a version can differ in: trainable parameters, a tied one once."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


class RemoteProducer:
    """The trainer's end; `ProducerSampler` uses it as it uses the local ChildProcess (get, close)
    plus `before_publish(version)` / `published(version)` around each WeightRing publish."""

    def __init__(self, address: str, job, ring, policy: torch.nn.Module, connect_timeout: float):
        say(f"waiting for the rollout producer: run `rloo produce address={address}` on its machine")
        self.address, self.ring, self.lag = address, ring, ring.size - 1
        try:
            self.link = Link(address, 0, connect_timeout)
        except LinkTimeout:
            raise ChildDied(
                f"no rollout producer joined at {address} within {connect_timeout:g} s (producer_connect_timeout_s); "
                f"start `rloo produce address={address}` on its machine, then rerun with {option('resume')}"
            ) from None
        except LinkClosed as e:
            raise ChildDied(f"no rollout producer joined at {address} (producer_address): {e}") from e
        say(f"rollout producer connected at {address}")
        self.names = trainable_names(policy)
        versions = ring.older_versions(job.start, policy) | {job.start: _entries(ring, job.start, self.names)}
        self.sent = {-1: self._guard(lambda: self.link.send_object((job, versions, self.names), TAG_CONTROL))}

    pid = None  # not a process of ours

    def get(self):
        return self._guard(lambda: self.link.recv_object(TAG_BATCH))

    def before_publish(self, version: int) -> None:
        """Settle the sends the producer has received for sure: versions <= version - N - 1 (it
        sampled batch version - 1, which this trainer consumed, with version - 1 - N) and the job.
        Then the slot `version` overwrites is free."""
        for v in [v for v in self.sent if v <= version - self.lag - 1]:
            self._guard(lambda v=v: self.link.settle(self.sent.pop(v)))

    def published(self, version: int) -> None:
        tensors = list(_entries(self.ring, version, self.names).values())
        control = torch.tensor([WEIGHTS, version])
        self.sent[version] = self._guard(
            lambda: self.link.send_tensors([control], TAG_CONTROL) + self.link.send_tensors(tensors, TAG_WEIGHTS)
        )

    def close(self) -> None:
        """Tell the producer to stop and wait until it has read everything (it finishes its batch)."""
        try:
            stop = self.link.send_tensors([torch.tensor([STOP, -1])], TAG_CONTROL)
            for sends in [*self.sent.values(), stop]:
                self.link.settle(sends)
        except LinkClosed:  # gone already: nothing to stop
            pass
        self.sent = {}

    def _guard(self, fn):
        try:
            return fn()
        except LinkClosed as e:
            raise ChildDied(f"the rollout producer at {self.address} went away ({e})") from e


def _entries(ring, version: int, names: list[str]) -> dict[str, torch.Tensor]:
    slot = ring.slots[version % ring.size]
    return {n: slot[n] for n in names}


class ReceivedVersions:
    """The producer's weight versions (the WeightRing interface rloo.rollout.producer.produce
    reads): the job's, then each the trainer publishes, received in order when a batch needs it."""

    def __init__(self, link: Link, versions: dict[int, dict[str, torch.Tensor]], names: list[str], model):
        self.link, self.versions, self.names = link, dict(versions), names
        self.templates = model.state_dict()

    def oldest(self) -> int:
        return min(self.versions)

    def wait(self, version: int) -> bool:
        """Receive versions until `version` is here (True), or the trainer said STOP (False)."""
        while version not in self.versions:
            control = torch.zeros(2, dtype=torch.long)
            self.link.recv_tensors([control], TAG_CONTROL)
            kind, v = control.tolist()
            if kind == STOP:
                return False
            tensors = [torch.empty_like(self.templates[n]) for n in self.names]
            self.link.recv_tensors(tensors, TAG_WEIGHTS)
            self.versions[v] = dict(zip(self.names, tensors, strict=True))
        self.versions = {v: t for v, t in self.versions.items() if v >= version}  # never needed again
        return True

    @torch.no_grad()
    def load_into(self, version: int, model: torch.nn.Module) -> None:
        state = model.state_dict()
        for name, t in self.versions[version].items():
            state[name].copy_(t)
