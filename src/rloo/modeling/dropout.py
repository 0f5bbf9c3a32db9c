"""Dropout off in models whose method assumes one deterministic function.

RL samples with the policy in eval mode and trains it in train mode: with dropout on, the update
differentiates another (random) function than the one that produced the samples (PPO's ratio on
its first minibatch is not 1, processes of a DDP run draw different masks). DPO and the reward
model's Bradley-Terry loss compare two forward passes that must see the same function too.
`disable_dropout` switches every dropout of a model off in place, as TRL's `disable_dropout` does;
the config keys `rl.disable_dropout` / `reward.disable_dropout` (default true) keep it on when false.
The model's config (what save_pretrained writes) is left unchanged.
"""

from __future__ import annotations

import torch

from rloo.runtime.inputs.hf import hf_config

_FLAG = "_rloo_dropout_disabled"


def _rate_attrs(module: torch.nn.Module) -> list[str]:
    """Float attributes that are dropout rates read at call time (e.g. Llama's attention_dropout)."""
    return [
        k
        for k, v in vars(module).items()
        if "dropout" in k.lower() and isinstance(v, float) and not isinstance(v, bool)
    ]


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Every nn.Dropout's p and every float `*dropout*` rate attribute set to 0, in place. -> model."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for k in _rate_attrs(m):
            setattr(m, k, 0.0)
    object.__setattr__(model, _FLAG, True)
    return model


def maybe_disable_dropout(model, disable: bool):
    """disable_dropout when asked; a non-module (LoRA's adapter-disabled reference, which calls the
    policy) is left alone: it follows the policy's modules."""
    return disable_dropout(model) if disable and isinstance(model, torch.nn.Module) else model


def has_dropout(model: torch.nn.Module) -> bool:
    """True when a forward pass in train mode may differ from eval mode: a dropout module or rate
    above 0, or (unless `disable_dropout` ran) a dropout key above 0 in the model's config."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        # getattr: `k` names a rate attribute _rate_attrs found on the module
        if any(getattr(m, k) > 0 for k in _rate_attrs(m)):
            return True
    # getattr: our flag on a third-party model, absent until disable_dropout ran
    if getattr(model, _FLAG, False):
        return False
    config = hf_config(model)
    items = config.to_dict().items() if config is not None else ()
    return any(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for key, v in items
        if "dropout" in key or "pdrop" in key
    )
