"""Issue 55: the captured decode step's weights and what it shares with the eager loop beyond the
step: new weights reach a step built with the old ones (an optimizer step updates them in place; a
rebound parameter, as a merged LoRA or a cast copy makes, is copied into the captured storage), LoRA
adapters, and stop strings checked by the host every few steps. A CUDA graph reads its weights from
the addresses it captured; on CPU the step reads them through the tensors it holds (torch.func
.functional_call), so a rebinding refresh fails here as a graph would go stale there."""

from __future__ import annotations

import pytest
import torch
from tests.equivalence.test_captured_decode import CUDA, _prompts, _sample, assert_same_rollout
from tests.equivalence.test_generation_settings import _bpe, _mid_token_stop
from tests.helpers.tiny_archs import tiny_lm

from rloo.config import Sampling
from rloo.rollout import captured, sampler
from rloo.rollout.captured_step import CapturedStep, weight_refs
from tolerance import TINY_MODEL_FORWARD, assert_close


def _new_weights(model, how: str) -> None:
    """Every parameter moved by seeded noise: in place (as an optimizer step), or rebound to a new
    tensor (as a LoRA merge or a cast sampling copy would)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                delta = (0.3 * torch.randn(p.shape, generator=g)).to(p.device)
                if how == "in_place":
                    p.add_(delta)
                else:
                    setattr(module, name, torch.nn.Parameter(p.detach() + delta))


def _the_step(model) -> CapturedStep:
    (step,) = captured._STEPS[model].values()
    return step


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("how", ["in_place", "rebound"])
def test_a_step_built_before_a_weight_update_samples_with_the_new_weights(device, how):
    model = tiny_lm("llama").to(device).eval()
    ids, mask = _prompts(device)
    before = _sample(model, ids, mask, "on")
    step = _the_step(model)
    assert (step.graph is not None) == (device == "cuda")
    _new_weights(model, how)
    want = _sample(model, ids, mask, "off")
    got = _sample(model, ids, mask, "on")
    assert _the_step(model) is step, "the step was rebuilt, not reused"
    assert not torch.equal(before[0], want[0]), "the update changed no token: the test would not see stale weights"
    assert_same_rollout(got, want)


def test_a_refresh_that_rebinds_is_refused(monkeypatch):
    """The trap of sglang #4961: a captured tensor replaced instead of written leaves a graph reading
    the old storage. The step refuses to run rather than sample from stale weights."""

    def rebinding_refresh(self, model):
        for name, t in weight_refs(model).items():
            self.weights[name] = t
        self.check()

    model = tiny_lm("llama").eval()
    ids, mask = _prompts()
    _sample(model, ids, mask, "on")
    _new_weights(model, "rebound")
    monkeypatch.setattr(CapturedStep, "refresh", rebinding_refresh)
    with pytest.raises(RuntimeError, match="was rebound after capture"):
        _sample(model, ids, mask, "on")


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_lora_adapters_and_their_merge(device):
    """A PEFT model (adapters on q/v, B nonzero) decodes as the eager loop does; after an in-place
    update of the adapters, and after merging them into the base weights (a new step: the merge is
    PEFT's Python state, which a graph bakes in), still."""
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = peft.get_peft_model(tiny_lm("llama"), cfg).to(device).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    ids, mask = _prompts(device)
    assert_same_rollout(_sample(model, ids, mask, "on"), _sample(model, ids, mask, "off"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.mul_(-1.5)
    assert_same_rollout(_sample(model, ids, mask, "on"), _sample(model, ids, mask, "off"))
    model.merge_adapter()  # PEFT now skips the adapters' product: a graph captured before would add it twice
    assert_same_rollout(_sample(model, ids, mask, "on"), _sample(model, ids, mask, "off"))
    assert len(captured._STEPS[model]) == 2, "the step captured before the merge was reused after it"


@pytest.mark.parametrize("min_new", [0, 4])
def test_stop_strings_checked_every_few_steps_end_rows_where_the_eager_loop_does(min_new):
    """Stop strings (one inside a token) end rows at the token the eager loop ends them at, also rows
    whose stop lies several steps before the host's next look; later tokens padding, masked."""
    tok = _bpe()
    model = tiny_lm("llama", tokenizer=tok).eval()
    prompts, k, n = ["the cat sat", "a dog ran to the"], 3, 6
    s = Sampling(20, 8, min_new_tokens=min_new)
    free = sampler.rollout(model, tok, prompts, k, s, generator=torch.Generator().manual_seed(1), rows=(0, n))
    rows = [free.completion_ids[i][free.completion_mask[i]].tolist() for i in range(n)]
    s = s.replace(stop=(_mid_token_stop(tok, rows[0]), tok.decode(rows[3][:11])[-2:]))
    eager, got = (
        sampler.rollout(model, tok, prompts, k, s, generator=torch.Generator().manual_seed(1), rows=(0, n), captured=c)
        for c in ("off", "on")
    )
    ends = eager.completion_mask.sum(-1)
    assert bool(((ends < free.completion_mask.sum(-1)) & (ends > 2)).any()), "no stop string cut a row after a look"
    assert torch.equal(got.completion_ids, eager.completion_ids)
    assert torch.equal(got.completion_mask, eager.completion_mask)
    assert torch.equal(got.truncated, eager.truncated) and got.completions == eager.completions
    assert_close(got.logprobs, eager.logprobs, TINY_MODEL_FORWARD)


def test_the_captured_step_does_not_keep_its_model_alive():
    """Steps are kept per model (weakly): an evaluated policy that is dropped frees its step's cache."""
    import gc
    import weakref

    model = tiny_lm("llama").eval()
    ids, mask = _prompts()
    _sample(model, ids, mask, "on", steps=3)
    gone = weakref.ref(model)
    assert captured._STEPS.get(model)
    del model
    gc.collect()
    assert gone() is None
