"""Issue 32, item 4: the generation settings in the configs (typed, validated, one-line errors, in
--help-config), their path to every sampler (rollout keywords, vLLM's SamplingParams, multi-turn
refusals) and greedy evaluation (temperature=0 in eval, refused in training)."""

from __future__ import annotations

import pytest
import torch

from rloo import RLConfig
from rloo.config import EvalConfig, Sampling
from rloo.config.base import key_paths
from rloo.config.generation import truncating
from rloo.core.truncation import Truncation
from rloo.errors import ConfigError

KEYS = ("top_k", "min_new_tokens", "stop", "repetition_penalty")


def _rl(**kw):
    return RLConfig(policy="p", reward_fn="math:fsum", **kw)


def test_keys_are_typed_in_rl_and_eval_and_listed():
    rl_keys, eval_keys = set(key_paths(RLConfig)), set(key_paths(EvalConfig))
    for key in KEYS:
        assert key in rl_keys and f"eval.{key}" in rl_keys and key in eval_keys
    cfg = _rl(top_k=5, min_new_tokens=2, stop="###", repetition_penalty=1.2, eval={"stop": ["\n\n", "END"]})
    assert (cfg.top_k, cfg.min_new_tokens, cfg.stop, cfg.repetition_penalty) == (5, 2, ["###"], 1.2)
    assert cfg.eval.stop == ["\n\n", "END"]


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(top_k=-1), "top_k: Input should be greater than or equal to 0"),
        (dict(repetition_penalty=0), "repetition_penalty: Input should be greater than 0"),
        (dict(repetition_penalty=1e9), "repetition_penalty: Input should be less than or equal to 100"),
        (dict(stop=[""]), "stop.0: String should have at least 1 character"),
        (dict(stop=3), "stop: Input should be a valid list"),
        (dict(min_new_tokens=17), "min_new_tokens=17 exceeds max_new_tokens=16"),
        (dict(eval={"min_new_tokens": 17}), "eval.min_new_tokens=17 exceeds max_new_tokens=16"),
        (dict(temperature=0), "temperature=0 (greedy) is for evaluation only (eval.temperature=0)"),
        (dict(temperature=1e-30), "temperature: Input should be greater than or equal to 0.01"),
        (dict(eval={"temperature": 1e-3}), "Input should be greater than or equal to 0.01, or 0 for greedy"),
    ],
)
def test_bad_values_are_one_line_errors(kw, needle):
    with pytest.raises(ConfigError) as e:
        _rl(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_greedy_is_for_evaluation_only():
    """temperature=0: argmax decoding in every eval (rloo eval, the periodic and final evals), refused
    for training rollouts, whose k identical samples would give every advantage 0."""
    assert _rl(eval={"temperature": 0}).eval.temperature == 0
    assert EvalConfig(policy="p", temperature=0).temperature == 0
    with pytest.raises(ConfigError, match="every leave-one-out advantage is 0"):
        _rl(temperature=0)


@pytest.mark.parametrize("key,value", [("stop", ["x"]), ("min_new_tokens", 2), ("repetition_penalty", 1.1)])
def test_multi_turn_refuses_per_completion_settings(key, value):
    for kw, shown in (({key: value}, key), ({"eval": {key: value}}, f"eval.{key}")):
        with pytest.raises(ConfigError, match=f"env= \\(multi-turn\\) .* unset {shown} "):
            RLConfig(policy="p", env="calculator", **kw)
    assert RLConfig(policy="p", env="calculator", top_k=4, eval={"temperature": 0}).top_k == 4


def test_every_training_sampler_gets_the_settings():
    """`cfg.sampling` feeds the training step, the lagged sampler and the async producer; an eval
    section's `sampling` every evaluation, with the run's length limits."""
    cfg = _rl(
        top_k=3, min_new_tokens=2, stop=["a", "b"], repetition_penalty=1.3, top_p=0.9, temperature=0.7, max_new_tokens=9
    )
    want = dict(temperature=0.7, top_p=0.9, top_k=3, min_new_tokens=2, repetition_penalty=1.3, stop=("a", "b"))
    assert {k: getattr(cfg.sampling, k) for k in want} == want
    assert (cfg.sampling.max_new_tokens, cfg.sampling.max_prompt_tokens) == (9, cfg.max_prompt_tokens)
    assert cfg.sampling.share_prompt and not cfg.sampling.truncated_logprobs  # min_new_tokens: full log-probs
    assert _rl(top_k=3).sampling.truncated_logprobs  # logprobs_under unset: truncated where it can hold
    ev = _rl(eval={"temperature": 0, "top_k": 2}, max_new_tokens=7).eval_sampling
    assert (ev.top_k, ev.temperature, ev.max_new_tokens, ev.truncated_logprobs) == (2, 0, 7, False)


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_new_tokens=0),
        dict(temperature=0.001),
        dict(top_p=0.0),
        dict(top_k=-1),
        dict(repetition_penalty=0),
        dict(stop=("",)),
        dict(min_new_tokens=20),
    ],
)
def test_a_sampling_made_by_hand_is_checked_like_the_config(bad):
    """Sampling is built from a validated config, but tests and the API make it by hand too."""
    from rloo.config import Sampling

    with pytest.raises(ValueError):
        Sampling(**(dict(max_new_tokens=16, max_prompt_tokens=8) | bad))
    assert Sampling(16, 8, stop=["a"]).stop == ("a",)  # a list from a caller becomes the frozen tuple


def test_vllm_sampling_params_names():
    from rloo.config import Sampling
    from rloo.rollout.vllm import sampling_params

    plain = sampling_params(4, Sampling(16, 8), 2)
    assert plain == dict(n=4, temperature=1.0, top_p=1.0, max_tokens=16, stop_token_ids=[2], seed=None)
    s = Sampling(16, 8, 0.7, top_p=0.9, top_k=5, min_new_tokens=3, repetition_penalty=1.2, stop=("##",))
    shaped = sampling_params(4, s, 2)
    assert shaped == plain | dict(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_tokens=3,
        repetition_penalty=1.2,
        stop=["##"],
        include_stop_str_in_output=True,
    )


def test_off_policy_note_names_every_shaping_setting():
    from rloo.config import Sampling
    from rloo.rollout.decoding import off_policy_note

    assert off_policy_note(Sampling(16, 8)) is None
    shaped = Sampling(16, 8, top_p=0.9, top_k=5, min_new_tokens=2, repetition_penalty=1.1)
    note = off_policy_note(shaped)
    assert note is not None
    assert all(s in note for s in ("top_p=0.9", "top_k=5", "min_new_tokens=2", "repetition_penalty=1.1"))
    assert "Sampling settings and the log-probs" in note
    # logprobs_under=truncated trains the truncated distribution: top_p/top_k shape nothing away from it
    assert off_policy_note(Sampling(16, 8, top_p=0.9, top_k=5, truncated_logprobs=True)) is None


def test_greedy_evaluation_runs_and_measures_kl_at_temperature_one(tiny_model_dir):
    """eval at temperature 0: the same response twice whatever the noise, a KL to an identical reference
    of 0 (its log-probs are taken at temperature 1, not divided by 0)."""
    from rloo.eval.judge import evaluate_policy
    from rloo.modeling.loading import load_policy
    from rloo.tasks import get_task

    policy, tok = load_policy(str(tiny_model_dir))
    prompts = [e.prompt for e in get_task("summarize").examples("eval", 6, seed=0)]
    runs = [
        evaluate_policy(
            policy,
            tok,
            prompts,
            Sampling(5, 64, temperature=0.0),
            ref_model=policy,
            generator=torch.Generator().manual_seed(seed),
            keep_samples=6,
        )  # fmt: skip
        for seed in (0, 1)
    ]
    assert runs[0].samples == runs[1].samples
    assert runs[0].kl == pytest.approx(0.0, abs=1e-6)


def test_captured_decode_key():
    """rl.captured_decode: auto by default, a choice of three; on is the own sampler's."""
    assert _rl().captured_decode == "auto" and _rl(captured_decode="off").captured_decode == "off"
    with pytest.raises(ConfigError, match="captured_decode=on is rloo's own sampler's"):
        _rl(captured_decode="on", generation="vllm")
    with pytest.raises(ConfigError):
        _rl(captured_decode="yes")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_training_samplers_decode_as_rl_captured_decode_says(mode):
    """The training step's sampler and the lagged sampler / producer's (VersionSampler) build the
    captured step with captured_decode=on, and not with off (on CPU auto is off)."""
    from tests.equivalence.test_generation_settings import _bpe
    from tests.helpers.tiny_archs import tiny_lm

    from rloo.algorithms.base import Models
    from rloo.algorithms.common import sample_rollout
    from rloo.rollout import captured
    from rloo.rollout.versioned import VersionSampler

    tok = _bpe()
    cfg = _rl(captured_decode=mode, k=2, max_new_tokens=3)
    for run in (
        lambda m: sample_rollout(Models(m, m, tok, None), ["the cat"], cfg, torch.Generator()),
        lambda m: VersionSampler(cfg, tok)(m, 0, ["the cat"], torch.Generator()),
    ):
        model = tiny_lm("llama", tokenizer=tok).eval()
        run(model)
        assert bool(captured._STEPS.get(model)) == (mode == "on")


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.9), (3, 0.5)])
def test_the_truncation_is_read_from_the_sampling(top_k, top_p):
    """Whether top_k/top_p truncate, the truncation the trained log-probs use and the Hugging Face
    names of the draw come from one place (the Sampling, or its config section), as the plain
    comparison says."""
    cfg = _rl(top_k=top_k, top_p=top_p)
    s = cfg.sampling
    assert s.truncates == truncating(cfg) == (top_p < 1 or top_k > 0)
    assert Truncation.of(s) == Truncation.of(cfg) == Truncation(top_k=top_k, top_p=top_p)
    assert s.hf_draw() == {"temperature": 1.0, "top_p": top_p, "top_k": top_k}
