"""Mixed precision (rloo.runtime.precision): bf16 log-probs and gradients against fp32 on the same
tokens, with tolerances derived below (the probe's rule and what each dtype resolves to:
tests/unit/test_precision_rules.py).

Tolerance. bf16 keeps 8 significant bits: unit roundoff u = 2**-8. A matmul under autocast rounds
both operands to bf16 and accumulates in fp32, so each output y = sum_j a_j b_j is off by at most
2u * sum_j |a_j b_j| (first order). In a Llama block the residual stream gains an attention output
that went through 4 matmuls in sequence (q/k/v projection, q k^T, p v, o projection) and an MLP
output that went through 2 (gate/up, down); with sublayer outputs no larger than the stream, the
last hidden state carries at most 2u * 6 per layer relative error, plus 2u in the LM head:
    |delta z| <= (12 L + 2) u S,   S = max_{position, v} sum_j |h_j W_vj|  (measured in fp32)
and a log-prob lp = z_y - logsumexp(z) moves by at most 2 max|delta z| (logsumexp is 1-Lipschitz
in the max norm). The gradient goes through the same matmuls once more in backward, so its
relative error is bounded by twice the forward's relative factor: 2 (12 L + 2) u.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rloo.core.advantages import leave_one_out
from rloo.core.logprobs import sequence_logprobs
from rloo.core.losses import policy_gradient_loss
from rloo.modeling.forward import completion_logprobs
from rloo.runtime.precision import Precision, resolve_precision
from rloo.training.common import adamw

U = 2.0**-8
V, L, PAD = 64, 2, 0
N, P, T = 8, 6, 10

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]


def _policy(device):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(cfg).float().to(device)


def _batch(device):
    g = torch.Generator().manual_seed(0)
    p_ids, c_ids = torch.randint(2, V, (N, P), generator=g), torch.randint(2, V, (N, T), generator=g)
    p_mask = torch.ones(N, P, dtype=torch.bool)
    c_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (N,), generator=g)[:, None]
    return [x.to(device) for x in (p_ids, p_mask, c_ids, c_mask)]


def _bf16(device) -> Precision:
    """What dtype=bfloat16 is on `device`: bf16 autocast over fp32 weights (on CUDA too since issue 34)."""
    return resolve_precision("bfloat16", device)


def _logprobs(model, batch, prec: Precision | None):
    if prec is None:
        return completion_logprobs(model, *batch)
    m = model if prec.compute is not None else _copy_to(model, prec.weights)
    with prec.autocast():
        return completion_logprobs(m, *batch)


def _copy_to(model, dtype):
    return copy.deepcopy(model).to(dtype)


def _logit_scale(model, batch) -> float:
    """S of the module docstring: max over positions and tokens of sum_j |h_j W_vj|, in fp32."""
    p_ids, p_mask, c_ids, c_mask = batch
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    with torch.no_grad():
        h = model.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        return float((h.abs() @ model.lm_head.weight.abs().T).max())


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_logprobs_match_fp32_within_derived_tolerance(device):
    model, batch = _policy(device), _batch(device)
    with torch.no_grad():
        ref, low = _logprobs(model, batch, None), _logprobs(model, batch, _bf16(device))
    mask = batch[3]
    assert low.dtype == torch.float32, "log-probs leave the model in fp32"
    err = (low - ref)[mask].abs().max().item()
    bound = 2 * (12 * L + 2) * U * _logit_scale(model, batch)
    assert 0 < err <= bound, f"bf16 vs fp32 log-prob error {err:.2e} (bound {bound:.2e})"


@pytest.mark.parametrize("device", DEVICES)
def test_rloo_gradient_in_bf16_matches_fp32(device):
    """One RLOO step's gradient (eq. 4-5) on fixed tokens and rewards, bf16 vs fp32."""
    batch = _batch(device)
    advantages = leave_one_out(torch.randn(N // 4, 4, generator=torch.Generator().manual_seed(1))).view(-1)
    grads = []
    for prec in (None, _bf16(device)):
        model = _policy(device)
        if prec is not None and prec.compute is None:
            model = model.to(prec.weights)
        with prec.autocast() if prec is not None else torch.enable_grad():
            lp = completion_logprobs(model, *batch)
            loss, _ = policy_gradient_loss(sequence_logprobs(lp, batch[3]), advantages.to(device))
        loss.backward()
        grads.append(torch.cat([p.grad.float().flatten() for p in model.parameters()]))
        if prec is not None and prec.compute is not None:
            assert all(p.grad.dtype == torch.float32 for p in model.parameters()), "fp32 master gradients"
    rel = ((grads[1] - grads[0]).norm() / grads[0].norm()).item()
    assert 0 < rel <= 2 * (12 * L + 2) * U, f"relative gradient error {rel:.3f}"


def test_autocast_step_updates_fp32_masters_and_uses_the_new_weights():
    """Autocast caches a bf16 copy of each trainable weight for as long as its context is open; a
    forward after an optimizer step in the same context must use the stepped weights."""
    model, batch = _policy("cpu"), _batch("cpu")
    opt = adamw(model.parameters(), lr=1e-2)
    with _bf16("cpu").autocast():
        completion_logprobs(model, *batch).sum().backward()
        opt.step()
        after_in_context = completion_logprobs(model, *batch).detach()
    with _bf16("cpu").autocast():
        fresh = completion_logprobs(model, *batch).detach()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s.dtype == torch.float32 for st in opt.state.values() for s in st.values() if s.dim())
    torch.testing.assert_close(after_in_context, fresh, rtol=0, atol=0)


def test_train_in_bf16_end_to_end(tiny_model_dir, tmp_path):
    """`rloo train dtype=bfloat16` on CPU: trains through autocast and saves fp32 weights."""
    from transformers import AutoModelForCausalLM

    from rloo import RLConfig, train

    cfg = RLConfig(
        policy=str(tiny_model_dir),
        output_dir=tmp_path / "run",
        steps=2,
        batch_size=2,
        k=2,
        max_new_tokens=5,
        lr=1e-3,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        dtype="bfloat16",
    )
    autocast_on = []

    def reward(prompts, completions):
        autocast_on.append(torch.is_autocast_enabled("cpu"))
        return [-len(c) / 10 for c in completions]

    result = train(cfg, prompts=["post : job rent tl;dr :"], reward_fn=reward)
    assert autocast_on and all(autocast_on), "the stage did not run under autocast"
    losses = [h["loss/policy"] for h in result.history if "loss/policy" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    saved = AutoModelForCausalLM.from_pretrained(result.model_path)
    assert next(saved.parameters()).dtype == torch.float32


def test_chunked_head_under_autocast_matches_the_full_head():
    """The chunked LM head (rloo.core.logprobs.head_token_logprobs) under autocast, its backward run
    outside autocast: Llama's final RMSNorm returns the (fp32) residual stream's dtype, so the head
    sees fp32 hidden states and fp32 master weights and autocast runs its matmul in bf16."""
    batch, out = _batch("cpu"), []
    for max_mb in (None, 1e-6):  # 1e-6 MB: chunks of one position
        model = _policy("cpu")
        with _bf16("cpu").autocast():
            kw = {} if max_mb is None else {"max_logits_mb": max_mb}
            lp = completion_logprobs(model, *batch, **kw)
        (lp * batch[3]).sum().backward()  # outside autocast, as torch recommends for backward
        out.append((lp.detach(), model.lm_head.weight.grad))
    assert out[1][1].dtype == torch.float32
    # both are bf16 matmuls of the same operands; only the fp32 accumulation order may differ
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=4 * U)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=4 * U, atol=4 * U * out[0][1].abs().max().item())
