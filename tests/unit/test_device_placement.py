"""Where the CUDA paths put their tensors, checked without a GPU (issue 34): fake CUDA tensors
(FakeTensorMode) and a check on every generator-taking call (tests/helpers/device_check.py)."""

from __future__ import annotations

import pytest
import torch
from tests.helpers.device_check import DeviceCheck, fake_cuda

from rloo.config import Sampling
from rloo.rollout import sampler


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampler_draws_cuda_tokens_without_a_cpu_generator_on_cuda_tensors(top_p):
    """The loop's generator is a CPU one; on a CUDA model the sampler drew its race noise with it
    (`exponential_(generator=cpu)` on a CUDA tensor), which CUDA refuses before step 1."""
    gen = torch.Generator().manual_seed(0)
    check = DeviceCheck(strip=True)
    with fake_cuda(), check:
        logits = torch.randn(6, 11, device="cuda")
        tok, lp = sampler._next_token(logits, Sampling(1, 1, 0.7, top_p=top_p), gen, None)
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
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, k=2)
    s = Sampling(4, 3)
    plain = sampler.sample_tokens(model, ids, mask, s, generator=torch.Generator().manual_seed(3), **kw)
    check = DeviceCheck()
    with check:
        checked = sampler.sample_tokens(model, ids, mask, s, generator=torch.Generator().manual_seed(3), **kw)
    assert all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
    assert check.draws and all(g == t == "cpu" for _, g, t in check.draws)


# ---- collectives: a one-process gloo group stands in for NCCL ----------------------------------


@pytest.fixture
def gloo_group(tmp_path):
    import torch.distributed as tdist

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    tdist.destroy_process_group()


class _Reached(Exception):
    """The collective was called with its tensor on the communication device (where the test stops)."""


def _checked_all_reduce(monkeypatch, comm: torch.device, stop: bool) -> list[torch.device]:
    """Replace the all_reduce rloo.runtime.distributed calls with one that asserts its tensor is on
    `comm`, the patched communication device; `stop`: raise _Reached there (a meta stand-in for CUDA
    cannot be reduced or read back)."""
    from rloo.runtime import distributed

    real, seen = distributed.dist.all_reduce, []

    def all_reduce(t, *a, **kw):
        seen.append(t.device)
        assert t.device == comm, f"collective got a tensor on {t.device}, the group communicates on {comm}"
        if stop:
            raise _Reached
        return real(t, *a, **kw)

    monkeypatch.setattr(distributed, "comm_device", lambda: comm, raising=False)  # raising: old code had none
    monkeypatch.setattr(distributed.dist, "all_reduce", all_reduce)
    return seen


def test_collectives_put_their_tensors_on_the_communication_device(gloo_group, monkeypatch):
    """Under NCCL the communication device is the GPU (CPU tensors: "No backend type associated
    with device type cpu", every torchrun run at step 1). The meta device stands in for it."""
    from rloo.runtime.distributed import Dist

    d = Dist(rank=0, world=2)  # `enabled`: the one-rank group is only there for the calls to reach
    _checked_all_reduce(monkeypatch, torch.device("meta"), stop=True)
    with pytest.raises(_Reached):
        d.mean_metrics({"loss": 1.0, "kl": 0.5})
    with pytest.raises(_Reached):
        d.all_done(torch.tensor([True, False]))


def test_collectives_through_gloo_on_its_own_device(gloo_group, monkeypatch):
    from rloo.runtime import distributed

    assert distributed.comm_device() == torch.device("cpu")  # gloo's
    d = distributed.Dist(rank=0, world=2)  # a one-rank sum, halved: the round trip, not two ranks' arithmetic
    seen = _checked_all_reduce(monkeypatch, torch.device("cpu"), stop=False)
    assert d.mean_metrics({"a": 3.0, "b": -1.0}) == {"a": 1.5, "b": -0.5}
    assert d.all_done(torch.tensor([True, True])) is True
    assert d.all_done(torch.tensor([True, False])) is False
    assert seen == [torch.device("cpu")] * 3


def test_nccl_communicates_on_this_process_gpu(monkeypatch):
    from rloo.runtime import distributed

    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert distributed.comm_device() == torch.device("cuda", 3)


# ---- the weight guard's memory ------------------------------------------------------------------


def test_guard_norms_make_no_fp32_copies():
    """total_norm made an fp32 copy of every bf16 weight and moment at once (`.float()` then
    `_foreach_norm`): ~80 GB of temporaries for a 7B model's step. Now one fp32-accumulated norm per
    tensor: no op inside outputs more than a handful of numbers."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from rloo.runtime.paramguard import total_norm

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:  # new memory
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(64, 64, generator=gen).bfloat16() for _ in range(3)]
    with Largest():
        norm = total_norm(tensors)
    assert Largest.numel <= len(tensors)  # the per-tensor norms, stacked
    exact = torch.cat([t.double().flatten() for t in tensors]).norm().item()
    # fp32 accumulation of 12288 squares: relative error <= n * 2^-24 ~ 7e-4 (a bound, not a fit)
    assert abs(norm - exact) <= 12288 * 2**-24 * exact


# ---- checkpoints ----------------------------------------------------------------------------------


def test_cuda_random_state_is_saved_and_restored(monkeypatch):
    """Dropout on a GPU draws from the CUDA generator; its state was not in checkpoints."""
    from rloo.runtime.checkpoint import rng

    saved, restored = torch.arange(8, dtype=torch.uint8), []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a: saved.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, *a: restored.append(s))
    gen = torch.Generator().manual_seed(0)
    state = rng.rng_state(gen)
    assert torch.equal(state["cuda"], saved)
    rng.set_rng_state(state, gen)
    assert len(restored) == 1 and torch.equal(restored[0], saved)


def test_checkpoint_state_is_loaded_onto_the_cpu(tmp_path, monkeypatch):
    """Every rank loaded state.pt onto the device it was saved from (cuda:0): map_location='cpu'."""
    from rloo.runtime.checkpoint import verify as checkpoint_verify

    torch.save({"x": torch.ones(2)}, tmp_path / "state.pt")
    real, seen = torch.load, []
    monkeypatch.setattr(torch, "load", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    assert torch.equal(checkpoint_verify.load_state(tmp_path)["x"], torch.ones(2))
    assert seen and seen[0].get("map_location") == "cpu"


def test_an_interrupt_under_fsdp_does_not_promise_a_resume():
    """Under parallel=fsdp no checkpoint is written; Ctrl-C said "saved None ... --resume"."""
    import signal
    from types import SimpleNamespace

    from rloo.training import loop

    note = "parallel=fsdp: checkpoints are not written (only the final model)"
    ck = SimpleNamespace(save=lambda snap: None, snapshot=lambda step: {}, skip_note=note)
    msg = str(loop._interrupted(ck, signal.SIGINT, 3, 10))
    assert "None" not in msg and "resume" not in msg and "rerun from the start" in msg
    from rloo.errors import RlooError

    failed = str(loop._failed_step(ck, {}, 3, RlooError("boom")))
    assert "None" not in failed and "resume" not in failed
    ddp_rank1 = SimpleNamespace(save=lambda snap: None, snapshot=lambda step: {}, skip_note=None)
    assert "resume" in str(loop._interrupted(ddp_rank1, signal.SIGINT, 3, 10))


def test_fsdp_evaluation_stops_decoding_together(monkeypatch):
    """Under FSDP every decode step's forward is a collective: an evaluation whose processes stop
    at different steps hangs. The training loop's evaluation now samples with the shared stop."""
    from types import SimpleNamespace

    from rloo.config import EvalSettings
    from rloo.eval import sampling
    from rloo.runtime.distributed import Dist
    from rloo.training import evalset

    fsdp = Dist(rank=0, world=2, parallel="fsdp")
    assert fsdp.eval_kwargs() == {"all_done": fsdp.all_done}
    assert Dist(rank=0, world=2, parallel="ddp").eval_kwargs() == {} == Dist().eval_kwargs()
    seen = {}

    class Stop(Exception):
        pass

    def rollout(*a, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(sampling, "rollout", rollout)
    models = SimpleNamespace(policy=torch.nn.Linear(1, 1), tokenizer=None, scorer=None, ref=None, env=None)
    ev = EvalSettings(batch_size=4)
    cfg = SimpleNamespace(eval=ev, eval_sampling=ev.sampling(4, 8), seed=0, steps=1, eval_every=None)
    with pytest.raises(Stop):
        evalset.eval_metrics(models, evalset.EvalSet(["p"], None, None), cfg, 0, **fsdp.eval_kwargs())
    assert seen["all_done"] == fsdp.all_done


# ---- reward scores in fp32 ------------------------------------------------------------------------


def test_reward_scores_are_not_rounded_to_bf16_under_autocast(tiny_model_dir):
    """Under bf16 autocast the score head ran in bf16: scores rounded to 8 bits, so near-equal
    completions tied (false zero-variance groups). Now the head runs in fp32 on the pooled states."""
    from rloo.modeling.forward import reward_scores
    from rloo.modeling.loading import load_reward_model

    rm, _ = load_reward_model(str(tiny_model_dir))
    with torch.no_grad():
        rm.score.weight.mul_(1 + 2**-5)  # scores of a size whose bf16 rounding is visible
    p_ids = torch.tensor([[5, 6, 7]] * 4)
    c_ids = torch.tensor([[8, 9], [9, 8], [10, 11], [12, 13]])
    p_mask, c_mask = torch.ones_like(p_ids, dtype=torch.bool), torch.ones_like(c_ids, dtype=torch.bool)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        scores = reward_scores(rm, p_ids, p_mask, c_ids, c_mask)
        ids = torch.cat([p_ids, c_ids], 1)
        hidden = rm.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[:, -1]
    expected = hidden.float() @ rm.score.weight.float().T  # the same pooled states, an fp32 head
    assert scores.dtype == torch.float32
    # fp32 dot products of H terms in any order: |error| <= H * 2^-24 * sum_j |h_j w_j|
    bound = hidden.shape[-1] * 2**-24 * (hidden.float().abs() @ rm.score.weight.float().abs().T).squeeze(-1)
    assert ((scores - expected.squeeze(-1)).abs() <= bound).all()
    assert not torch.equal(scores, scores.bfloat16().float()), "scores are bf16-rounded"
