"""Gradient checkpointing never changes the math of the shared-prompt pass (issue 11, point 1).

transformers drops the KV cache inside checkpointed decoder layers; the shared pass runs the
completions against their prompt's cache, so without rloo.modeling.layer_checkpoint they would run without
their prompt (the 21% loss error on GPT-NeoX, a shape error on Qwen2 with padded prompts). Here
`rloo.train` with checkpointing on must give checkpointing off's step-1 loss and gradient norm.

Tolerance: the two runs do the same float32 operations in the same order (checkpointing only
recomputes the same layer forward in backward), so they agree to rounding: relative 1e-5
(about 80 float32 ulps, eps = 1.19e-7) is the issue's bound and leaves room for the recompute
using another kernel path on another CPU.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from helpers.tiny_archs import ARCHS, save_tiny_lm
from rloo import RLConfig, train
from rloo.modeling.forward_shared import completion_logprobs_shared
from rloo.modeling.loading import enable_gradient_checkpointing

REL = 1e-5
PADDED = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :", "post : tl;dr :"]
UNPADDED = [
    "post : job rent tl;dr :",
    "post : exam car tl;dr :",
    "post : loan sister tl;dr :",
    "post : mom dog tl;dr :",
]


def _reward(prompts, completions):
    return [len(c.split()) / 5 - 0.1 * c.count("tl;dr") for c in completions]


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    return {a: save_tiny_lm(root / a, a) for a in ARCHS}


def _step1(path, out, prompts, checkpointing: bool) -> dict:
    cfg = RLConfig(
        policy=str(path),
        output_dir=out,
        steps=1,
        batch_size=4,
        k=4,
        max_new_tokens=6,
        lr=1e-3,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        seed=3,
        dtype="float32",
        gradient_checkpointing=checkpointing,
        share_prompt=True,
    )
    return next(h for h in train(cfg, prompts=prompts, reward_fn=_reward).history if "loss/policy" in h)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("arch", ARCHS)
def test_train_step_with_checkpointing_equals_without(arch, padded, arch_dirs, tmp_path):
    prompts = PADDED if padded else UNPADDED
    off = _step1(arch_dirs[arch], tmp_path / "off", prompts, False)
    on = _step1(arch_dirs[arch], tmp_path / "on", prompts, True)
    assert on["gen/length"] == off["gen/length"]  # same samples (sampling is in eval mode)
    for key in ("loss/policy", "grad/norm"):
        assert on[key] == pytest.approx(off[key], rel=REL, abs=1e-7), key
    assert off["grad/norm"] > 0


def _grouped_batch(padded: bool, B=3, K=3, P=7, T=6, V=40):
    g = torch.Generator().manual_seed(0)
    p_len = torch.tensor([7, 3, 5]) if padded else torch.full((B,), P)
    p_mask = torch.arange(P)[None] >= (P - p_len)[:, None]
    p_ids = torch.randint(2, V, (B, P), generator=g).masked_fill(~p_mask, 0)
    c_mask = torch.arange(T)[None] < torch.tensor([6, 1, 4, 2, 6, 3, 5, 1, 6])[:, None]
    c_ids = torch.randint(2, V, (B * K, T), generator=g).masked_fill(~c_mask, 0)
    return p_ids.repeat_interleave(K, 0), p_mask.repeat_interleave(K, 0), c_ids, c_mask


def test_shared_pass_recomputes_layers_and_keeps_the_cache():
    """The layers really are recomputed in backward (checkpointing is not just switched off), and
    the prompt's keys/values reach the recomputed completions: log-probs and gradients exact."""
    from transformers.models.llama import modeling_llama

    from helpers.tiny_archs import tiny_lm

    calls = []
    orig = modeling_llama.LlamaMLP.forward
    batch = _grouped_batch(padded=True)
    results = []
    try:
        modeling_llama.LlamaMLP.forward = lambda self, x: calls.append(1) or orig(self, x)
        for checkpointing in (False, True):
            model = tiny_lm("llama").train()
            if checkpointing:
                enable_gradient_checkpointing(model)
            calls.clear()
            lp = completion_logprobs_shared(model, *batch, k=3)
            n_forward = len(calls)
            lp.masked_fill(~batch[3], 0).sum().backward()
            results.append((lp.detach(), [p.grad for p in model.parameters()], n_forward, len(calls)))
    finally:
        modeling_llama.LlamaMLP.forward = orig
    (lp0, g0, f0, b0), (lp1, g1, f1, b1) = results
    assert b0 == f0 and b1 == 2 * f1, "checkpointing on: every layer runs again in backward"
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=0)
    for a, b in zip(g1, g0, strict=False):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_model_without_checkpointing_layers_falls_back_to_plain(capsys):
    """A model whose checkpointing cannot keep the cache gets the plain pass (same numbers) from
    `policy_logprobs`, not a wrong one; the shared pass itself refuses it."""
    from helpers.tiny_archs import tiny_lm
    from rloo.modeling.forward import completion_logprobs
    from rloo.modeling.logprob_pass import policy_logprobs

    batch = _grouped_batch(padded=True)
    model = tiny_lm("qwen2").train()
    for layer in model.model.layers:  # what an old-style model looks like: only the model flag
        layer.__class__ = type("OldLayer", (torch.nn.Module,), {"forward": inspect.unwrap(type(layer).forward)})
    model.model.gradient_checkpointing = True
    model.model._gradient_checkpointing_func = None
    with pytest.raises(ValueError, match="cannot keep the prompt's KV cache"):
        completion_logprobs_shared(model, *batch, k=3)
    lp = policy_logprobs(model, *batch, k=3, share=True)
    model.model.gradient_checkpointing = False
    plain = completion_logprobs(model, *batch)
    torch.testing.assert_close(lp[batch[3]], plain[batch[3]], rtol=0, atol=0)
    captured = capsys.readouterr()
    assert "cannot keep the prompt's KV cache" in captured.out + captured.err
