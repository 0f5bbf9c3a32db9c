"""The arithmetic task: its checker (hand-derived cases), problems, references and tokenizer."""

import collections

import pytest

from rloo.config import TASK_SPECS
from rloo.tasks import get_task, has_checker
from rloo.tasks.arithmetic import (
    KINDS,
    P_WRONG,
    answer,
    check,
    evaluate,
    held_out_count,
    kind_of,
    parse_answer,
    reward,
)
from rloo.tasks.tokenizer import build_tokenizer


@pytest.mark.parametrize(
    "expr, value",
    [
        ("3 + 5", 8),
        ("4 7 + 8", 55),
        ("6 * 7", 42),
        ("7 + 6 - 4", 9),
        ("1 + 2 - 9", -6),
        ("2 + 3 * 4", 14),
        ("2 * 3 - 4 * 5", -14),  # * binds tighter: 2 + 12; 6 - 20
    ],
)
def test_evaluate_by_hand(expr, value):
    assert evaluate(expr.split()) == value
    assert answer(f"q : {expr} =") == value


@pytest.mark.parametrize(
    "response, parsed",
    [
        ("ans 5 5", 55),
        ("4 7 + 8 = 5 5 ans 5 5", 55),  # worked form: the number after the last ans
        ("ans 1 2 ans 5 5", 55),
        ("ans - 3", -3),
        ("ans 0 7", 7),  # a leading zero still reads as 7
        ("5 5", None),  # no ans
        ("ans", None),  # no digits
        ("ans 5 5 +", None),  # something after the number
        ("ans 5 - 5", None),
        ("ans -", None),
        ("", None),
    ],
)
def test_parse_answer_by_hand(response, parsed):
    assert parse_answer(response) == parsed


def test_check_is_one_for_the_right_final_answer_only():
    p = "q : 4 7 + 8 ="
    assert check(p, "ans 5 5") == 1.0
    assert check(p, "4 7 + 8 = 5 4 ans 5 5") == 1.0  # a wrong step does not matter, the final answer does
    assert check(p, "4 7 + 8 = 5 5 ans 5 4") == 0.0
    assert check(p, "ans 5 5 5") == 0.0
    assert check(p, "5 5") == 0.0  # unparseable scores 0 like a wrong answer
    assert check("what is this", "ans 1") == 0.0  # not a problem: nothing to check
    assert reward([p, p], ["ans 5 5", "ans 5"]) == [1.0, 0.0]


def test_task_is_scored_by_its_checker():
    task = get_task("arithmetic")
    assert has_checker(task) and not has_checker(get_task("summarize"))
    for ex in task.examples("train", 200):
        assert task.gold_score(ex.prompt, ex.reference) == check(ex.prompt, ex.reference)
        assert task.gold_score(ex.prompt, task.ideal_response(ex.prompt)) == 1.0
    module, fn = TASK_SPECS["arithmetic"].checker.split(":")
    assert fn == "reward" and module == "rloo.tasks.arithmetic"


def test_references_have_mixed_correctness_by_kind_and_worked_forms():
    # 6000 references: per kind the wrong share is P_WRONG[kind] (binomial sd <= 0.5/sqrt(n_kind),
    # n_kind >= 1000, so 4 sd <= 0.063); a worked reference has an '=' in it (P_WORKED = 0.3).
    task = get_task("arithmetic")
    examples = task.examples("sft", 6000)
    wrong, total, worked = collections.Counter(), collections.Counter(), 0
    for ex in examples:
        kind = kind_of(ex.prompt)
        total[kind] += 1
        wrong[kind] += check(ex.prompt, ex.reference) == 0.0
        worked += "=" in ex.reference.split()
        assert parse_answer(ex.reference) is not None  # references are always parseable
    for kind, share in KINDS.items():
        assert abs(total[kind] / len(examples) - share) < 4 * 0.5 / len(examples) ** 0.5
        assert abs(wrong[kind] / total[kind] - P_WRONG[kind]) < 4 * 0.5 / total[kind] ** 0.5, kind
    assert abs(worked / len(examples) - 0.3) < 4 * 0.5 / len(examples) ** 0.5


def test_eval_split_holds_distinct_held_out_problems():
    task = get_task("arithmetic")
    n = held_out_count()
    assert n == 219  # counted by enumerating every problem of every kind
    prompts = [e.prompt for e in task.examples("eval", n)]
    assert len(set(prompts)) == n
    more = [e.prompt for e in task.examples("eval", n + 20)]
    assert more[:n] == prompts and set(more) == set(prompts)  # past n they repeat
    train = {e.prompt for e in task.examples("train", 3000)}
    assert not train & set(prompts)


def test_tokenizer_round_trips_problems_and_answers():
    task = get_task("arithmetic")
    tok = build_tokenizer(task)
    for ex in task.examples("sft", 50):
        for text in (ex.prompt, ex.reference):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids
            assert tok.decode(ids) == text
