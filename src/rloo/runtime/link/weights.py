"""The trainer -> sampler weight hand-off of asynchronous RL (rl.max_staleness = N, docs/async.md).

A ring of N+1 copies of the policy's state (parameters and buffers): version v (the weights after v
updates) lives in slot v % (N+1). The batch of step t is sampled with version max(0, t - N), exactly:
the slot of version t - N is overwritten only by version t + 1, which the trainer publishes after
consuming batch t, so the sampler has always read it before (no lock needed). With `shared=True`
the copies live in shared memory, so a producer process started with torch.multiprocessing sees
every publish without a copy through a pipe. The samplers size the ring by `RLSettings.ring_lag`,
min(N, steps): a run of fewer steps than N never needs N + 1 versions.

Exact resume: a checkpoint at step t holds the versions its next N batches are sampled with besides
the policy itself (`older_versions`: max(0, t - N) .. t - 1, only the entries a version can differ
in), and a resumed run puts them back (`refill`), so batch t + j is sampled with the same weights as
in a run that never stopped (docs/async.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def _settle(tensors) -> None:
    """Wait until copies into or out of `tensors` are done. On CUDA `copy_` only queues the copy on
    this process's stream, while the version numbers are plain CPU memory that another process reads
    at once: without this, a producer could take a slot as version v before v's bytes have landed (or
    the reader's own copy could still be in flight when it re-checks the version). No-op on CPU."""
    for device in {t.device for t in tensors if t.device.type == "cuda"}:
        torch.cuda.synchronize(device)


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
        _settle(self.slots[slot].values())
        self.versions[slot] = version

    @torch.no_grad()
    def load_into(self, version: int, model: torch.nn.Module) -> None:
        """Copy `version`'s state into `model` (same architecture) in place."""
        slot = version % self.size
        if int(self.versions[slot]) != version:
            raise StaleVersion(f"weights version {version} is not in the ring (slot holds {int(self.versions[slot])})")
        for name, t in model.state_dict().items():
            t.copy_(self.slots[slot][name])
        _settle(self.slots[slot].values())
        if int(self.versions[slot]) != version:  # overwritten while we copied
            raise StaleVersion(f"weights version {version} was overwritten while it was read")

    def holds(self, version: int) -> bool:
        return int(self.versions[version % self.size]) == version

    def oldest(self) -> int:
        """The oldest version the ring holds (a fresh or resumed ring: the ones it was given)."""
        return min(int(v) for v in self.versions if v >= 0)

    def older_versions(self, step: int, model: torch.nn.Module) -> dict[int, dict[str, torch.Tensor]]:
        """What a checkpoint at step `step` needs besides `model` (version `step`): versions
        max(0, step - N) .. step - 1 that the ring holds, each without the frozen parameters (the
        same in every version: under LoRA, all but the adapters) and with a tied parameter once
        (`tied_names`). References to the ring's tensors: write them before the next publish."""
        frozen = frozen_names(model) | set(tied_names(model))
        return {
            v: {n: t for n, t in self.slots[v % self.size].items() if n not in frozen}
            for v in range(max(0, step - self.size + 1), step)
            if self.holds(v)
        }

    @torch.no_grad()
    def refill(self, saved: Mapping[int, Mapping[str, torch.Tensor]], model: torch.nn.Module, step: int) -> None:
        """Put back a checkpoint's `older_versions` (the ring holds `model` as version `step`): each
        version's frozen entries are `model`'s. Versions outside max(0, step - N) .. step - 1 (a
        checkpoint of a run with another N) are left out."""
        state, tied = model.state_dict(), tied_names(model)
        for v, tensors in sorted(saved.items()):
            if max(0, step - self.size + 1) <= v < step:
                slot = v % self.size
                self.versions[slot] = -1
                for name, t in self.slots[slot].items():
                    t.copy_(tensors.get(tied.get(name, name), state[name]))
                _settle(self.slots[slot].values())
                self.versions[slot] = v


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """{name: the name it is tied to} for every second name of a shared parameter (a tied LM head)."""
    first: dict[int, str] = {}
    tied = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        tied.update({n: first[id(p)]} if id(p) in first else {})
        first.setdefault(id(p), n)
    return tied


def frozen_names(model: torch.nn.Module) -> set[str]:
    """State-dict names of parameters that do not train (tied names included): equal in every version."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
