"""LoRA through peft: train low-rank adapters; the reference policy is the same network with
the adapters switched off, so no second copy of the weights is held in memory."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from safetensors.torch import load_file

from rloo.config import LoraSettings
from rloo.errors import RlooError
from rloo.modeling.fp32_head import use_fp32_heads


def _peft():
    try:
        import peft
    except ImportError as e:
        raise RlooError("lora needs the peft package: pip install 'peft>=0.19.1'") from e
    return peft


def add_lora(model, settings: LoraSettings, adapter_path: str | Path | None = None, score_head: bool = False):
    """Wrap `model` with fresh adapters (B = 0, so it starts equal to the base model), or with the
    adapters saved at `adapter_path` (resume). Only adapter weights require gradients, and with
    `score_head` (a reward model: a fresh one-output head on a sequence classifier) the head,
    trained in full and saved with the adapters (PEFT's modules_to_save). The output head keeps its
    fp32 product under autocast (rloo.modeling.fp32_head), adapters on it included (a
    `target_modules` that names the LM head)."""
    peft = _peft()
    if adapter_path is not None:
        loaded = peft.PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True)
        return use_fp32_heads(_absolute_base(loaded))
    cfg = peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,  # pyright: ignore[reportArgumentType] - peft annotates int; it computes alpha / r, a float works
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        task_type="SEQ_CLS" if score_head else "CAUSAL_LM",
        modules_to_save=["score"] if score_head else None,
    )
    try:
        wrapped = peft.get_peft_model(model, cfg)
    except ValueError:  # PEFT's NoMatchingPeftModuleError and its other refusals of the targets
        raise RlooError(
            f"lora.target_modules={settings.target_modules!r} names no module of this model that LoRA can "
            f"adapt; the names it can target: {', '.join(targetable_names(model))} (or 'all-linear')"
        ) from None
    return use_fp32_heads(_absolute_base(wrapped))


def targetable_names(model: torch.nn.Module) -> list[str]:
    """The last parts of the names of `model`'s modules LoRA can adapt (linear, embedding and
    convolution layers: q_proj, lm_head, ...), the names `lora.target_modules` lists."""
    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if n and isinstance(m, kinds)}
    return sorted(names)


def is_adapter_folder(path: str | Path) -> bool:
    """A folder written with lora.save=adapter: adapter weights naming their base model."""
    return (Path(path) / "adapter_config.json").is_file()


def load_merged(cls, path: str | Path, **kw):
    """The model saved as adapters at `path`, as a plain model: its base (adapter_config.json's
    base_model_name_or_path, loaded with cls.from_pretrained(**kw)) with the adapters (and a reward
    model's saved head) merged in. So every stage loads another stage's adapter output as it loads a
    full model: an SFT result as RL's starting policy and reference, a reward model for scoring."""
    peft = _peft()
    base_path = peft.PeftConfig.from_pretrained(str(path)).base_model_name_or_path
    if not base_path:
        raise RlooError(f"the adapters at {path} name no base model (adapter_config.json); save them merged")
    base = cls.from_pretrained(base_path, **kw)
    return peft.PeftModel.from_pretrained(base, str(path)).merge_and_unload()


def trained_network(model):
    """The network a forward pass calls: a LoRA model's base with the adapters in place (rloo's
    passes reach the backbone through `base_model_prefix`, which a PEFT wrapper does not keep)."""
    return model.get_base_model() if is_lora(model) else model


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
        # getattr: delegation (__getattr__) to the shared network
        return getattr(self.model, name)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def for_saving(model, settings: LoraSettings | None):
    """What the final save writes: the adapters alone, or the base weights with the adapters merged
    in (a plain model that loads without peft). Merging is done in place: call it last."""
    if settings is None or not is_lora(model) or settings.save == "adapter":
        return model
    return model.merge_and_unload()


def load_saved_weights(model, folder: str | Path) -> None:
    """Put the weights `model.save_pretrained(folder)` wrote (a checkpoint's model/) back into `model`,
    built as the stage builds it, in place: a resumed stage keeps its own objects (the optimizer holds
    their parameters). A LoRA model takes its adapters (and a reward model's score head); a plain one
    every tensor, those tied to another one (an LM head tied to the embeddings) excepted."""
    files = sorted(Path(folder).glob("*.safetensors"))
    saved: dict[str, torch.Tensor] = {}
    for f in files:
        saved |= load_file(str(f))
    if is_lora(model):
        result = _peft().set_peft_model_state_dict(model, saved)
        # getattr: third-party: peft versions return a load result or None
        unexpected = list(getattr(result, "unexpected_keys", []))
        if unexpected or not saved:
            raise RlooError(f"cannot resume from {folder}: its adapters are not those of this model")
        return
    missing, unexpected = model.load_state_dict(saved, strict=False)
    present = {t.data_ptr() for n, t in model.state_dict().items() if n not in missing}
    untied = [n for n in missing if model.state_dict()[n].data_ptr() not in present]
    if unexpected or untied:
        what = f"{len(untied)} tensors missing" if untied else f"{len(unexpected)} tensors not in this model"
        raise RlooError(f"cannot resume from {folder}: its weights are not those of this model ({what})")
