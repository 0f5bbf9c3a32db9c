"""The output heads compute in fp32 under autocast *inside* the model (issue 34), so that a model rloo
does not take apart gives fp32 logits and scores too: one under a DDP, FSDP2 or PEFT wrapper (whose own
forward, hooks and gradient reducer must run), or one whose logits are not exactly head(hidden) (a head
with a bias, logit scaling or soft-capping after it).

`use_fp32_heads(model)` is applied by every loader (rloo.modeling.loading) and after LoRA wrapping
(rloo.modeling.lora.add_lora). It gives each `torch.nn.Linear` of the model's output heads (the LM head,
`get_output_embeddings()`; a classifier's `score`; LoRA's base layer and adapters on either) an instance
`forward`, `fp32_head_forward`: under autocast the product is `rloo.core.logprobs.fp32_linear` (autocast
off, fp32 operands), the same function `rloo.modeling.forward.head_logits` calls for a plain head;
without autocast it is nn.Linear's own forward, so fp32 runs compute the same bits. The module, its
parameters (a tie to the input embedding, FSDP2's DTensor) and hooks stay what they were: nothing is
copied, and the wrappers call it through their own forward. A deep copy (PEFT's modules_to_save) binds
the copy's forward to the copy, and a pickled model (the async producer's) keeps it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from rloo.core.logprobs import fp32_linear


def fp32_head_forward(self: torch.nn.Linear, input: Tensor) -> Tensor:  # noqa: A002 - nn.Linear.forward's name
    """A head's forward: x W^T + b (..., H) -> (..., V), in fp32 under autocast (`fp32_linear`), else
    exactly `torch.nn.Linear.forward` (the bits of an unpatched head)."""
    if torch.is_autocast_enabled(input.device.type):
        return fp32_linear(input, self.weight, self.bias)
    return torch.nn.Linear.forward(self, input)


def is_fp32_head(module: torch.nn.Module) -> bool:
    """Whether `use_fp32_heads` gave this module its forward."""
    forward = vars(module).get("forward")  # an instance forward, of any origin; ours is a partial
    return isinstance(forward, functools.partial) and forward.func is fp32_head_forward


def lm_head(model):
    """What a transformers model's `get_output_embeddings()` returns (a PeftModel forwards it to its
    base): its LM head, or None (a sequence classifier's), or None for an object without the method."""
    # getattr: third-party: wrappers and value models may lack the method
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def output_heads(model) -> list[torch.nn.Module]:
    """The modules whose outputs are a model's logits or scores: the LM head (`get_output_embeddings()`)
    and a sequence classifier's `score` (the reward and value models'), where present."""
    # getattr: third-party: only a sequence classifier (the reward and value models) has `score`
    heads = [lm_head(model), getattr(model, "score", None)]
    return [h for h in heads if isinstance(h, torch.nn.Module)]


def use_fp32_heads(model):
    """Give every `torch.nn.Linear` (that exact type) inside the model's output heads the forward
    `fp32_head_forward`; modules that already have an instance forward of another origin are left
    alone. Idempotent; returns the model."""
    for head in output_heads(model):
        for m in head.modules():
            if type(m) is torch.nn.Linear and "forward" not in vars(m):
                # a partial, not a bound method: it pickles (the async producer receives the model
                # in another process; a bound method pickles as a lookup of m.fp32_head_forward,
                # which the child's module does not have) and deep-copies onto the copy
                m.forward = functools.partial(fp32_head_forward, m)
    return model
