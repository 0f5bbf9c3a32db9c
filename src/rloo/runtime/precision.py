"""Which floating-point precision a run computes in, per device (`dtype=` of every stage).

- `float32`: weights and compute in fp32.
- `bfloat16`: *mixed* precision on every device: weights, gradients and AdamW state stay fp32 (the
  master copy), and the forward passes run under `torch.autocast(device, torch.bfloat16)`, which
  computes matmuls/linear layers in bf16 and everything else in the dtype of its inputs; on a CPU
  attention runs in fp32 (rloo.modeling.attention: CPU SDPA is slower in bf16). Pure bf16 weights
  (what CUDA had until issue 34) lose most AdamW updates at fine-tuning learning rates: an update
  below half a bf16 ulp of the weight (2^-9 relative) rounds away (`update_fraction`).
- `float16` is refused: it needs loss scaling, which rloo does not do.
- `auto`: bf16 autocast over fp32 master weights on CUDA; on CPU bf16 autocast where it pays, decided
  from the CPU's instruction set (`rloo.runtime.cpukind.auto_bf16`: AMX-BF16 or AVX512_BF16 -> bf16,
  neither -> fp32, where bf16 is emulated), not from a timing, so a loaded machine cannot change a run's
  numbers; only where the flags cannot tell (another architecture, oneDNN capped) a short matmul
  timing decides (`cpu_bf16_probe`: alternated repetitions, medians, bf16 at least `MIN_SPEEDUP`x).
  The model must also be at least `MIN_BF16_WIDTH` wide (narrower, autocast's casts cost what bf16
  saves: measured), or `MIN_BF16_WIDTH_SAMPLING` in the stages dominated by decoding (online RL,
  evaluation). The decision and its reason are logged once and written into each stage's config.yaml
  (`Precision.why`, `recorded_precision`).
  `RLOO_AUTO_DTYPE=float32|bfloat16` in the environment fixes what `auto` means on CPU without
  probing (the test suite pins float32 this way, see tests/conftest.py).

What stays fp32 under autocast (and why it is safe): the LM head of every log-prob pass computes in
fp32 with autocast off (`rloo.modeling.forward.lm_logits`, `rloo.core.logprobs.fp32_linear`; inside
DDP, FSDP2 and PEFT wrappers and non-plain heads through the heads' own forward,
`rloo.modeling.fp32_head`) and log-softmax/log-probs upcast the logits (`rloo.core.logprobs`), reward
scores come from an fp32 score head (`rloo.modeling.forward.score_head`), and the KL,
advantages and loss reductions only see those fp32 tensors (autocast casts only matmul-like ops).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar, overload

import torch

from rloo.config.base import FLOAT16_REFUSED
from rloo.config.supervised import ArchConfig
from rloo.errors import RlooError
from rloo.runtime.cpukind import auto_bf16, cpu_flags
from rloo.runtime.matmul_timing import (  # noqa: F401 - the probe's rule and constants, re-exported
    MIN_SPEEDUP,
    PROBE_REPS,
    PROBE_SHAPE,
    choose_bf16,
    time_matmuls,
)
from rloo.runtime.tracking.log import note

P = ParamSpec("P")  # a stage's parameters and result type, which stage_precision keeps
R = TypeVar("R")
# Models narrower than this keep fp32 under auto. Measured with attention in fp32 (rloo.modeling.attention;
# docs/precision.md): at width 128 bf16 autocast made the demo faster (0.74x its fp32 wall time, ABBA),
# at width 64 slower (`rloo compare --quick`, 1.07x). Before attention moved to fp32, bf16 had been
# slower at 128 too (CPU bf16 SDPA is 2-4x slower than fp32 at these lengths). A timing probe at the
# model's own width was tried instead and read a 512-wide linear layer at 1.36-1.98x in three quiet
# runs: it would have flipped the choice, and with it the run's numbers, from one run to the next.
# The dtypes a config or the vLLM engine names, by name ("bfloat16" -> torch.bfloat16)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

MIN_BF16_WIDTH = 128
# Stages whose time is mostly decoding (online RL's sampling, evaluation) need a wider model: a decode
# step multiplies a few dozen rows, where autocast's per-op casts cost what bf16 saves. Measured at
# width 128 (docs/precision.md): the demo's RL stage 0.97x and 1.03x its fp32 time (two ABBA runs),
# the arithmetic pipeline's 1.33x, while SFT and reward-model training ran 0.70-0.93x; at width 256
# (`rloo bench`'s S) the RLOO step ran 1.24x faster in bf16.
MIN_BF16_WIDTH_SAMPLING = 256


@dataclass(frozen=True)
class Precision:
    """weights: the dtype parameters are stored and optimised in; compute: the autocast dtype
    (None = no autocast: ops run in the weights' dtype); why: how it was chosen (for the log)."""

    device_type: str
    weights: torch.dtype
    compute: torch.dtype | None = None
    why: str = ""

    @property
    def name(self) -> str:
        """The dtype the matmuls run in: what `dtype=` resolved to."""
        return str(self.compute or self.weights).removeprefix("torch.")

    def autocast(self):
        """The context the forward passes run in: torch.autocast, or without mixed precision autocast
        switched off (a stage nested in another, e.g. a compare cell, must not inherit its autocast)."""
        if self.compute is not None:
            return torch.autocast(self.device_type, dtype=self.compute)
        if self.device_type in ("cpu", "cuda"):
            return torch.autocast(self.device_type, enabled=False)
        return contextlib.nullcontext()


def _timed_decision(why_not_flags: str) -> tuple[bool, str, str]:
    """(bf16?, why, note) from `time_matmuls` on one thread: the core's bf16 rate against its fp32 rate
    (with 2 threads on a loaded machine a region waits for its descheduled thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fp32_s, bf16_s = time_matmuls()
    finally:
        torch.set_num_threads(threads)
    bf16, (m, k, n) = choose_bf16(fp32_s, bf16_s), PROBE_SHAPE
    why = f"{why_not_flags}; probe: bf16 matmul {fp32_s / bf16_s:.2f}x fp32 (needs >= {MIN_SPEEDUP}x)"
    timing = f"CPU matmul {m}x{k}x{n} fp32 {1e3 * fp32_s:.2f} ms, bf16 {1e3 * bf16_s:.2f} ms; "
    return bf16, why, timing


@functools.cache
def cpu_bf16_probe() -> dict:
    """Once per process: {"bf16": bool, "why": str}, dtype=auto's CPU decision (`cpukind.auto_bf16`,
    timed only where the flags cannot tell), logged in one line."""
    bf16, why = auto_bf16(cpu_flags())
    timing = ""
    if bf16 is None:
        bf16, why, timing = _timed_decision(why)
    widths = (
        f" for models of width >= {MIN_BF16_WIDTH} (>= {MIN_BF16_WIDTH_SAMPLING} in the decoding-bound RL "
        "and evaluation stages)"
    )
    note(f"precision: {timing}dtype=auto uses {'bf16 autocast' + widths if bf16 else 'float32'} on this CPU: {why}")
    return {"bf16": bf16, "why": why}


@functools.cache
def _narrow_model_note(width: int, min_width: int) -> None:
    note(
        f"precision: model width {width} < {min_width}: dtype=auto uses float32 in this stage "
        f"(bf16 autocast pays from {min_width})"
    )


def _auto_cpu(width: int | None, min_width: int = MIN_BF16_WIDTH) -> tuple[bool, str]:
    """(use bf16?, why) for dtype=auto on CPU: the environment's pin, else the probe, for a model
    `width` wide in a stage that needs `min_width` for bf16 to pay."""
    pinned = os.environ.get("RLOO_AUTO_DTYPE", "").strip()
    if pinned:
        if pinned not in ("float32", "bfloat16"):
            raise RlooError(f"RLOO_AUTO_DTYPE={pinned!r}: expected float32 or bfloat16 (or unset it)")
        return pinned == "bfloat16", f"RLOO_AUTO_DTYPE={pinned}"
    if width is not None and width < min_width:
        probe_said_no = cpu_bf16_probe.cache_info().currsize > 0 and not cpu_bf16_probe()["bf16"]
        if not probe_said_no:  # else the probe's own "float32" line already says why
            _narrow_model_note(width, min_width)
        return False, f"model width {width} < {min_width}"
    p = cpu_bf16_probe()
    return p["bf16"], p["why"]


def resolve_precision(
    name: str | torch.dtype,
    device: str | torch.device = "cpu",
    width: int | None = None,
    min_width: int = MIN_BF16_WIDTH,
) -> Precision:
    """What `dtype=name` means on `device` for a model `width` wide (None: unknown) in a stage where
    bf16 pays from `min_width` on (see the module docstring)."""
    dev = torch.device(device).type
    if isinstance(name, torch.dtype):
        return Precision(dev, name, None, "given")
    check_dtype_name(name)
    if name == "auto" and dev == "cuda":
        return Precision(dev, torch.float32, torch.bfloat16, "auto on CUDA: bf16 autocast, fp32 master weights")
    if name == "auto" and dev == "cpu":
        bf16, why = _auto_cpu(width, min_width)
        return Precision(dev, torch.float32, torch.bfloat16 if bf16 else None, why)
    if name == "auto":
        return Precision(dev, torch.float32, None, f"auto on {dev}")
    if name == "bfloat16":
        return Precision(dev, torch.float32, torch.bfloat16, "dtype=bfloat16 (fp32 master weights)")
    return Precision(dev, torch.float32, None, "dtype=float32")


def check_dtype_name(name: str) -> str:
    """`name` if rloo runs in it, else one clear error (float16: no loss scaling here)."""
    if name == "float16":
        raise RlooError(FLOAT16_REFUSED)
    if name not in ("auto", "float32", "bfloat16"):
        raise RlooError(f"dtype={name!r}: expected auto, float32 or bfloat16")
    return name


def update_fraction(weights: torch.Tensor, grad: torch.Tensor, lr: float) -> float:
    """The fraction of `weights`' elements one AdamW step at `lr` changes (weight decay 0), in the
    weights' own dtype: what is left of an update after rounding to that dtype. Adam's first step
    moves every element by ~lr, so in fp32 (24-bit mantissa) it changes all of N(0, 0.02) weights
    at lr 1e-6, in bf16 (8-bit: a change below |w| 2^-9 rounds away) almost none."""
    w = torch.nn.Parameter(weights.clone())
    w.grad = grad.to(w.dtype)
    torch.optim.AdamW([w], lr=lr, weight_decay=0.0).step()
    return float((w.detach() != weights).float().mean())


def weights_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype parameters are stored in under `dtype=name`: `resolve_precision(...).weights` without
    the CPU probe, which decides only autocast (every `auto` outcome keeps fp32 master weights)."""
    if name == "auto":
        return torch.float32
    return resolve_precision(name, device).weights


def model_width(cfg) -> int | None:
    """The width (hidden size) of the model a stage runs, for dtype=auto's probe: from the local
    model folder's config.json (`policy`, `model`, `sft_model`, first found), else the built-in
    architecture (`arch`, `sft.arch`); None when unknown (a Hub name not yet downloaded)."""
    fields = vars(cfg)  # a stage config's fields (each stage has some of these keys)
    for key in ("policy", "model", "sft_model"):
        path = fields.get(key)
        if isinstance(path, (str, Path)) and (Path(path) / "config.json").is_file():
            try:
                config = json.loads((Path(path) / "config.json").read_text())
            except (OSError, ValueError):
                return None
            width = next((config[k] for k in ("hidden_size", "n_embd", "d_model") if k in config), None)
            return width if isinstance(width, int) else None
    sft = fields.get("sft")  # the pipeline's section; SFTConfig has `arch` itself
    for arch in (fields.get("arch"), None if sft is None else vars(sft).get("arch")):
        if isinstance(arch, ArchConfig):
            return arch.hidden_size
    return None


# the precision of the innermost running stage (stages nest: a compare cell's train inside compare)
_STAGE_PRECISION: contextvars.ContextVar[Precision | None] = contextvars.ContextVar("stage_precision", default=None)


def running_precision() -> Precision | None:
    """The precision of the stage running now in this process (None outside one): what a helper
    process (the rollout producer) must compute in to compute as the stage does."""
    return _STAGE_PRECISION.get()


def recorded_precision() -> dict | None:
    """{"dtype": what the matmuls run in, "reason": why} of the stage running now (None outside one):
    what a run folder records beside its settings (rloo.training.common.prepare_run_dir)."""
    p = running_precision()
    return None if p is None else {"dtype": p.name, "reason": p.why}


@overload
def stage_precision(fn: Callable[P, R], *, min_width: int = ...) -> Callable[P, R]: ...
@overload
def stage_precision(fn: None = None, *, min_width: int = ...) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def stage_precision(fn: Callable | None = None, *, min_width: int = MIN_BF16_WIDTH) -> Callable:
    """Decorator for a stage `fn(cfg, ...)`: runs it under the autocast of cfg.dtype on cfg.device.
    `@stage_precision(min_width=MIN_BF16_WIDTH_SAMPLING)` for a stage dominated by decoding."""

    def wrap(stage):
        @functools.wraps(stage)
        def run(cfg, *args, **kwargs):
            chosen = resolve_precision(cfg.dtype, cfg.device, model_width(cfg), min_width)
            token = _STAGE_PRECISION.set(chosen)
            try:
                with chosen.autocast():
                    return stage(cfg, *args, **kwargs)
            finally:
                _STAGE_PRECISION.reset(token)

        run.min_bf16_width = min_width  # type: ignore[attr-defined]  # what the stage asks (functools.wraps keeps it)
        return run

    return wrap if fn is None else wrap(fn)


def refresh_casts_after_step(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Autocast keeps one bf16 copy of each trainable weight for as long as its context is open;
    after an optimizer step those copies are stale, so they are dropped (a no-op without autocast)."""
    opt.register_step_post_hook(lambda *_: torch.clear_autocast_cache())
    return opt
