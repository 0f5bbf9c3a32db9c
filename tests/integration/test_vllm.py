"""vLLM generation backend: a clean one-line error without a GPU; on a GPU with vLLM, its rollouts
have the sampler's layout and log-probs equal to a policy forward pass."""

from __future__ import annotations

import pytest
import torch

from rloo import RLConfig, RlooError
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_FORWARD, assert_close


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_vllm_without_gpu_is_a_clear_error(tiny_model_dir, tmp_path):
    cfg = RLConfig(policy=str(tiny_model_dir), output_dir=tmp_path, generation="vllm", reward_fn="math:fsum")
    with pytest.raises(RlooError, match="needs a CUDA GPU"):
        load_models(cfg)


def test_vllm_rollout_on_gpu(tiny_model_dir, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    from rloo.modeling.forward import completion_logprobs
    from rloo.modeling.loading import load_policy
    from rloo.rollout.vllm import VLLMSampler

    policy, tok = load_policy(str(tiny_model_dir), device="cuda")
    s = VLLMSampler(
        str(tiny_model_dir),
        tok,
        k=2,
        max_prompt_len=16,
        max_new_tokens=6,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        gpu_memory_utilization=0.2,
        dtype="float32",
    )
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    s.sync(policy)
    roll = s(policy, ["post : job rent tl;dr :", "post : exam car tl;dr :"])
    assert roll.completion_ids.shape[0] == 4 and roll.prompts[0] == roll.prompts[1]
    lp = completion_logprobs(policy, roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
    assert_close(roll.logprobs, lp.masked_fill(~roll.completion_mask, 0.0), TINY_MODEL_FORWARD)


def _out(*completions):
    """A fake vLLM RequestOutput: `.outputs` holds CompletionOutput-like (token_ids, finish_reason)."""
    from types import SimpleNamespace

    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tuple(t), finish_reason=f) for t, f in completions])


def test_vllm_rows_hold_only_the_sampled_tokens():
    """EOS = 1, pad = 0, a second stop token 9 (e.g. from the model's generation config). No row
    gets a token vLLM did not return: a stop on 9 is not followed by an appended EOS."""
    from rloo.rollout.vllm import completion_tensors

    outs = [
        _out(
            ([4, 5, 1], "stop"),  # stopped on EOS, which vLLM returns
            ([4, 9], "stop"),
        ),  # stopped on another stop token
        _out(
            ([6, 7, 8, 6], "length"),  # hit max_tokens: truncated
            ([], "stop"),
        ),
    ]  # EOS not returned (a stop string, or an engine that drops it)
    ids, mask, ended = completion_tensors(outs, pad_id=0)
    assert ids.tolist() == [[4, 5, 1, 0], [4, 9, 0, 0], [6, 7, 8, 6], [0, 0, 0, 0]]
    assert mask.sum(1).tolist() == [3, 2, 4, 0]
    assert ended.tolist() == [True, True, False, True]  # a stop on 9 is not a truncation either


def test_vllm_rollout_keeps_its_groups(tiny_model_dir, monkeypatch):
    """On CPU with a stand-in engine: the rollout says its rows come in groups of k (it said 1, so
    prompt sharing and the group metrics were lost under generation=vllm)."""
    import sys
    from types import ModuleType, SimpleNamespace

    from rloo.modeling.loading import load_policy
    from rloo.rollout.vllm import VLLMSampler

    inputs = ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    policy, tok = load_policy(str(tiny_model_dir))
    eos = tok.eos_token_id
    engine = SimpleNamespace(
        generate=lambda prompts, params, use_tqdm: [_out(([5, 6], "length"), ([7, eos], "stop"))] * len(prompts)
    )
    s = object.__new__(VLLMSampler)
    s.tokenizer, s.k, s.max_prompt_len = tok, 2, 16
    s.llm, s.params = engine, SimpleNamespace(temperature=1.0)
    roll = s(policy, ["post : job rent tl;dr :", "post : exam car tl;dr :"])
    assert roll.group_size == 2 and roll.completion_ids.shape[0] == 4


def test_vllm_engine_computes_in_the_trainers_dtype():
    """Not vLLM's "auto" (the checkpoint's dtype, e.g. fp32 for a model rloo saved)."""
    from rloo.rollout.vllm import vllm_dtype
    from rloo.runtime.precision import resolve_precision

    assert vllm_dtype(resolve_precision("auto", "cuda")) == "bfloat16"
    assert vllm_dtype(resolve_precision("float32", "cuda")) == "float32"
