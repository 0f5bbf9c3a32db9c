"""Where the CUDA paths put their tensors, checked without a GPU (issue 34): fake CUDA tensors
(FakeTensorMode) and a check on every generator-taking call (tests/helpers/device_check.py)."""

from __future__ import annotations

import pytest
import torch
from tests.helpers.device_check import DeviceCheck, fake_cuda

from rloo.rollout import sampler


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampler_draws_cuda_tokens_without_a_cpu_generator_on_cuda_tensors(top_p):
    """The loop's generator is a CPU one; on a CUDA model the sampler drew its race noise with it
    (`exponential_(generator=cpu)` on a CUDA tensor), which CUDA refuses before step 1."""
    gen = torch.Generator().manual_seed(0)
    check = DeviceCheck(strip=True)
    with fake_cuda(), check:
        logits = torch.randn(6, 11, device="cuda")
        tok, lp = sampler._next_token(logits, 0.7, top_p, gen, None)
    assert tok.device.type == "cuda" and lp.device.type == "cuda" and tok.shape == lp.shape == (6,)
    assert check.draws, "no noise was drawn"


def test_uniforms_are_drawn_where_the_generator_lives_and_moved():
    check = DeviceCheck(strip=True)
    with fake_cuda(), check:
        cuda = torch.device("cuda", 0)  # with an index: fake mode cannot look up the current CUDA device
        u = sampler.uniforms((3, 5), torch.Generator().manual_seed(0), cuda)
        v = sampler.uniforms((2,), None, cuda)  # no generator: the device's own
    assert u.device.type == v.device.type == "cuda"
    assert check.draws == [("rand", "cpu", "cpu")]


def test_cpu_sampling_is_unchanged_by_the_device_rule(tiny_model_dir):
    """On a CPU model every draw is on the CPU, and the check itself changes no token."""
    from rloo.modeling.loading import load_policy

    model, tok = load_policy(str(tiny_model_dir))
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    kw = dict(max_new_tokens=4, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, k=2)
    plain = sampler.sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    check = DeviceCheck()
    with check:
        checked = sampler.sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    assert all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
    assert check.draws and all(g == t == "cpu" for _, g, t in check.draws)
