"""The weights after every update: an update that leaves a non-finite or exploding parameter, or a
non-finite optimizer moment, is undone from a copy taken before the step.

The loss/gradient guard (rloo.algorithms.rloo) cannot see this: `lr=inf` or a huge lr turns a finite
gradient into non-finite or enormous weights. "Exploding" is a stated bound relative to the
start: the L2 norm of all trainable parameters above `growth x max(norm at the start, 1)` (fine-
tuning moves it by a few percent; default growth 10).

Cost: the copy is one buffer per trainable tensor and per optimizer-state tensor, i.e. 3x the
trainable parameters' bytes for AdamW (weights, exp_avg, exp_avg_sq: 12 bytes per fp32 parameter,
docs/recipes.md's memory table), allocated once and refilled every step (one memcpy of that size,
small next to a forward+backward). The norms make no copies: one fp32-accumulated norm per tensor
(`vector_norm(..., dtype=float32)`), never an fp32 copy of a tensor. Under LoRA only the adapters are
trainable, so it is tiny.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of an FSDP2 DTensor, else the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def total_norm(tensors: list[torch.Tensor]) -> float:
    """L2 norm of all `tensors` together (inf/nan when any entry is, or when it overflows)."""
    if not tensors:
        return 0.0
    # per tensor, accumulated in fp32 without an fp32 copy of the tensor (a bf16 model's `.float()`
    # copies of all weights and moments at once were ~80 GB of temporaries at 7B)
    norms = [torch.linalg.vector_norm(_local(t).detach(), dtype=torch.float32) for t in tensors]
    return float(torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms])))  # one sync


class ParamGuard:
    """`opt`: the optimizer of `params`, or a list of optimizers that together hold them (PPO's
    policy and value model: both are checked and undone together)."""

    def __init__(self, params, opt, growth: float, norm0: float | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.opts: list[torch.optim.Optimizer] = list(opt) if isinstance(opt, (list, tuple)) else [opt]
        self.norm0 = total_norm(self.params) if norm0 is None else norm0
        self.limit = growth * max(self.norm0, 1.0)
        self._weights: list[torch.Tensor] | None = None
        self._state: dict = {}
        self.reason: str | None = None

    def state_dict(self) -> dict:
        return {"norm0": self.norm0}

    def before_step(self) -> None:
        """Copy the weights and optimizer state into buffers (allocated on first use)."""
        with torch.no_grad():
            if self._weights is None:
                self._weights = [torch.empty_like(_local(p)) for p in self.params]
            torch._foreach_copy_(self._weights, [_local(p).detach() for p in self.params])
            for i, p in enumerate(self.params):
                st = self._state_of(p)
                if not st:
                    self._state[i] = None
                    continue
                saved = self._state.get(i) or {}
                for k, v in st.items():
                    if torch.is_tensor(v):
                        buf = saved.get(k)
                        if buf is None or buf.shape != _local(v).shape:
                            buf = torch.empty_like(_local(v))
                        buf.copy_(_local(v))
                        saved[k] = buf
                    else:
                        saved[k] = v
                self._state[i] = saved

    def problem(self) -> str | None:
        """Why the weights or optimizer state after the update are unacceptable, or None."""
        norm = total_norm(self.params)
        if norm != norm or norm == float("inf"):
            return "non-finite parameters after the update"
        if norm > self.limit:
            return (
                f"parameter norm {norm:.4g} after the update exceeds {self.limit:.4g} "
                f"(max_param_growth x the starting norm {self.norm0:.4g})"
            )
        moments = [v for o in self.opts for st in o.state.values() for v in st.values() if torch.is_tensor(v)]
        m = total_norm(moments)
        if m != m or m == float("inf"):
            return "non-finite optimizer state after the update"
        return None

    def undo(self) -> None:
        """Put back the weights and optimizer state copied by `before_step`."""
        with torch.no_grad():
            torch._foreach_copy_([_local(p) for p in self.params], self._weights)
            for i, p in enumerate(self.params):
                saved = self._state.get(i)
                if saved is None:
                    for o in self.opts:
                        o.state.pop(p, None)
                    continue
                st = self._state_of(p)
                for k, v in saved.items():
                    if torch.is_tensor(v):
                        _local(st[k]).copy_(v)
                    else:
                        st[k] = v

    def _state_of(self, p) -> dict | None:
        """The optimizer state of `p` in whichever optimizer holds it (None before its first step)."""
        return next((o.state[p] for o in self.opts if p in o.state), None)
