"""The decode steps' linear layers taken the other way round (rloo.modeling.few_rows): (W x^T)^T is
x W^T, the same dot products, summed in whatever order the BLAS picks for the other shape.

Tolerance (tests/tolerance.py): each output entry is one dot product of `in` terms, which any
reordering moves by at most `in` eps sum_j |x_j W_ij| (Higham's gamma_n), plus one rounding for the
bias: the scale is max_i (|x| |W|^T)_i + |b|_i and the factor in + 1. End to end, the sampler's
log-probs go through the tiny models' whole forward pass: TINY_MODEL_FORWARD of their scale.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import rloo.modeling.few_rows as few_rows
from helpers.tiny_archs import ARCHS, PAD, V, seeded_sample, tiny_lm
from rloo.modeling.few_rows import MAX_ROWS, few_rows_linear, few_rows_linears, few_rows_pays, takes_swapped
from rloo.modeling.lora import add_lora
from tolerance import TINY_MODEL_FORWARD, assert_close

pytestmark = pytest.mark.equivalence


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (7, 48), (MAX_ROWS, 32), (2, 5, 48)], ids=str)
def test_swapped_product_is_linear(shape, bias):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(*shape, generator=g), torch.randn(96, shape[-1], generator=g)
    b = torch.randn(96, generator=g) if bias else None
    with torch.no_grad():
        assert takes_swapped(x, w)
        out, ref = few_rows_linear(x, w, b), F.linear(x, w, b)
    assert out.shape == ref.shape and out.is_contiguous()
    scale = float((x.abs() @ w.abs().t()).max()) + (float(b.abs().max()) if bias else 0.0)
    assert_close(out, ref, shape[-1] + 1, scale=scale)


def test_swapped_only_for_few_rows_without_gradient_or_autocast():
    """Where it was not measured (more rows, a gradient, autocast, bf16 weights) it is F.linear itself."""
    x, w = torch.randn(MAX_ROWS, 16), torch.randn(8, 16)
    with torch.no_grad():
        assert takes_swapped(x, w)
        assert not takes_swapped(torch.randn(MAX_ROWS + 1, 16), w)
        assert not takes_swapped(torch.randn(2, MAX_ROWS // 2 + 1, 16), w)  # rows counted over all leading dims
        assert not takes_swapped(x.bfloat16(), w.bfloat16())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not takes_swapped(x, w)
    assert not takes_swapped(x, w)  # gradient mode


def test_the_context_patches_plain_linears_and_restores_them():
    """Every nn.Linear (exact type) computes through few_rows_linear inside, nothing outside, also after
    an error; a module with a forward of its own is left alone."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    own = model[2].forward = lambda x: torch.zeros(x.shape[0], 2)
    with pytest.raises(RuntimeError, match="inside"), few_rows_linears(model) as n:
        assert n == 1 and "forward" in vars(model[0]) and model[2].forward is own
        raise RuntimeError("inside")
    assert "forward" not in vars(model[0]) and model[2].forward is own
    with few_rows_linears(model, enabled=False) as n:
        assert n == 0 and "forward" not in vars(model[0])


def _prompts():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, V, (3, 9), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :4], mask[1, :2] = False, False
    return ids.masked_fill(~mask, PAD), mask


# pairwise over architecture x head x LoRA (as tests/equivalence/test_gradient_matrix.py): every
# architecture with a tied and an untied head, with and without LoRA, and the four head x LoRA pairs,
# in 8 rows instead of the product's 16 (test_sampler_rows_cover_every_pair)
SAMPLER_FACTORS = (ARCHS, (False, True), (False, True))
SAMPLER_ROWS = [(arch, tied, tied == bool(i % 2)) for i, arch in enumerate(ARCHS) for tied in (False, True)]


def test_sampler_rows_cover_every_pair():
    for i, j in itertools.combinations(range(3), 2):
        want = set(itertools.product(SAMPLER_FACTORS[i], SAMPLER_FACTORS[j]))
        assert {(row[i], row[j]) for row in SAMPLER_ROWS} == want, (i, j)


@pytest.mark.parametrize(
    "arch,tied,lora",
    SAMPLER_ROWS,
    ids=[f"{a}-{'tied' if t else 'untied'}-{'lora' if lo else 'full'}" for a, t, lo in SAMPLER_ROWS],
)
def test_sampler_with_swapped_linears_draws_the_same_tokens(arch, tied, lora, monkeypatch):
    """End to end in fp32 on every architecture (GPT-2's Conv1D layers keep their own product, its head
    is an nn.Linear), tied and untied heads, under LoRA (its base layers and adapters are nn.Linear):
    the same tokens and, to fp32 rounding, the same log-probs as the plain decode, and the swapped
    product did run; both the training draws (`rows=`) and the exponential race."""
    model = tiny_lm(arch, tied=tied)
    if lora:
        from rloo.config import LoraSettings

        model = add_lora(model, LoraSettings(r=4, alpha=8))
    model.eval()
    calls = []
    original = few_rows.swapped_linear
    monkeypatch.setattr(few_rows, "swapped_linear", lambda *a: calls.append(1) or original(*a))
    ids, mask = _prompts()
    for rows in ((0, 12), None):
        ids0, m0, lp0 = seeded_sample(model, ids, mask, rows=rows, few_rows=False)
        assert not calls, "the swapped product ran with few_rows=False"
        ids1, m1, lp1 = seeded_sample(model, ids, mask, rows=rows, few_rows=True)
        assert calls, "the swapped product did not run"
        calls.clear()
        assert torch.equal(ids0, ids1) and torch.equal(m0, m1)
        assert_close(lp1, lp0, TINY_MODEL_FORWARD, scale=1.0 + float(lp0.abs().max()))


def test_used_only_where_measured(monkeypatch):
    """On by default only on a CPU of the measured kind (x86 without AVX-512) with two or more threads."""
    import torch.cpu

    monkeypatch.setattr(few_rows.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert few_rows_pays("cpu") and not few_rows_pays("cuda")
        torch.set_num_threads(1)
        assert not few_rows_pays("cpu")
        torch.set_num_threads(2)
        monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True)
        assert not few_rows_pays("cpu")
        monkeypatch.setattr(few_rows.platform, "machine", lambda: "aarch64")
        assert not few_rows_pays("cpu")
    finally:
        torch.set_num_threads(threads)
