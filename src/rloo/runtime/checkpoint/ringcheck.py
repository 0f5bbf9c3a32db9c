"""An asynchronous run's checkpoint on resume (rl.max_staleness = N > 0; docs/async.md "Exact
resume"): ring/ must hold exactly the weight versions the next batches are sampled with, each
shaped as the policy's, written for a policy of the same configuration. Anything else is refused in
one line before the run folder is touched: a wrong-shape tensor gave a 34-line size-mismatch
traceback, and a missing tensor, a missing version or a missing ring/ resumed silently with other
weights than the run that never stopped (docs/reliability.md).

The configuration check compares `policy_config` (the model's config, without the keys that only
say where or how it was stored: `config_dict`) with what each ring file and the checkpoint's model
were written for, so a model of the same shapes but another `num_attention_heads` is refused too."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from rloo.errors import RlooError, option
from rloo.runtime.checkpoint.verify import RING, ring_file
from rloo.runtime.inputs.hf import hf_config
from rloo.runtime.link.weights import frozen_names, tied_names

CONFIG_KEY = "rloo_policy_config"  # the safetensors metadata of a ring file: the policy's config_dict, JSON
VOLATILE = {"torch_dtype", "dtype", "transformers_version", "use_cache", "architectures"}


def config_dict(model: object) -> dict:
    """The configuration that decides what `model` computes (keys of storage and loading left out); any
    object with a Hugging Face `config` (a model, a LoRA reference forwarding its network's), else {}."""
    config = hf_config(model)
    d = config.to_dict() if config is not None else {}
    kept = {k: v for k, v in d.items() if not k.startswith("_") and k not in VOLATILE}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))  # as read back: {0: ..} -> {"0": ..}


def ring_metadata(model: torch.nn.Module) -> dict[str, str]:
    return {CONFIG_KEY: json.dumps(config_dict(model), sort_keys=True)}


def config_change(saved: dict, now: dict) -> str | None:
    """'key: old -> new' for the first key that differs (None: the same configuration)."""
    for k in sorted(set(saved) | set(now)):
        if saved.get(k) != now.get(k):
            return f"{k}: {saved.get(k)!r} -> {now.get(k)!r}"
    return None


def ring_window(step: int, saved_n: int, n: int) -> range:
    """The versions a checkpoint at `step` of a run with max_staleness `saved_n` holds that a run
    with `n` samples its next batches with (WeightRing.older_versions; none if either is 0)."""
    lag = min(saved_n, n)
    return range(max(0, step - lag), step) if lag else range(0)


def check_ring(ckpt: Path, saved: dict, policy: torch.nn.Module, window: range, recorded, dtype_may_change: bool):
    """Refuse (one RlooError line) a checkpoint whose ring/ lacks a version its state.pt lists
    (`recorded`), or holds tensors that are not the policy's (names, shapes, dtypes unless
    `dtype_may_change`, configuration). Returns a line saying the continuation is not exact when
    versions of `window` were never written (a checkpoint from before they were recorded, or one
    written after a non-finite streak: rloo.training.guard), else None."""
    where = f"cannot resume from {ckpt}"
    if lost := [v for v in recorded or [] if v in window and v not in saved]:
        what = "has no ring/ folder" if not saved else f"lacks ring/version-{lost[0]:06d}.safetensors"
        raise RlooError(
            f"{where}: it {what}, which its state.pt lists (the weight versions its next batches are sampled "
            f"with), so the run would not continue exactly; restore the checkpoint's ring/, resume with "
            f"max_staleness=0 (not exact either), or pass {option('overwrite')}"
        )
    state = policy.state_dict()
    expected = set(state) - frozen_names(policy) - set(tied_names(policy))
    now = config_dict(policy)
    for v in [v for v in window if v in saved]:
        problem = _tensor_problem(saved[v], expected, state, dtype_may_change) or _config_problem(ckpt, v, now)
        if problem:
            raise RlooError(f"{where}: ring/version-{v:06d}.safetensors {problem}; it is not this run's version {v}")
    if absent := [v for v in window if v not in saved]:
        return (
            f"resuming from {ckpt} without weight version{'s' if len(absent) > 1 else ''} "
            f"{', '.join(map(str, absent))} (not in its ring/): the next batches are sampled with newer weights, "
            "not an exact continuation"
        )
    return None


def _tensor_problem(tensors: dict, expected: set, state: dict, dtype_may_change: bool) -> str | None:
    if lacking := sorted(expected - set(tensors)):
        return f"lacks {lacking[0]}" + (f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else "")
    if extra := sorted(set(tensors) - expected):
        return f"holds {extra[0]}, which the policy does not train"
    for n in sorted(expected):
        t, want = tensors[n], state[n]
        if t.shape != want.shape or (t.dtype != want.dtype and not dtype_may_change):
            return (
                f"holds {n} as {list(t.shape)} {str(t.dtype).removeprefix('torch.')}, the policy's is "
                f"{list(want.shape)} {str(want.dtype).removeprefix('torch.')}"
            )
    return None


def _config_problem(ckpt: Path, version: int, now: dict) -> str | None:
    """The ring file's recorded policy configuration against the policy's (a file from before it was
    recorded: nothing to compare)."""
    with safe_open(str(ring_file(Path(ckpt) / RING, version)), "pt") as f:
        recorded = (f.metadata() or {}).get(CONFIG_KEY)
    if not recorded:
        return None
    try:
        change = config_change(json.loads(recorded), now)
    except (ValueError, AttributeError):  # not a JSON object
        return "has an unreadable record of its policy's configuration"
    return f"was written for a policy of another configuration ({change})" if change else None
