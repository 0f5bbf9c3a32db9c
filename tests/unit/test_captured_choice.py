"""Issue 55: which decode loop `sample` runs (rl.captured_decode, rloo.rollout.captured): auto is the
captured step on CUDA and the eager loop elsewhere without a word; what the captured step cannot
serve falls back to the eager loop with one line naming why, once per reason."""

from __future__ import annotations

import sys

import pytest
import torch
from tests.helpers.tiny_archs import EOS, PAD, tiny_lm

from rloo.config import Sampling
from rloo.modeling.attention import use_rloo_attention
from rloo.rollout import captured, sampler
from rloo.runtime.tracking.log import say_once

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_is_captured_on_cuda_and_eager_elsewhere_silently():
    model = tiny_lm("llama")
    assert captured.captured_refusal("auto", model, CUDA, None, None) is None
    assert captured.captured_refusal("on", model, CPU, None, None) is None
    assert captured.captured_refusal("auto", model, CPU, None, None) == ""
    assert captured.captured_refusal("off", model, CUDA, None, None) == ""


@pytest.mark.parametrize(
    "setting,why",
    [
        (dict(all_done=lambda done: bool(done.all())), "under FSDP"),
        (dict(grouped=True), "grouped decoding"),
        (dict(attn="eager"), "attention implementation 'eager'"),
    ],
)
def test_what_the_step_cannot_serve_falls_back_with_one_line(setting, why, capsys):
    model = tiny_lm("llama").eval()
    use_rloo_attention(model)  # grouped decoding needs rloo_sdpa
    if "attn" in setting:
        model.set_attn_implementation(setting.pop("attn"))
    line = f"captured_decode=on: the eager decode loop serves this rollout ({why}"
    for seen in say_once.__defaults__[0].copy():  # this process may have said it already
        if seen.startswith(line):
            say_once.__defaults__[0].discard(seen)
    ids = torch.tensor([[5, 6, 7], [PAD, 8, 9]])
    kw = dict(eos_id=EOS, pad_id=PAD, k=2, captured="on", **setting)
    for _ in range(2):
        sampler.sample_tokens(model, ids, ids != PAD, Sampling(4, 3), generator=torch.Generator().manual_seed(0), **kw)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("captured_decode=")]
    assert len(lines) == 1 and lines[0].startswith(line), lines
    assert not captured._STEPS.get(model), "a fallback built a captured step"


def test_a_failed_capture_falls_back_to_the_eager_loop_on_the_same_noise(monkeypatch, capsys):
    """A step CUDA could not capture (an op in a model's own code that a graph cannot hold): one line,
    and the eager loop decodes from the same prompt pass and the same (0, N) uniforms."""

    def failing(*args, **kwargs):
        raise captured.CaptureFailed("its CUDA graph capture failed: test")

    model = tiny_lm("llama").eval()
    ids = torch.tensor([[5, 6, 7], [PAD, 8, 9]])
    kw = dict(eos_id=EOS, pad_id=PAD, k=2, generator=torch.Generator().manual_seed(0))
    want = sampler.sample_tokens(model, ids, ids != PAD, Sampling(5, 3), rows=(0, 4), captured="off", **kw)
    monkeypatch.setattr(captured, "_static_step", failing)
    monkeypatch.setattr(captured, "say_once", lambda msg: print(msg, file=sys.stderr))
    kw["generator"] = torch.Generator().manual_seed(0)
    got = sampler.sample_tokens(model, ids, ids != PAD, Sampling(5, 3), captured="on", **kw)
    assert "captured_decode=on: the eager decode loop serves this rollout (its CUDA graph capture failed" in (
        capsys.readouterr().err
    )
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
