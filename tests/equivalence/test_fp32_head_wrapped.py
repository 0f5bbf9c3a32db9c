"""The fp32 LM head under bf16 autocast (issue 34) reaches the models rloo does not take apart: a policy
under DDP or FSDP2 (`rloo.runtime.distributed.Dist.wrap`, a one-rank gloo group), under PEFT LoRA (adapters
beside the head, or on it), and heads that are not exactly head(hidden): GPT-2's (tied to the input
embedding), Phi's (a bias), Gemma 2's (a final-logit soft cap). Each model is loaded by rloo's loader,
which gives the heads their fp32 forward (rloo.modeling.fp32_head) before any wrapper sees them; the
training pass, the sampler and a reward model's score then equal the same model's pure-fp32 numbers within
fp32's summation bound, and without autocast they are the same bits as an unpatched head.

Tolerance as in test_fp32_head.py: the sublayers add exactly 0 (tests/helpers/fp32_head_models.py), so
only the head's product and the log-softmax differ; a log-prob is off by at most eps S * 2 (H + V), S the
largest sum_j |h_j W_vj| + |b_v| (through LoRA's B A on the head; Gemma's tanh cap only shrinks
differences). Before this change these paths ran the head in bf16: errors of ~1e-2 against a bound ~1e-3.
"""

from __future__ import annotations

import pytest
import torch

from helpers.fp32_head_models import EOS, PAD, H, V, head_input, head_only_lm, head_scale
from rloo.config import Sampling
from rloo.modeling.forward import completion_logprobs, score_head
from rloo.rollout.sampler import sample_tokens
from tolerance import assert_close

B, K, P, T = 3, 2, 5, 6
# case -> (architecture, tied head, wrapper)
CASES = {
    "ddp": ("llama", False, "ddp"),
    "fsdp": ("llama", False, "fsdp"),
    "fsdp-tied": ("llama", True, "fsdp"),
    "lora": ("llama", False, "lora"),
    "lora-on-head": ("llama", False, "lora-head"),
    "gpt2-tied": ("gpt2", True, None),
    "phi-bias": ("phi", False, None),
    "gemma2-softcap": ("gemma2", False, None),
}


@pytest.fixture
def gloo_group(tmp_path):
    import torch.distributed as tdist

    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    yield
    tdist.destroy_process_group()


def _batch():
    """Prompts (B*K rows, one left-padded) and completions of random lengths."""
    g = torch.Generator().manual_seed(1)
    ids, mask = torch.randint(2, V, (B, P), generator=g), torch.ones(B, P, dtype=torch.bool)
    mask[0, :2] = False
    p_ids, p_mask = ids.masked_fill(~mask, PAD).repeat_interleave(K, 0), mask.repeat_interleave(K, 0)
    c_ids = torch.randint(2, V, (B * K, T), generator=g)
    c_mask = torch.arange(T)[None] < torch.randint(1, T + 1, (B * K,), generator=g)[:, None]
    return p_ids, p_mask, c_ids, c_mask


def _lora(model, on_head: bool):
    """LoRA on q and v (beside the zero output projections: the body still adds 0), and on the head when
    asked; B drawn nonzero so that the adapters change the numbers."""
    from rloo.config import LoraSettings
    from rloo.modeling.lora import add_lora

    targets = ["q_proj", "v_proj"] + (["lm_head"] if on_head else [])
    model = add_lora(model, LoraSettings(r=4, alpha=8, target_modules=targets))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    return model.eval()


def _case(name: str, tmp_path):
    """(the model of case `name`, wrapped as the case says, S of its head over `_batch()`'s rows)."""
    from rloo.runtime.distributed import Dist

    arch, tied, wrap = CASES[name]
    model = head_only_lm(tmp_path / "model", arch, tied)
    if wrap in ("lora", "lora-head"):
        model = _lora(model, wrap == "lora-head")
    p_ids, p_mask, c_ids, c_mask = _batch()
    scale = head_scale(model, torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1))
    n_params = len(list(model.parameters()))
    if wrap in ("ddp", "fsdp"):
        model = Dist(rank=0, world=2, parallel=wrap).wrap(model)  # `enabled` over the one-rank group
    inner = model.module if wrap == "ddp" else model
    head, embed = inner.get_output_embeddings(), inner.get_input_embeddings()
    assert (head.weight is embed.weight) == tied and len(list(model.parameters())) == n_params  # tie kept
    return model, scale


@pytest.mark.parametrize("name", CASES)
def test_training_pass_under_bf16_autocast_is_the_fp32_heads(name, tmp_path, gloo_group):
    model, scale = _case(name, tmp_path)
    p_ids, p_mask, c_ids, c_mask = _batch()
    with torch.no_grad():
        ref = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    assert got.dtype == torch.float32
    assert_close(got[c_mask], ref[c_mask], 2 * (H + V), scale=scale, msg=f"{name}: log-probs under bf16 autocast")


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_head_gradient_through_ddp_and_fsdp_under_bf16_autocast_is_the_fp32_heads(name, tmp_path, gloo_group):
    """Through the wrappers' own backward (DDP's reducer, FSDP2's reduce-scatter): the head's weight
    gradient sum_i dz_i h_i^T against the fp32 one, bound as in test_fp32_head.py: n eps * 2 max_j
    sum_i |h_ij| from the sum over n positions, plus the dz's own error 2 (H + V) eps S times sum_i |h_ij|."""
    model, scale = _case(name, tmp_path)
    p_ids, p_mask, c_ids, c_mask = _batch()
    inner = model.module if name == "ddp" else model

    def head_grad(autocast: bool):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            lp = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        lp[c_mask].sum().backward()
        g = inner.get_output_embeddings().weight.grad
        return (g.full_tensor() if hasattr(g, "full_tensor") else g).clone()

    ref, got = head_grad(False), head_grad(True)
    h = head_input(inner, torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1))[:, -T - 1 : -1]
    h_sum, n = float(h.abs().sum((0, 1)).max()), int(c_mask.sum())
    assert_close(got, ref, 1.0, scale=2 * h_sum * (n + (H + V) * scale), msg=f"{name}: head gradient")


@pytest.mark.parametrize("name", [n for n, (_, tied, wrap) in CASES.items() if wrap != "ddp" and not tied])
def test_sampler_under_bf16_autocast_is_the_fp32_heads(name, tmp_path, gloo_group):
    """The sampler runs the model itself under FSDP, PEFT and for the non-plain heads (under DDP it runs
    the unwrapped module: a plain head, test_fp32_head.py): its stored log-probs, the first PPO ratio's
    numerator, against a pure-fp32 pass over the tokens it drew. Not the tied cases: there h is the
    normed embedding of the last token and its own logit |w|^2 / rms(w) ~ 32, so every draw repeats it
    with log-prob ~ -1e-7 and no rounding shows (they passed before this change); the training pass,
    on random tokens, covers them."""
    model, _ = _case(name, tmp_path)
    p_ids, p_mask = _batch()[:2]
    ids, mask = p_ids[::K], p_mask[::K]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gen = torch.Generator().manual_seed(2)
        c_ids, c_mask, lps = sample_tokens(
            model, ids, mask, Sampling(T, ids.shape[1]), eos_id=EOS, pad_id=PAD, k=K, generator=gen
        )
    with torch.no_grad():
        ref = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
    scale = head_scale(model, torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1))
    assert_close(lps[c_mask], ref[c_mask], 2 * (H + V), scale=scale, msg=f"{name}: sampler log-probs")


@pytest.mark.parametrize("name", [n for n, (_, _, wrap) in CASES.items() if wrap not in ("ddp", "fsdp")])
def test_float32_runs_compute_the_unpatched_heads_bits(name, tmp_path):
    """Without autocast the fp32 head's forward is nn.Linear's: logits and every gradient equal an
    unpatched model's bit for bit; the decode steps' swapped product (rloo.modeling.few_rows) still
    reaches the head and gives it back its fp32 forward."""
    from rloo.modeling.few_rows import few_rows_linears
    from rloo.modeling.fp32_head import is_fp32_head

    model, _ = _case(name, tmp_path)
    heads = [m for m in model.modules() if is_fp32_head(m)]
    assert heads and all(type(m) is torch.nn.Linear for m in heads)
    with few_rows_linears(model) as n:
        assert n >= len(heads) and not any(is_fp32_head(m) for m in heads)
    assert all(is_fp32_head(m) for m in heads)
    p_ids, p_mask, c_ids, c_mask = _batch()  # eval mode (no dropout), gradients on

    def run():
        model.zero_grad()
        lp = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        lp[c_mask].sum().backward()
        return [lp.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    patched = run()
    for m in heads:
        del m.forward
    plain = run()
    assert len(patched) == len(plain) > 1 and all(torch.equal(a, b) for a, b in zip(patched, plain, strict=True))


def test_reward_score_of_a_peft_reward_model_under_bf16_autocast_is_the_fp32_heads(tmp_path):
    """PEFT keeps a sequence classifier's `score` as a trained copy (modules_to_save), which
    `score_head` calls through its own forward: the copy keeps the fp32 forward. One output, a sum of H
    products: off by at most eps H S, S = max_i sum_j |h_ij w_j| + |b|."""
    import peft
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rloo.modeling.loading import load_reward_model
    from rloo.tasks import get_task
    from rloo.tasks.tokenizer import build_tokenizer

    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=1, num_attention_heads=4,
                      num_labels=1, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    rm = LlamaForSequenceClassification(cfg)
    with torch.no_grad():
        rm.score.weight.normal_(0.0, 0.5)
    rm.save_pretrained(tmp_path / "rm")
    build_tokenizer(get_task("summarize")).save_pretrained(tmp_path / "rm")
    rm = load_reward_model(str(tmp_path / "rm"))[0]
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS")
    wrapped = peft.get_peft_model(rm, lora).eval()
    assert type(wrapped.score) is not torch.nn.Linear  # PEFT's wrapper: score_head takes its forward
    pooled = torch.randn(16, H, generator=torch.Generator().manual_seed(3))
    ref = score_head(wrapped, pooled)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = score_head(wrapped, pooled)
    scale = float((pooled.abs() @ rm.score.weight.abs().t()).max())
    assert got.dtype == torch.float32
    assert_close(got, ref, H, scale=scale, msg="PEFT reward scores under bf16 autocast")


def test_a_pickled_or_copied_model_keeps_its_fp32_head():
    # the async producer receives the policy pickled into another process: a bound-method forward
    # pickled as getattr(head, "fp32_head_forward") and the child failed with AttributeError
    import copy
    import pickle

    from transformers import LlamaConfig, LlamaForCausalLM

    from rloo.modeling.fp32_head import is_fp32_head, use_fp32_heads

    arch = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1)
    model = use_fp32_heads(LlamaForCausalLM(LlamaConfig(**arch, num_attention_heads=2, num_key_value_heads=2)))
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        head = other.get_output_embeddings()
        assert is_fp32_head(head) and head.forward.args[0] is head  # bound to its own copy
        assert torch.equal(other(ids).logits, model(ids).logits)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert other(ids).logits.dtype == torch.float32
