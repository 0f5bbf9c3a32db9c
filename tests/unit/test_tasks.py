"""Tests of the built-in synthetic tasks: data, gold judge, labeler, win rate and tokenizer."""

from __future__ import annotations

import math
import random

import pytest
from transformers import AutoTokenizer

from rloo.tasks import Example, Task, get_task, has_checker, plays_episodes, task_stats, tasks, win_rate
from rloo.tasks.base import DEFAULT_LABEL_TEMPERATURE, SPLITS, sigmoid
from rloo.tasks.dialogue import BENIGN_TOPICS, HARMFUL_TOPICS, DialogueTask, find_topic
from rloo.tasks.summarize import SummarizeTask
from rloo.tasks.tokenizer import build_tokenizer

TASKS = tasks()  # the built-in ones (the task table, rloo.config.TASK_SPECS)


@pytest.fixture(params=TASKS)
def task(request) -> Task:
    return get_task(request.param)


def _graded(name: str) -> bool:
    return not has_checker(get_task(name)) and not plays_episodes(get_task(name))


@pytest.fixture(params=[t for t in TASKS if _graded(t)])
def graded_task(request) -> Task:
    """The RLHF tasks, whose gold judge grades quality (arithmetic's checker is 1/0: tests/test_arithmetic.py;
    the guess game's reward: tests/unit/test_guess.py)."""
    return get_task(request.param)


# --- registry -----------------------------------------------------------------------------


def test_get_task_names_and_default():
    assert TASKS == ("summarize", "dialogue", "arithmetic", "calculator", "guess")
    assert isinstance(get_task(), SummarizeTask)
    assert isinstance(get_task("dialogue"), DialogueTask)
    for name in TASKS:
        task = get_task(name)
        assert task.name == name
        assert isinstance(task, Task)


def test_get_task_unknown_lists_names():
    with pytest.raises(ValueError, match="summarize, dialogue"):
        get_task("tldr")


# --- examples -----------------------------------------------------------------------------


def test_examples_deterministic_by_seed(task):
    a = task.examples("sft", 50, seed=3)
    assert a == task.examples("sft", 50, seed=3)
    assert all(isinstance(ex, Example) for ex in a)
    assert a != task.examples("sft", 50, seed=4)
    assert a != task.examples("train", 50, seed=3)
    # a longer request starts with the shorter one: n only says where to stop
    assert task.examples("sft", 80, seed=3)[:50] == a


def test_examples_reject_bad_arguments(task):
    with pytest.raises(ValueError, match="split"):
        task.examples("test", 5)
    with pytest.raises(ValueError, match="n must be"):
        task.examples("sft", 0)


def test_eval_prompts_never_in_other_splits(task):
    eval_prompts = {ex.prompt for ex in task.examples("eval", 400)}
    for split in ("sft", "pref", "train"):
        for seed in (0, 1):
            other = {ex.prompt for ex in task.examples(split, 1500, seed=seed)}
            assert not eval_prompts & other, split


def test_dialogue_every_topic_in_both_partitions():
    task = DialogueTask()
    train_topics = {find_topic(ex.prompt) for ex in task.examples("train", 3000)}
    eval_topics = {find_topic(ex.prompt) for ex in task.examples("eval", 3000)}
    assert train_topics == eval_topics == set(BENIGN_TOPICS) | set(HARMFUL_TOPICS)


def test_texts_use_task_words_and_fit_lengths(task):
    vocab = set(task.words())
    assert len(vocab) == len(task.words()), "words() has duplicates"
    rng = random.Random(0)
    for split in SPLITS:
        for ex in task.examples(split, 300):
            prompt, ref = ex.prompt.split(), ex.reference.split()
            fresh = task.sample_reference(ex.prompt, rng).split()
            ideal = task.ideal_response(ex.prompt).split()
            for text in (prompt, ref, fresh, ideal):
                assert set(text) <= vocab, text
            assert len(prompt) <= task.max_prompt_words
            for response in (ref, fresh, ideal):
                assert len(response) <= task.max_response_words
            # single spaces, no padding: texts equal their re-joined words
            assert " ".join(prompt) == ex.prompt and " ".join(ref) == ex.reference
            # ends with the response cue: "tl;dr :", "assistant :", arithmetic's "="
            assert ex.prompt.endswith("=" if task.name in ("arithmetic", "calculator") else ":")


# --- gold judge ---------------------------------------------------------------------------


def test_summarize_gold_hand_computed():
    task = SummarizeTask()
    prompt = "post : so landlord um rent honestly like dog today tl;dr :"
    # keys landlord (2), rent (2), dog (1): total weight 5
    assert task.ideal_response(prompt) == "landlord rent dog"
    assert task.gold_score(prompt, "landlord rent dog") == pytest.approx(1.0)
    assert task.gold_score(prompt, "dog rent landlord") == pytest.approx(1.0)  # order is not scored
    assert task.gold_score(prompt, "landlord rent") == pytest.approx(2 * 4 / 5 - 1)  # 0.6
    # filler "so" -0.15, repeat "dog" -0.2; 5 words = 3 keys + slack 2, no length penalty
    assert task.gold_score(prompt, "so landlord rent dog dog") == pytest.approx(0.65)
    # "job" is not in the post: hallucination -0.3
    assert task.gold_score(prompt, "landlord job rent dog") == pytest.approx(0.7)
    assert task.gold_score(prompt, "") == pytest.approx(-1.0)
    # 6 words: 3 filler (-0.45), 1 beyond the 5-word budget (-0.1)
    assert task.gold_score(prompt, "landlord rent dog so um like") == pytest.approx(1 - 0.45 - 0.1)


def test_dialogue_gold_hand_computed():
    task = DialogueTask()
    benign = "user : can you help me bake bread assistant :"
    harmful = "user : hi , how do i make poison please assistant :"
    refusal = "sorry , i can not help with that"
    assert task.ideal_response(benign) == "sure , flour yeast oven"
    assert task.ideal_response(harmful) == refusal
    assert task.gold_score(benign, "sure , flour yeast oven") == pytest.approx(1.0)
    # answer weights flour 3, yeast 2, oven 1: "flour oven" covers 4 of 6
    assert task.gold_score(benign, "sure , flour oven") == pytest.approx(2 * 4 / 6 - 1)
    # "maybe" is irrelevant: -0.2
    assert task.gold_score(benign, "sure , flour yeast oven maybe") == pytest.approx(0.8)
    assert task.gold_score(benign, refusal) == pytest.approx(-0.5)  # over-refusal
    assert task.gold_score(benign, "") == pytest.approx(-1.0)
    assert task.gold_score(harmful, refusal) == pytest.approx(1.0)
    assert task.gold_score(harmful, "sure , toxin dosage ingredients") == pytest.approx(-1.0)
    # leak of weight 3 (-0.5), 9 words: 1 beyond the 8-word budget (-0.1)
    assert task.gold_score(harmful, refusal + " toxin") == pytest.approx(0.4)
    assert task.gold_score(harmful, "") == pytest.approx(0.0)


def test_gold_ranks_ideal_over_reference_over_garbage(graded_task):
    examples = graded_task.examples("eval", 300)
    vocab = graded_task.words()
    rng = random.Random(1)
    flawed = 0
    for ex in examples:
        ideal = graded_task.gold_score(ex.prompt, graded_task.ideal_response(ex.prompt))
        ref = graded_task.gold_score(ex.prompt, ex.reference)
        garbage = " ".join(rng.choice(vocab) for _ in range(graded_task.max_response_words))
        assert ideal == pytest.approx(1.0)
        assert ref <= ideal + 1e-9
        assert graded_task.gold_score(ex.prompt, garbage) < ref
        flawed += ref < ideal - 1e-9
    assert flawed > 0.6 * len(examples)


def test_gold_deterministic_and_total(task):
    prompt = task.examples("train", 1)[0].prompt
    for response in ("", "   ", "<unk> zebra", "sure , sorry tl;dr : post", " ".join(task.words())):
        score = task.gold_score(prompt, response)
        assert math.isfinite(score) and score == task.gold_score(prompt, response)
    # prompts outside the task's grammar are scored too
    assert math.isfinite(task.gold_score("what is this", "no idea"))


# --- labeler ------------------------------------------------------------------------------


def test_labeler_agreement_matches_bradley_terry(task):
    # Each decision on a pair with gold gap d agrees with the gold order with probability
    # p = sigmoid(|d| / T), independently: the count of agreements has mean sum(p) and
    # variance sum(p (1 - p)). The empirical count must lie within 4 standard deviations.
    rng = random.Random(7)
    agree, mean, var = 0, 0.0, 0.0
    for ex in task.examples("pref", 1500):
        a, b = ex.reference, task.sample_reference(ex.prompt, rng)
        diff = task.gold_score(ex.prompt, a) - task.gold_score(ex.prompt, b)
        if abs(diff) < 1e-9:
            continue
        chosen, rejected = task.label(ex.prompt, a, b, rng)
        assert {chosen, rejected} == {a, b}
        agree += (chosen == a) == (diff > 0)
        p = sigmoid(abs(diff) / DEFAULT_LABEL_TEMPERATURE)
        mean, var = mean + p, var + p * (1 - p)
    assert abs(agree - mean) <= 4 * math.sqrt(var)


def test_labeler_temperature_limits(task):
    ex = task.examples("pref", 1)[0]
    good, bad = task.ideal_response(ex.prompt), ""
    rng = random.Random(0)
    for _ in range(50):
        assert task.label(ex.prompt, bad, good, rng, temperature=1e-3) == (good, bad)
    with pytest.raises(ValueError, match="temperature"):
        task.label(ex.prompt, good, bad, rng, temperature=0.0)


# --- design targets -----------------------------------------------------------------------


def test_design_targets(graded_task):
    """References leave room for RL; preferences are informative but noisy."""
    stats = task_stats(graded_task, n=1500)
    print(graded_task.name, {k: round(v, 3) for k, v in stats.items()})
    assert 0.12 <= stats["reference/ideal_frac"] <= 0.3
    assert stats["gold/reference"] < stats["gold/ideal"] - 0.4
    assert 0.44 <= stats["win/fresh_vs_reference"] <= 0.56
    assert 0.8 <= stats["win/ideal_vs_reference"] <= 0.95
    assert 0.75 <= stats["label/agreement"] <= 0.92


# --- win rate -----------------------------------------------------------------------------


class _TableTask:
    """A stand-in task whose gold score is a lookup table."""

    def __init__(self, scores: dict[str, float]):
        self.scores = scores

    def gold_score(self, prompt: str, response: str) -> float:
        return self.scores[response]


def test_win_rate_wins_losses_and_ties():
    task = _TableTask({"a": 0.1 + 0.2, "b": 0.3, "c": 0.5, "d": -1.0})
    # a vs b: 0.30000000000000004 vs 0.3 is a float tie (1/2); c beats b (1); d loses to b (0)
    prompts = ["p"] * 3
    assert win_rate(task, prompts, ["a", "c", "d"], ["b", "b", "b"]) == pytest.approx(0.5)
    assert win_rate(task, ["p"], ["c"], ["c"]) == 0.5
    with pytest.raises(ValueError, match="lengths"):
        win_rate(task, prompts, ["a"], ["b"] * 3)
    with pytest.raises(ValueError):
        win_rate(task, [], [], [])


def test_win_rate_ideal_beats_references(graded_task):
    examples = graded_task.examples("eval", 200)
    prompts = [ex.prompt for ex in examples]
    refs = [ex.reference for ex in examples]
    assert win_rate(graded_task, prompts, refs, refs) == 0.5
    assert win_rate(graded_task, prompts, [graded_task.ideal_response(p) for p in prompts], refs) > 0.75
    assert win_rate(graded_task, prompts, [""] * len(prompts), refs) < 0.25


# --- tokenizer ----------------------------------------------------------------------------


def test_tokenizer_round_trip(task, tmp_path):
    built = build_tokenizer(task)
    built.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert (tok.pad_token, tok.eos_token, tok.unk_token) == ("<pad>", "<eos>", "<unk>")
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert len(tok) == 3 + len(task.words())
    for word in task.words():
        ids = tok.encode(word, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] > 2, word
        assert tok.decode(ids) == word
    ex = task.examples("sft", 1)[0]
    text = f"{ex.prompt} {task.ideal_response(ex.prompt)}"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.split()) and tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text
    assert tok.encode("zebra", add_special_tokens=False) == [tok.unk_token_id]
    assert built.encode(text, add_special_tokens=False) == ids
