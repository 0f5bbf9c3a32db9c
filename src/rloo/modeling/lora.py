"""LoRA through peft: train low-rank adapters; the reference policy is the same network with
the adapters switched off, so no second copy of the weights is held in memory."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from rloo.config import LoraSettings
from rloo.errors import RlooError
from rloo.modeling.fp32_head import use_fp32_heads


def _peft():
    try:
        import peft
    except ImportError as e:
        raise RlooError("lora needs the peft package: pip install 'peft>=0.19.1'") from e
    return peft


def add_lora(model, settings: LoraSettings, adapter_path: str | Path | None = None):
    """Wrap `model` with fresh adapters (B = 0, so it starts equal to the base model), or with the
    adapters saved at `adapter_path` (resume). Only adapter weights require gradients. The output head
    keeps its fp32 product under autocast (rloo.modeling.fp32_head), adapters on it included (a
    `target_modules` that names the LM head)."""
    peft = _peft()
    if adapter_path is not None:
        loaded = peft.PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True)
        return use_fp32_heads(_absolute_base(loaded))
    cfg = peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        task_type="CAUSAL_LM",
    )
    return use_fp32_heads(_absolute_base(peft.get_peft_model(model, cfg)))


def _absolute_base(peft_model):
    """Saved adapters name their base model (adapter_config.json); a local base is named by its
    absolute path, so that the adapters load from any folder, not only the one training ran in."""
    for cfg in peft_model.peft_config.values():
        base = cfg.base_model_name_or_path
        if base and Path(base).exists():
            cfg.base_model_name_or_path = str(Path(base).resolve())
    return peft_model


class AdapterDisabled:
    """The frozen reference pi_ref: calls the LoRA model with its adapters disabled, without
    gradients. Drop-in for a model in `completion_logprobs` (it is only ever called)."""

    def __init__(self, peft_model):
        self.model = peft_model

    @torch.no_grad()
    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    @property
    def forward(self):
        """Calls with adapters off; carries the base model's signature (callers inspect it to name
        the KV-cache argument)."""

        def fn(*args, **kwargs):
            return self(*args, **kwargs)

        fn.__signature__ = inspect.signature(self.model.get_base_model().forward)
        return fn

    def __getattr__(self, name):  # config, parameters, modules, ...: those of the shared network
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def for_saving(model, settings: LoraSettings | None):
    """What the final save writes: the adapters alone, or the base weights with the adapters merged
    in (a plain model that loads without peft). Merging is done in place: call it last."""
    if settings is None or not is_lora(model) or settings.save == "adapter":
        return model
    return model.merge_and_unload()
