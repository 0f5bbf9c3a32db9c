"""The base of every config section: unknown keys are errors, assignments are validated, and an
invalid value raises `ConfigError` (an `RlooError`) with one line per problem, never a raw pydantic
ValidationError, from the CLI and the Python API alike. Also the tracker names of `report_to`."""

from __future__ import annotations

import difflib
import re
from typing import Annotated, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rloo.config.address import check_address, split_address  # noqa: F401 - re-exported
from rloo.config.confcheck import reject_coercions
from rloo.config.trl_names import trl_hint
from rloo.errors import ConfigError

# Bounds beyond which a setting is a typo, not an experiment (an AdamW step moves each weight by
# about lr, so lr > 1 no longer fine-tunes; `lr=1e308` or `beta=inf` used to start a run that
# saved a non-finite model). Every float must also be finite (`allow_inf_nan=False`: `.inf`, nan).
MAX_LR = 1.0
MAX_BETA = 1e3
MAX_GRAD_NORM = 1e6
# AdamW's decoupled decay multiplies every weight by (1 - lr x weight_decay) each step: a product
# of 1 or more zeroes or flips the weights (weight_decay=1e30 saved an all-NaN SFT model).
MAX_WEIGHT_DECAY = 10.0
# A score is a reward; 1e6 is far beyond any reward scale, and 1e300 overflowed float32 to inf.
MAX_SCORE = 1e6
# Sampling divides the logits by the temperature: at 1e-30 they overflow, so sampling is greedy
# and every log-prob is 0 or -inf, which trains with zero gradient. 0.01 is already near-greedy.
MIN_TEMPERATURE = 0.01
# Samples per prompt (k, eval.pass_samples): the leave-one-out baseline's and pass@8's variance
# stop shrinking usefully long before this; k=100000 started a run that grew past memory.
MAX_SAMPLES = 4096
# Updates a batch's sampling weights may lag (rl.max_staleness): the importance weights of a policy
# this many updates old are long past use, and the weight ring keeps up to N + 1 copies of the
# policy (max_staleness=1000000000 was accepted and allocated without end).
MAX_STALENESS = 1024
# Seconds either end of the producer link waits for the other (a day: beyond it, a forgotten run).
MAX_CONNECT_S = 86400.0
# Optimizer steps of a run (rl.steps): a million is weeks of the smallest run; steps=1000000000 was
# accepted and then built steps x batch_size prompts before any output (rloo.training.evalset).
MAX_STEPS = 1_000_000
# A seed seeds torch's generators, which take a 64-bit integer, and the stages add offsets to it
# (seed + 20000, ...): 2^62 either side leaves room for them (seed=2^64 passed the config, then
# overflowed in torch.manual_seed after the models had loaded).
MAX_SEED = 2**62
# A bound compared with float32 tensors (is_clip) must be a float32: 1e308 is finite in Python but
# inf in float32, and torch refused the clamp mid-run.
MAX_FLOAT32 = 3.4028234663852886e38
Seed = Annotated[int, Field(ge=-MAX_SEED, le=MAX_SEED)]


def describe_validation_error(e: ValidationError, cls: type) -> str:
    """One clause per problem, naming the key and what is wrong; the offending value is shown only
    when it is a scalar (a model-level check's input is the whole config, which says nothing)."""
    msgs = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        if err["type"] == "extra_forbidden":
            hint = _trl_hint(key, cls) or did_you_mean(key, cls) or _without_prefix(key, got, cls)
            msgs.append(f"unknown key {key!r} for {cls.__name__}{hint}")
        elif err["type"] == "missing":
            msgs.append(f"missing required key {key!r}")
        elif err["type"] == "foreign_setting":  # rloo.config.methods.own_settings
            msgs.append(f"{key} {msg}")
        elif not key:
            msgs.append(msg)
        elif isinstance(got, dict) and msg.split(": ", 1)[0] in got:  # a section's check naming its key
            msgs.append(f"{key}.{msg}")
        elif isinstance(got, (dict, list, tuple, set)) or got is None:
            msgs.append(f"{key}: {msg}")
        else:
            shown = repr(got)
            msgs.append(f"{key}: {msg} (got {shown[:80] + '...' if len(shown) > 80 else shown})")
    return "invalid config: " + "; ".join(msgs)


def key_paths(cls: type[BaseModel], prefix: str = ""):
    """Every dotted key of `cls`, sections and the keys inside them (`rl`, `rl.steps`, ...)."""
    for name, f in cls.model_fields.items():
        yield prefix + name
        ann = next(
            (a for a in get_args(f.annotation) if isinstance(a, type) and issubclass(a, BaseModel)), f.annotation
        )
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from key_paths(ann, prefix + name + ".")


def did_you_mean(key: str, cls: type) -> str:
    """` (did you mean 'rl.steps'?)` for an unknown key: a key of `cls` spelled alike, else one with
    the same last part in another section (`steps` on the pipeline is `rl.steps`)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        return ""
    paths = [p for p in key_paths(cls) if p != key]
    close = difflib.get_close_matches(key, paths, n=1, cutoff=0.75)
    close = close or [p for p in paths if p.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]][:3]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _trl_hint(key: str, cls: type) -> str:
    """` (TRL's name; rloo's is k)` for one of TRL's names (rloo.config.trl_names)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        return ""
    return trl_hint(key, key_paths(cls))


def _without_prefix(key: str, got, cls: type) -> str:
    """` (write max_staleness=... without the 'rl.' prefix)` for a section of another command
    (`rloo train rl.max_staleness=1`, the pipeline's spelling) whose keys are this config's own."""
    fields = cls.model_fields if issubclass(cls, BaseModel) else {}
    if not isinstance(got, dict) or not got or not all(k in fields for k in got):
        return ""
    keys = ", ".join(f"{k}=..." for k in got)
    return f" (write {keys} without the {key + '.'!r} prefix: that is the pipeline's spelling)"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)

    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(describe_validation_error(e, type(self))) from None

    # Nested sections are validated by pydantic directly (errors keep their full dotted key), not
    # through this __init__: pydantic only calls an __init__ for nested data when it is "custom".
    __init__.__pydantic_base_init__ = True

    def __setattr__(self, name, value):
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise ConfigError(describe_validation_error(e, type(self))) from None

    @model_validator(mode="before")
    @classmethod
    def _no_coercion(cls, data):
        # YAML `seed: true` or `steps: "5"` are mistakes, not numbers: no silent bool/str -> number
        return reject_coercions(cls, data)


def check_device_name(v: str) -> str:
    """A device torch knows, checked in the config: torch.device('tpu') raised a RuntimeError deep
    inside a stage."""
    if not re.fullmatch(r"(cpu|cuda|mps|xpu)(:\d+)?", v):
        raise ValueError("device must be cpu, cuda, cuda:N, mps or xpu")
    return v


def check_float32(v: float) -> float:
    """A bound compared with float32 tensors: finite in float32, not only in Python (MAX_FLOAT32)."""
    if abs(v) > MAX_FLOAT32:
        raise ValueError(f"{v:g} is beyond float32's range (at most {MAX_FLOAT32:.4g}), in which it is compared")
    return v


TRACKERS = ("tensorboard", "wandb", "none")


def normalize_report_to(value) -> list[str]:
    """'tensorboard' | 'wandb' | 'none' | a list of them -> the trackers to start (none: [])."""
    names = [value] if isinstance(value, str) else list(value)
    bad = [n for n in names if n not in TRACKERS]
    if bad or not names:
        raise ValueError(f"report_to must be among {', '.join(TRACKERS)} (or a list of them), got {value!r}")
    return [n for n in dict.fromkeys(names) if n != "none"]


# dtype=float16 is in the configs' choices so that it is refused with this reason, not as a typo
FLOAT16_REFUSED = (
    "dtype=float16 needs loss scaling (its gradients underflow), which rloo does not do; "
    "use dtype=bfloat16 (bf16 autocast, fp32 master weights) or float32"
)


def refuse_float16(dtype: str) -> str:
    """A config's `dtype` validator: float16 refused in one line (rloo.runtime.precision)."""
    if dtype == "float16":
        raise ValueError(FLOAT16_REFUSED)
    return dtype
