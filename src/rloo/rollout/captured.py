"""The captured decode loop of `rloo.rollout.sampler.sample_tokens` (rl.captured_decode): the first token
drawn from the prompts' logits, then one fixed-shape step (rloo.rollout.captured_step) replayed per
token, a CUDA graph on CUDA, captured once per (rows, cache length, settings) and kept with the
model. The host looks at the rows every CHECK_EVERY steps only: "all done?" and the stop strings,
which it checks step by step over the tokens made since, as the eager loop would have, masking a
stopped row's later tokens. The same tokens as the eager loop with `rows` (the same up-front
uniforms), log-probs to rounding (tests/equivalence/test_captured_decode.py). What it cannot serve
falls back to the eager loop with one line saying why (`decodes_captured`), never silently."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from rloo.data.collate import position_ids
from rloo.modeling.attention import NAME as RLOO_SDPA
from rloo.modeling.attention import attn_implementation, uses_rloo_attention
from rloo.modeling.kvcache import Prefill
from rloo.modeling.static_cache import StaticCache, kv_dtype, prompt_bucket
from rloo.rollout.captured_step import CapturedStep, DecodeState, StepSettings, advance
from rloo.rollout.decoding import StopStrings, seen_tokens
from rloo.runtime.tracking.log import say_once

# Steps between the host's looks at the rows ("all done?", stop strings): at most this many
# steps run past the last row's end, their tokens masked.
CHECK_EVERY = 8
# Captured steps kept per model (each holds its cache and a graph); the oldest goes first.
MAX_STEPS_PER_MODEL = 4
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_POOL: list = []  # the one CUDA graph memory pool of this process, made at the first capture
_FAILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> why its capture failed


class CaptureFailed(RuntimeError):
    """The step could not be captured as a CUDA graph (the sampler decodes eagerly instead)."""


def captured_refusal(mode: str, model, device: torch.device, grouped: bool | None, all_done) -> str | None:
    """Why `sample_tokens` does not decode captured (None: it does); "" when that needs no word (off, or auto
    off CUDA: the default there)."""
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return ""
    impl = attn_implementation(model)
    if all_done is not None:
        return "under FSDP the processes' forward passes are collectives that stop together (all_done)"
    if grouped:
        return "grouped decoding (one copy of a shared prompt's keys/values) is the eager loop's"
    if impl not in ("sdpa", RLOO_SDPA):
        return f"attention implementation {impl!r}: the captured step hands SDPA a boolean mask"
    return _FAILED.get(model)


def fall_back(mode: str, why: str) -> None:
    """The one line of a fallback that was asked for (once per reason)."""
    say_once(f"captured_decode={mode}: the eager decode loop serves this rollout ({why})")


def decodes_captured(mode: str, model, device: torch.device, grouped: bool | None = None, all_done=None) -> bool:
    """Whether `sample_tokens` decodes with the captured step; a fallback that was asked for says why."""
    why = captured_refusal(mode, model, device, grouped, all_done)
    if why:
        fall_back(mode, why)
    return why is None


def python_state(model) -> tuple:
    """What a graph bakes in besides the tensors: the model's train/eval mode and each LoRA layer's
    merged / disabled / active adapters (PEFT decides in Python whether to add the adapter's
    product, so a step captured before `merge_adapter` would add it twice after). Part of a step's key."""
    # getattr: third-party: peft's LoRA layers; versions differ in which of the two flags they keep
    lora = tuple(
        (bool(getattr(m, "merged", False)), bool(getattr(m, "disable_adapters", False)), str(m.active_adapters))
        for m in model.modules()
        if hasattr(m, "lora_A") and hasattr(m, "active_adapters")
    )
    return (model.training, lora)


def _static_step(model, pre: Prefill, n: int, steps: int, settings: StepSettings, few_rows: bool) -> CapturedStep:
    """The model's captured step for this shape and these settings, built (and on CUDA captured) on
    first use; the same one while the model lives."""
    device, vocab = pre.last_logits.device, pre.last_logits.shape[-1]
    length = prompt_bucket(pre.mask.shape[1]) + steps
    # rloo_sdpa computes a CPU model's attention in fp32: keep the cache there (as the eager loop's)
    dtype = torch.float32 if device.type == "cpu" and uses_rloo_attention(model) else kv_dtype(pre.cache)
    amp = (torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
    key = (n, length, steps, vocab, dtype, amp, few_rows, settings, python_state(model))
    held = _STEPS.setdefault(model, {})
    step = held.get(key)
    if step is None or not step.cache.fits(pre.cache):
        if len(held) >= MAX_STEPS_PER_MODEL:
            held.pop(next(iter(held)))
        state = DecodeState(n, steps, vocab, settings.s.repetition_penalty != 1.0, device)
        step = held[key] = CapturedStep(model, StaticCache(pre.cache, n, length, dtype), state, settings)
        if device.type == "cuda" and steps > 1:
            _capture(model, held, key, step, prompt_bucket(pre.mask.shape[1]))
    return step


def _capture(model, held: dict, key, step: CapturedStep, start_col: int) -> None:
    """Capture `step` in the process's pool; a failure (an op the graph cannot hold, in a model's own
    code, say) is remembered for the model and raised as CaptureFailed, for the eager loop to serve."""
    _POOL[:] = _POOL or [torch.cuda.graph_pool_handle()]
    try:
        step.capture(model, start_col, _POOL[0])
    except Exception as e:  # noqa: BLE001 - any failure of the capture: the eager loop decodes, said once
        held.pop(key, None)
        why = f"its CUDA graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        _FAILED[model] = why
        raise CaptureFailed(why) from e


def _fill(step: CapturedStep, pre: Prefill, k: int, noise: Tensor, seen: Tensor | None) -> None:
    """This rollout's prompts, positions and noise into the step's buffers; outputs cleared."""
    st, mask = step.state, pre.mask
    step.cache.fill(pre.cache, mask, k, prompt_bucket(mask.shape[1]))
    st.pos.copy_(position_ids(mask)[:, -1:].repeat_interleave(k, dim=0) + 1)
    st.noise.copy_(noise)
    for t in (st.tok, st.t, st.done, st.ids, st.mask, st.lps):
        t.zero_()
    if st.seen is not None and seen is not None:
        st.seen.copy_(seen)


def _stop_rows(step: CapturedStep, stop: StopStrings, alive: Tensor, start: int, end: int) -> None:
    """The eager loop's stop-string checks of steps start..end-1, on the host: a live row (`alive`
    (N,) bool, host) ends at the first step whose text (from min_new_tokens tokens on) contains a
    stop string, unless that token is EOS; its later tokens become padding, masked, log-prob 0."""
    st, s = step.state, step.settings
    ids = st.ids[:, :end].cpu()
    for t in range(start, end):
        alive &= ids[:, t] != s.eos_id
        live = alive.nonzero(as_tuple=True)[0]
        if t + 1 < s.s.min_new_tokens or not len(live):
            continue
        hit = live[torch.tensor(stop(ids[live, : t + 1].tolist()), dtype=torch.bool)]
        if len(hit):
            alive[hit] = False
            rows = hit.to(st.done.device)
            st.done[rows] = True
            st.ids[rows, t + 1 :] = s.pad_id
            st.mask[rows, t + 1 :] = False
            st.lps[rows, t + 1 :] = 0.0


def _run(model, step: CapturedStep, logits: Tensor, stop: StopStrings | None, steps: int) -> int:
    """Step 0 from the prompts' logits, then replays, looking every CHECK_EVERY steps; the number of
    steps the eager loop would have made (the last row's end + 1)."""
    advance(logits, step.state, step.settings)
    alive = torch.ones(len(logits), dtype=torch.bool)  # the host's view of the rows (with stop strings)
    made, checked = 1, 0
    while True:
        if stop is not None:
            _stop_rows(step, stop, alive, checked, made)
            finished = not bool(alive.any())
        else:
            finished = bool(step.state.done.all())
        checked = made
        if finished or made == steps:
            break
        n = min(CHECK_EVERY, steps - made)
        for _ in range(n):
            step.replay(model)
        made += n
    return int(step.state.mask[:, :made].sum(-1).max())


def captured_sample(
    model, pre: Prefill, k: int, noise: Tensor, settings: StepSettings, stop: StopStrings | None, few_rows: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """`sample_tokens`' decoding with the captured step: ids, mask, logprobs (N, T') of the N = B*k rows
    continuing `pre`'s B prompts, T' <= T = max_new_tokens, from the (T, N) uniforms `noise` (`row_noise`)."""
    n, steps = pre.mask.shape[0] * k, settings.s.max_new_tokens
    step = _static_step(model, pre, n, steps, settings, few_rows)
    step.refresh(model)
    seen = None
    if settings.s.repetition_penalty != 1.0:
        seen = seen_tokens(pre.ids, pre.mask, pre.last_logits.shape[-1]).repeat_interleave(k, dim=0)
    _fill(step, pre, k, noise, seen)
    logits = pre.last_logits.detach().float().repeat_interleave(k, dim=0)
    made = _run(model, step, logits, stop, steps)
    st = step.state
    return st.ids[:, :made].clone(), st.mask[:, :made].clone(), st.lps[:, :made].clone()
