"""A model handed to the Python API as an object (rloo.runtime.inputs.objects): checked as a
loaded one is, for the part it plays. The loaders (rloo.modeling.loading) call this in place of
`from_pretrained`, so a handed model then gets the same attention, heads, device and dtype."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from rloo.errors import RlooError
from rloo.modeling.fp32_head import lm_head
from rloo.runtime.inputs.hf import hf_config
from rloo.runtime.inputs.objects import held


def handed_model(name: str, what: str):
    """(the model held under `name`, the name or path of its tokenizer). `what`: "causal LM" (a
    policy: it has an LM head) or a one-output scorer ("reward model", "value model": a sequence
    classifier with num_labels=1). The tokenizer is the one handed in with it, else the one its
    config names (`name_or_path`, as TRL's trainers default to); refused without either."""
    h = held(name)
    model = h.obj
    kind = type(model).__name__
    config = hf_config(model)
    if not isinstance(model, torch.nn.Module) or not isinstance(config, PretrainedConfig):
        raise RlooError(f"model= must be a transformers PreTrainedModel or a peft PeftModel; got a {kind}")
    has_lm_head = lm_head(model) is not None
    if what == "causal LM" and not has_lm_head:
        raise RlooError(f"model= must be a causal LM (a ...ForCausalLM with an LM head); the {kind} handed in has none")
    if what != "causal LM" and (has_lm_head or config.num_labels != 1):
        raise RlooError(
            f"model= must be a {what}: a sequence classifier with one output "
            f"(AutoModelForSequenceClassification.from_pretrained(..., num_labels=1)); got a {kind}"
        )
    tokenizer = h.tokenizer or config.name_or_path or None
    if tokenizer is None:
        raise RlooError(f"model= ({kind}) names no tokenizer (its config has no name_or_path): pass tokenizer= too")
    return model, tokenizer
