"""Linear layers on a few rows, as a decode step multiplies them: the product taken the other way round.

A decode step multiplies N = B*k rows (a few dozen) by every weight matrix W (out, in). `F.linear`
asks the BLAS for x W^T, a short, wide product; (W x^T)^T is the same numbers, and the BLAS then
sees a tall, thin one, which on the AVX2-only machine kind with two threads runs faster: M's
rollout (`rloo bench`'s 23M-parameter Llama, 64 tokens) 0.74x its time at 8 rows, 0.81x at 16,
0.87x at 32, 0.92x at 64; no faster with one thread (1.02x) (docs/bench.md, "What bounds M's decode
loop"; `python benchmarks/decode_bound.py`). Unmeasured on other CPUs, so used only where measured
(`few_rows_pays`). Each output is the same dot product; the BLAS may sum it in another order, so the
logits can differ from `F.linear`'s in the last bits (tests/equivalence/test_few_rows.py).
"""

from __future__ import annotations

import contextlib
import platform

import torch
import torch.nn.functional as F

from rloo.modeling.fp32_head import is_fp32_head
from rloo.runtime.cpukind import torch_cpu_check

# the row counts measured in place (8-64); the prefill's hundreds of rows gained ~3%, within noise
MAX_ROWS = 64


def few_rows_pays(device: torch.device | str, threads: int | None = None) -> bool:
    """Where the swapped product was measured faster: a CPU of the AVX2-only kind (x86 without AVX-512)
    with at least two threads (`threads`: torch's current number unless given). Elsewhere `F.linear`
    (its rate there is unmeasured)."""
    if torch.device(device).type != "cpu" or (threads or torch.get_num_threads()) < 2:
        return False
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return x86 and torch_cpu_check("_is_avx512_supported") is False


def takes_swapped(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `few_rows_linear` swaps the product: an fp32 CPU input of at most MAX_ROWS rows, fp32
    weights, no gradient, no autocast (whose bf16 matmuls were not measured)."""
    return (
        x.numel() <= MAX_ROWS * x.shape[-1]
        and not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


def swapped_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b computed as (W x^T)^T + b. x (..., in), weight (out, in), bias (out,) -> (..., out), contiguous."""
    rows = x.numel() // x.shape[-1]
    out = (weight @ x.reshape(rows, x.shape[-1]).t()).t().contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias), swapped where `takes_swapped`."""
    return swapped_linear(x, weight, bias) if takes_swapped(x, weight) else F.linear(x, weight, bias)


@contextlib.contextmanager
def few_rows_linears(model: torch.nn.Module, enabled: bool = True):
    """Within the block every `torch.nn.Linear` of `model` (exactly that type: LoRA's base layers and
    adapters too, not subclasses with a forward of their own) computes as `few_rows_linear` does:
    swapped where `takes_swapped`, else through its own forward (nn.Linear's, F.linear; or an output
    head's `rloo.modeling.fp32_head.fp32_head_forward`, which is nn.Linear's without autocast, the only
    case a swap is taken in). Restored on exit, also on an error."""
    patched = [m for m in model.modules() if type(m) is torch.nn.Linear and _plain_forward(m)] if enabled else []
    before = [vars(m).get("forward") for m in patched]
    for m in patched:
        own = m.forward
        # the parameter named as nn.Linear.forward's (callers may pass input=)
        m.forward = lambda input, m=m, own=own: (  # noqa: A002
            swapped_linear(input, m.weight, m.bias) if takes_swapped(input, m.weight) else own(input)
        )
    try:
        yield len(patched)
    finally:
        for m, forward in zip(patched, before, strict=True):
            if forward is None:
                del m.forward
            else:
                m.forward = forward


def _plain_forward(m: torch.nn.Module) -> bool:
    """nn.Linear's forward, or the fp32 head's (the same product without autocast)."""
    return "forward" not in vars(m) or is_fp32_head(m)
