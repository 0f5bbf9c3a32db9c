"""Device-placement checks that run without a GPU.

`DeviceCheck` is a TorchFunctionMode that sees every torch call with a `generator=` argument and
asserts that the generator lives on the device of the tensor it draws into (CUDA refuses a CPU
generator for a CUDA tensor: "Expected a 'cuda' device type for generator"). Under
`FakeTensorMode` (`fake_cuda()`), tensors can claim device `cuda` on a CPU-only torch for plain
ops (not for Python indexing), but fake kernels take no generator: `strip=True` drops it after
the check.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode


def _drawn_on(args, kwargs) -> torch.device:
    """The device a generator-taking call draws on: its tensor argument's (exponential_, uniform_,
    multinomial, bernoulli), else its `device=` (rand, randn, randint, randperm), else the CPU."""
    if args and isinstance(args[0], torch.Tensor):
        return args[0].device
    return torch.device(kwargs.get("device") or "cpu")


class DeviceCheck(TorchFunctionMode):
    def __init__(self, strip: bool = False):
        super().__init__()
        self.strip = strip
        self.draws: list[tuple[str, str, str]] = []  # (op, generator device, tensor device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator):
            where = _drawn_on(args, kwargs)
            name = getattr(func, "__name__", str(func))
            self.draws.append((name, gen.device.type, where.type))
            assert gen.device.type == where.type, (
                f"{name} draws a {where.type} tensor with a {gen.device.type} generator"
            )
            if self.strip:
                kwargs.pop("generator")
        return func(*args, **kwargs)


def fake_cuda() -> FakeTensorMode:
    """A mode in which `torch.*(..., device="cuda")` makes fake CUDA tensors on a CPU-only torch."""
    return FakeTensorMode(allow_non_fake_inputs=True)
