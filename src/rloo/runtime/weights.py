"""The trainer -> sampler weight hand-off of asynchronous RL (rl.max_staleness = N, docs/async.md).

A ring of N+1 copies of the policy's state (parameters and buffers): version v (the weights after v
updates) lives in slot v % (N+1). The batch of step t is sampled with version max(0, t - N), exactly:
the slot of version t - N is overwritten only by version t + 1, which the trainer publishes after
consuming batch t, so the sampler has always read it before (no lock needed). With `shared=True`
the copies live in shared memory, so a producer process started with torch.multiprocessing sees
every publish without a copy through a pipe.
"""

from __future__ import annotations

import torch


class StaleVersion(RuntimeError):
    """A requested version is not (or no longer) in the ring: the hand-off protocol was broken."""


class WeightRing:
    def __init__(self, model: torch.nn.Module, staleness: int, shared: bool = False, version: int = 0):
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        state = model.state_dict()
        self.size = staleness + 1
        self.slots = [{n: t.detach().clone() for n, t in state.items()} for _ in range(self.size)]
        self.versions = torch.full((self.size,), -1, dtype=torch.long)  # the version each slot holds
        if shared:
            for slot in self.slots:
                for t in slot.values():
                    t.share_memory_()
            self.versions.share_memory_()
        self.publish(version, model)  # `version` > 0: a resumed run, whose older weights are gone

    @torch.no_grad()
    def publish(self, version: int, model: torch.nn.Module) -> None:
        """Copy `model`'s state in as `version` (the weights after `version` updates)."""
        slot = version % self.size
        self.versions[slot] = -1  # a reader that looks mid-copy sees no version, not a torn one
        for name, t in model.state_dict().items():
            self.slots[slot][name].copy_(t)
        self.versions[slot] = version

    @torch.no_grad()
    def load_into(self, version: int, model: torch.nn.Module) -> None:
        """Copy `version`'s state into `model` (same architecture) in place."""
        slot = version % self.size
        if int(self.versions[slot]) != version:
            raise StaleVersion(f"weights version {version} is not in the ring (slot holds {int(self.versions[slot])})")
        for name, t in model.state_dict().items():
            t.copy_(self.slots[slot][name])
        if int(self.versions[slot]) != version:  # overwritten while we copied
            raise StaleVersion(f"weights version {version} was overwritten while it was read")

    def holds(self, version: int) -> bool:
        return int(self.versions[version % self.size]) == version
