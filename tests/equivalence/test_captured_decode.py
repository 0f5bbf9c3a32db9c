"""Issue 55: the captured decode step (rl.captured_decode; rloo.rollout.captured: a static KV cache,
one fixed-shape step, the host looking every few steps) against the eager loop it replaces, with the
same seeds and the same up-front uniforms (the eager loop's `rows=(0, N)` path): the same tokens and
masks, log-probs to rounding, over temperature, top_k, top_p, min_new_tokens, the repetition
penalty, truncated log-probs, greedy decoding, stop strings, the shared prompt on and off, the four
architectures (tied heads too), fp32 and bf16 autocast, LoRA. On CPU the step runs op by op; the
`cuda` tests capture it as a CUDA graph (benchmarks/gpu_check.sh runs them).

Tolerances (tests/tolerance.py): the two paths attend over different numbers of masked columns
(P + t against Pb + T), so a logit differs by the rounding of one forward pass of the tiny models
(TINY_MODEL_FORWARD), in bf16 where autocast computes the products in bf16."""

from __future__ import annotations

import itertools

import pytest
import torch
from tests.helpers.tiny_archs import EOS, PAD, V, tiny_lm

from rloo.config import Sampling
from rloo.modeling.attention import use_rloo_attention
from rloo.rollout import sampler
from tolerance import TINY_MODEL_FORWARD, assert_close

T_NEW = 14  # more than one look of the host (CHECK_EVERY = 8)
ARCHS = [("llama", False), ("qwen2", False), ("gpt2", True), ("gpt_neox", False), ("llama", True)]
SETTINGS = {
    "plain": dict(),
    "shaped": dict(temperature=0.8, top_k=5, min_new_tokens=3, repetition_penalty=1.3),
    "truncated": dict(top_p=0.8, top_k=9, truncated_logprobs=True),
    "greedy": dict(temperature=0.0, repetition_penalty=1.2),
}
CUDA = pytest.param(
    "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
)


def _prompts(device="cpu", b: int = 4, width: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, V, (b, width), generator=g)
    ids[0, :3] = PAD  # left padding
    ids[2, :1] = PAD
    return ids.to(device), (ids != PAD).to(device)


def _eos_prone(model, bias: float = 2.5):
    """`model` (untied head) with a bias toward EOS, so most rows end before max_new_tokens."""
    head = model.get_output_embeddings()
    head.bias = torch.nn.Parameter(torch.zeros(V, device=head.weight.device))
    with torch.no_grad():
        head.bias[EOS] = bias
    return model


def _sample(model, ids, mask, captured: str, *, k=3, share=True, amp=False, steps=T_NEW, **kw):
    """(ids, mask, logprobs) of rloo's sampler on the same (0, N) uniforms; share=False: k copies of
    each prompt, each prefilled (share_prompt off)."""
    if not share:
        ids, mask, k = ids.repeat_interleave(k, 0), mask.repeat_interleave(k, 0), 1
    n = ids.shape[0] * k
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=amp):
        return sampler.sample_tokens(
            model,
            ids,
            mask,
            Sampling(steps, ids.shape[1], **kw),
            eos_id=EOS,
            pad_id=PAD,
            k=k,
            generator=torch.Generator().manual_seed(1),
            rows=(0, n),
            captured=captured,
        )


def assert_same_rollout(got, want, dtype=torch.float32):
    """Same tokens and masks (so the same length), log-probs within the forward pass's rounding."""
    assert got[0].shape == want[0].shape, (got[0].shape, want[0].shape)
    assert torch.equal(got[1], want[1]), "masks differ"
    assert torch.equal(got[0], want[0]), "tokens differ"
    assert_close(got[2], want[2], TINY_MODEL_FORWARD, dtype=dtype)
    assert not bool(got[2][~got[1]].any()), "a masked position holds a log-prob"


def _case(arch, tied, setting, share, amp, device="cpu"):
    model = tiny_lm(arch, tied=tied).to(device).eval()
    if amp:
        use_rloo_attention(model)  # what rloo's loaders do: fp32 attention on CPU under autocast
    ids, mask = _prompts(device)
    kw = dict(share=share, amp=amp, **SETTINGS[setting])
    want = _sample(model, ids, mask, "off", **kw)
    got = _sample(model, ids, mask, "on", **kw)
    assert_same_rollout(got, want, torch.bfloat16 if amp else torch.float32)


# the quick tier: each architecture, each setting twice, share and bf16 on and off, in 8 cases
L, Q, G, N, LT = ARCHS
QUICK = [
    (L, "plain", True, False),
    (Q, "shaped", False, True),
    (G, "truncated", True, True),
    (N, "greedy", True, False),
    (LT, "shaped", True, False),
    (N, "truncated", False, True),
    (G, "greedy", False, False),
    (Q, "plain", True, True),
]


@pytest.mark.parametrize("arch_tied,setting,share,amp", QUICK)
def test_captured_step_draws_what_the_eager_loop_draws(arch_tied, setting, share, amp):
    _case(*arch_tied, setting, share, amp)


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch_tied,setting,share,amp", list(itertools.product(ARCHS, SETTINGS, (True, False), (False, True)))
)
def test_captured_step_full_matrix(arch_tied, setting, share, amp):
    _case(*arch_tied, setting, share, amp)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_rows_that_end_early_and_the_trimmed_length(device):
    """Most rows end at EOS before max_new_tokens, at different steps, some after the host's first
    look: the same ends, padding and length (the last row's end + 1) as the eager loop."""
    model = _eos_prone(tiny_lm("llama").to(device).eval())
    ids, mask = _prompts(device)
    want = _sample(model, ids, mask, "off", steps=40)
    got = _sample(model, ids, mask, "on", steps=40)
    ends = want[1].sum(-1)
    assert want[0].shape[1] < 40 and len(set(ends.tolist())) > 3 and int(ends.max()) > 9, ends
    assert_same_rollout(got, want)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_rows_of_a_split_batch_draw_the_same_tokens(device):
    """torchrun: each process samples its rows of the global batch with that batch's noise."""
    model = tiny_lm("qwen2").to(device).eval()
    ids, mask = _prompts(device)
    gen = dict(eos_id=EOS, pad_id=PAD, k=3, captured="on")
    s = Sampling(T_NEW, ids.shape[1])
    whole = sampler.sample_tokens(model, ids, mask, s, generator=torch.Generator().manual_seed(2), rows=(0, 12), **gen)
    halves = [
        sampler.sample_tokens(
            model, ids[h], mask[h], s, generator=torch.Generator().manual_seed(2), rows=(6 * i, 12), **gen
        )
        for i, h in enumerate((slice(0, 2), slice(2, 4)))
    ]
    for i, half in enumerate(halves):
        rows = slice(6 * i, 6 * i + 6)
        width = half[0].shape[1]
        assert torch.equal(half[0], whole[0][rows, :width]) and not bool(whole[1][rows, width:].any())
        assert_close(half[2], whole[2][rows, :width], TINY_MODEL_FORWARD)


@pytest.mark.parametrize("device", [CUDA])
def test_bf16_autocast_on_the_device(device):
    """bf16 autocast on CUDA: SDPA in bf16 over the static cache, in a graph (CPU: QUICK's bf16 cases)."""
    for arch, tied in ARCHS[:4]:
        model = tiny_lm(arch, tied=tied).to(device).eval()
        ids, mask = _prompts(device)
        want = _sample(model, ids, mask, "off", amp=True, **SETTINGS["shaped"])
        got = _sample(model, ids, mask, "on", amp=True, **SETTINGS["shaped"])
        assert_same_rollout(got, want, torch.bfloat16)
