"""An optimizer stand-in the gradient tests share: it records the gradients and changes nothing."""

from __future__ import annotations


class GradRecorder:
    """An optimizer that records the gradients at its first step() and leaves the parameters unchanged
    (a step that runs several updates, as PPO's epochs, is compared on its first one)."""

    def __init__(self, model):
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.grads = None

    def zero_grad(self, set_to_none=True):
        for _, p in self.params:
            p.grad = None

    def step(self):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in self.params if p.grad is not None}
