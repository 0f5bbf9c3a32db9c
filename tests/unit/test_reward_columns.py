"""A dataset row's other columns reach reward functions, judges and environments as keyword
arguments, as TRL passes them (rloo.data.columns): one value per completion, in the rollout's order,
only the names a function takes, and a `(prompts, completions)` function called as before."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from rloo.config import DatasetSettings
from rloo.data.columns import Prompt, columns_of, keywords_for
from rloo.data.datasets import read_records, with_chat_template
from rloo.data.prompts import PromptStream, check_prompts
from rloo.envs.base import checked_reset
from rloo.errors import RewardError, RlooError
from rloo.rewards.judges import Judge
from rloo.rewards.sources import FunctionReward

ROWS = [{"question": f"q{i}", "answer": str(i), "level": i % 3} for i in range(6)]


def _repeated(prompts: list[str], k: int) -> list[str]:
    """The rollout's order: each prompt object k times (rloo.rollout.sampler)."""
    return [p for p in prompts for _ in range(k)]


def _prompts() -> list[str]:
    return [Prompt(r["question"], {"answer": r["answer"], "level": r["level"]}) for r in ROWS]


def test_a_function_naming_a_column_gets_one_value_per_completion_in_rollout_order():
    seen = {}

    def accuracy(prompts, completions, answer):
        seen["answer"] = answer
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    prompts = _repeated(_prompts()[:3], 2)
    completions = ["0", "x", "1", "1", "x", "2"]
    scores = FunctionReward(accuracy).score_texts(prompts, completions)
    assert seen["answer"] == ["0", "0", "1", "1", "2", "2"]
    assert scores.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]


def test_var_keyword_gets_every_column_and_plain_functions_get_none():
    got = {}
    FunctionReward(lambda p, c, **kw: got.update(kw) or [0.0] * len(c)).score_texts(_prompts()[:2], ["a", "b"])
    assert got == {"answer": ["0", "1"], "level": [0, 1]}
    # (prompts, completions) only: called with the two lists alone, though the prompts hold columns
    plain = FunctionReward(lambda prompts, completions: [len(c) for c in completions])
    assert plain.score_texts(_prompts()[:2], ["a", "bb"]).tolist() == [1.0, 2.0]


def test_only_the_names_a_signature_takes_and_a_missing_required_column_is_one_line():
    def fn(prompts, completions, level, unused=None):
        return [0.0] * len(completions)

    assert set(keywords_for(fn, {"answer": [1], "level": [2], "unused": [3]})) == {"level", "unused"}
    # a column named like the function's own first parameters is not passed twice
    assert keywords_for(lambda prompts, completions, **kw: None, {"completions": [1], "a": [2]}) == {"a": [2]}
    with pytest.raises(RewardError, match="takes answer, which is not a column of the data .*none"):
        FunctionReward(lambda prompts, completions, answer: answer).score_texts(["plain"], ["x"])


def test_a_judge_from_a_function_reads_the_columns_of_samples_and_references():
    fn = FunctionReward(
        lambda prompts, completions, answer: [float(c == a) for c, a in zip(completions, answer, strict=True)]
    )
    judge = Judge("accuracy", fn.score_texts)
    assert judge.score_texts(_prompts()[:2], ["0", "0"]) == [1.0, 0.0]
    assert judge(_prompts()[4], "4") == 1.0


def test_columns_survive_pickling_the_stream_and_mixed_rows():
    for p in (pickle.loads(pickle.dumps(_prompts()[2])), copy.deepcopy(_prompts()[2])):
        assert isinstance(p, Prompt) and p == "q2" and p.columns == {"answer": "2", "level": 2}
    stream = PromptStream(_prompts(), batch_size=4, seed=0)
    batch = stream.next()
    assert all(isinstance(b, Prompt) and b.columns["answer"] == b[1:] for b in batch)
    assert columns_of(["plain", _prompts()[1]]) == {"answer": [None, "1"], "level": [None, 1]}


def test_the_api_takes_rows_with_a_prompt_key():
    prompts = check_prompts([{"prompt": "what is 2+2", "answer": "4"}, "plain text"])
    assert prompts[0].columns == {"answer": "4"} and prompts[1] == "plain text"
    with pytest.raises(RlooError, match="prompt 0 is a row without a 'prompt' key"):
        check_prompts([{"question": "x"}])


def test_dataset_rows_keep_their_other_columns_beside_the_mapped_prompt(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    settings = DatasetSettings(path=str(path), columns={"prompt": "question"})
    recs = with_chat_template(read_records(settings, ("prompt",)), settings, None)
    assert [r.prompt.columns for r in recs] == [{"answer": r["answer"], "level": r["level"]} for r in ROWS]
    # a column mapped to the completion still reaches the reward (TRL withholds only `prompt` and `completion`)
    settings = DatasetSettings(path=str(path), columns={"prompt": "question", "completion": "answer"})
    recs = with_chat_template(read_records(settings, ("prompt", "completion")), settings, None)
    assert recs[3].prompt.columns == {"answer": "3", "level": 0} and recs[3].completion == "3"


class _Env:
    stop_ids = ()

    def __init__(self):
        self.got = None

    def reset(self, prompt, answer=None):
        self.got = answer
        return [1, 2]


def test_an_environment_reset_naming_a_column_gets_its_row_value():
    env = _Env()
    assert checked_reset(env, _prompts()[5], vocab_size=8) == [1, 2] and env.got == "5"
    checked_reset(env, "plain", vocab_size=8)
    assert env.got is None
