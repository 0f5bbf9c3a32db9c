"""Your own data in the formats people have, through `rloo pipeline` in one command each: a
verifiable-reward run (SFT -> RL with a checker from a file -> pass@k), and TRL's conversational
formats (message lists, a `messages` column, chosen/rejected dialogues) rendered by a chat template.
Tiny locally built models and BPE tokenizers, a few steps."""

from __future__ import annotations

import json
import random

import pytest
from tests.integration.test_own_data import WORDS, _bpe_tokenizer

from rloo.cli import main

CHECKER = """
import re

def correct(prompts, completions):
    # 1 when the first number of the response is the sum of the prompt's two numbers; None: no number
    with open("calls.txt", "a") as f:
        f.write(f"{len(completions)}\\n")
    out = []
    for p, c in zip(prompts, completions):
        a, b = map(int, re.findall(r"\\d+", p)[-2:])
        m = re.match(r"\\s*(\\d+)", c)
        out.append(None if m is None else float(int(m.group(1)) == a + b))
    return out
"""


def _sums(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append((f"what is {a} plus {b}? answer:", f" {a + b}"))
    return rows


def _neox(tok, path):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=len(tok),
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.eos_token_id,
            max_position_embeddings=256,
        )
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    """models/policy (GPT-NeoX, BPE), data/sums.jsonl (prompt, completion), check.py:correct."""
    root = tmp_path_factory.mktemp("sums")
    rows = _sums(24)
    _neox(_bpe_tokenizer([p + c for p, c in rows]), root / "models" / "policy")
    (root / "data").mkdir()
    with open(root / "data" / "sums.jsonl", "w") as f:
        for p, c in rows:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    (root / "check.py").write_text(CHECKER)
    return root


RL_TINY = [
    "sft.epochs=1",
    "sft.batch_size=8",
    "rl.steps=2",
    "rl.batch_size=2",
    "rl.k=2",
    "rl.max_new_tokens=4",
    "rl.eval_every=null",
    "rl.save_every=null",
    "eval.num_prompts=4",
    "max_prompt_tokens=32",
    "max_response_tokens=4",
]


def test_pipeline_with_a_checker_reward_from_a_file(sums, monkeypatch, capsys):
    """rl.reward_fn from a file is the reward (no reward-model stage), the judge, and with
    eval.checker the evaluation reports pass@k of the SFT and RL policies on held-out prompts."""
    monkeypatch.chdir(sums)
    rc = main(
        [
            "pipeline",
            "model=models/policy",
            "dataset.path=data/sums.jsonl",
            "dataset.eval_fraction=0.25",  # 24 rows: the default 0.1 can hold out none
            "rl.reward_fn=check.py:correct",
            "eval.checker=check.py:correct",
            "eval.pass_samples=8",
            "output_dir=runs/check",
            *RL_TINY,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    out = sums / "runs" / "check"
    assert "[2/4] no reward model: rl.reward_fn is the reward (check.py:correct)" in err
    assert not (out / "reward").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge"] == "check.py:correct" and summary["reward_model"] is None
    for name in ("policy", "baseline"):
        passes = summary["eval"][name]["pass"]
        assert passes["n"] == 8 and passes["problems"] == 4 and set(passes["pass_at_k"]) == {"1", "2", "4", "8"}
    assert set(summary["difference"]) >= {"pass@1", "pass@8"}
    assert "pass@k on 4 held-out problems" in (out / "eval" / "report.md").read_text()
    calls = [int(n) for n in (sums / "calls.txt").read_text().split()]
    assert calls.count(2 * 2) >= 2, calls  # each RL step scored its batch (2 prompts x k=2) with the checker


def test_pipeline_refuses_a_missing_reward_file_before_training(sums, monkeypatch, capsys):
    monkeypatch.chdir(sums)
    rc = main(["pipeline", "model=models/policy", "dataset.path=data/sums.jsonl", "rl.reward_fn=nope.py:correct"])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.py" in err and "Traceback" not in err, err
    assert not (sums / "runs" / "pipeline").exists()


def test_pipeline_on_tldr_jsonl(tmp_path, monkeypatch, capsys):
    """docs/own-data.md's TL;DR example: posts with title/subreddit/summary, and preference rows
    with `summaries` + `choice` (openai/summarize_from_feedback's layout), format=tldr, one command."""
    rng = random.Random(0)
    posts = []
    for _ in range(32):
        w = rng.sample(WORDS, 4)
        posts.append(({"subreddit": "advice", "title": f"my {w[0]}", "post": f"my {w[0]} and {w[1]} and {w[2]}"}, w))
    tok = _bpe_tokenizer(["SUBREDDIT: r/advice TITLE: POST: TL;DR: " + " ".join(w) for _, w in posts])
    _neox(tok, tmp_path / "models" / "policy")
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "tldr.jsonl", "w") as f:
        for row, w in posts:
            f.write(json.dumps(row | {"summary": f"{w[0]} {w[1]}"}) + "\n")
    with open(tmp_path / "data" / "tldr-prefs.jsonl", "w") as f:
        for row, w in posts:
            good, bad = {"text": f"{w[0]} {w[1]}"}, {"text": w[3]}
            f.write(json.dumps({"post": row["post"], "summaries": [bad, good], "choice": 1}) + "\n")
    monkeypatch.chdir(tmp_path)
    rc = main(
        [
            "pipeline",
            "model=models/policy",
            "dataset.path=data/tldr.jsonl",
            "dataset.format=tldr",
            "reward.dataset.path=data/tldr-prefs.jsonl",
            "reward.dataset.format=tldr",
            "dataset.eval_fraction=0.25",  # 32 rows: the default 0.1 can hold out none
            "reward.dataset.eval_fraction=0.25",
            "output_dir=runs/tldr",
            *CHAT_TINY,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    summary = json.loads((tmp_path / "runs" / "tldr" / "summary.json").read_text())
    assert summary["reward_model"] is not None and summary["eval"]["policy"]["win_rate"] is not None


# -- TRL's conversational formats ---------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TOPICS = ["rent", "job", "car", "dog", "exam", "loan", "gym", "city", "money", "house"]


def _chat_tokenizer(texts: list[str]):
    """A byte-level BPE with role tokens and a chat template whose end-of-turn is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>")
    out.chat_template = CHAT_TEMPLATE
    return out


def _chats(n: int, seed: int) -> list[tuple[str, str, str]]:
    """(question, good answer, bad answer)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.sample(TOPICS, 2)
        rows.append((f"help with my {a} and my {b}", f"{a} {b}", " ".join(rng.sample(TOPICS, 4))))
    return rows


def _msgs(*turns: tuple[str, str]) -> list[dict]:
    return [{"role": r, "content": c} for r, c in turns]


SYSTEM = ("system", "be brief")


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """models/policy with a chat template; data/chat.jsonl (a `messages` column) and
    data/prefs.jsonl (chosen/rejected whole conversations, implicit prompt); data/dd, a saved
    DatasetDict (train/test) with prompt, completion, chosen, rejected as message lists."""
    from datasets import Dataset, DatasetDict

    root = tmp_path_factory.mktemp("chat")
    rows = _chats(32, seed=0)
    tok = _chat_tokenizer([f"be brief {q} {g} {b}" for q, g, b in rows])
    _neox(tok, root / "models" / "policy")
    (root / "data").mkdir()
    with open(root / "data" / "chat.jsonl", "w") as f:
        for q, g, _ in rows:
            f.write(json.dumps({"messages": _msgs(SYSTEM, ("user", q), ("assistant", g))}) + "\n")
    with open(root / "data" / "prefs.jsonl", "w") as f:
        for q, g, b in _chats(24, seed=1):
            row = {"chosen": _msgs(("user", q), ("assistant", g)), "rejected": _msgs(("user", q), ("assistant", b))}
            f.write(json.dumps(row) + "\n")

    def split(n, seed):
        return Dataset.from_list(
            [
                {
                    "prompt": _msgs(("user", q)),
                    "completion": _msgs(("assistant", g)),
                    "chosen": _msgs(("assistant", g)),
                    "rejected": _msgs(("assistant", b)),
                }
                for q, g, b in _chats(n, seed)
            ]
        )

    DatasetDict({"train": split(32, 2), "test": split(8, 3)}).save_to_disk(str(root / "data" / "dd"))
    return root, tok


def test_conversational_rows_are_rendered_by_the_chat_template(chat):
    """Prompts end with the generation cue; a response is the template's text for the final
    assistant turn, EOS (the template's end-of-turn) left for the stages to append."""
    from rloo.config import DatasetSettings
    from rloo.data.datasets import load_records

    root, tok = chat
    q, g, _ = _chats(32, seed=0)[0]
    sft = load_records(DatasetSettings(path=str(root / "data" / "chat.jsonl")), ("prompt", "completion"), tokenizer=tok)
    assert (sft[0].prompt, sft[0].completion) == (f"<|system|>be brief<|end|><|user|>{q}<|end|><|assistant|>", g)
    q, g, b = _chats(24, seed=1)[0]
    pref = load_records(
        DatasetSettings(path=str(root / "data" / "prefs.jsonl")), ("prompt", "chosen", "rejected"), tokenizer=tok
    )
    assert (pref[0].prompt, pref[0].chosen, pref[0].rejected) == (f"<|user|>{q}<|end|><|assistant|>", g, b)
    q, g, b = _chats(8, seed=3)[0]
    dd = DatasetSettings(path=str(root / "data" / "dd"), split="test")
    rl = load_records(dd, ("prompt",), tokenizer=tok, optional=("completion",))
    assert (rl[0].prompt, rl[0].completion) == (f"<|user|>{q}<|end|><|assistant|>", g)
    # the SFT loss covers the completion's tokens only: the assistant's words and EOS
    from rloo.data.collate import encode_completions

    ids = encode_completions(tok, [sft[0].completion], 16).ids[0].tolist()
    assert tok.decode(ids) == sft[0].completion + "<|end|>"


CHAT_TINY = [
    "sft.epochs=1",
    "sft.batch_size=8",
    "reward.epochs=1",
    "reward.batch_size=8",
    "reward.eval_pairs=4",
    "rl.steps=2",
    "rl.batch_size=2",
    "rl.k=2",
    "rl.max_new_tokens=4",
    "rl.eval_every=null",
    "rl.save_every=null",
    "eval.num_prompts=4",
    "max_prompt_tokens=48",
    "max_response_tokens=16",  # every target with its EOS, every preference response whole
]


@pytest.mark.parametrize(
    "data",
    [
        # 32 rows: the default eval_fraction 0.1 can hold out none
        [
            "dataset.path=data/chat.jsonl",
            "reward.dataset.path=data/prefs.jsonl",
            "dataset.eval_fraction=0.25",
            "reward.dataset.eval_fraction=0.25",
        ],
        ["dataset.path=data/dd", "dataset.eval_split=test"],
    ],
    ids=["jsonl", "datasetdict"],
)
def test_pipeline_on_conversational_data(chat, data, monkeypatch, capsys):
    """SFT -> reward model -> RL -> eval on message lists, in one command."""
    root, _ = chat
    monkeypatch.chdir(root)
    out = f"runs/{data[0].split('/')[-1]}"
    rc = main(["pipeline", "model=models/policy", *data, f"output_dir={out}", *CHAT_TINY])
    err = capsys.readouterr().err
    assert rc == 0, err
    summary = json.loads((root / out / "summary.json").read_text())
    assert summary["reward_model"] is not None and summary["eval"]["policy"]["win_rate"] is not None
    assert (root / out / "rl" / "model").is_dir()


def test_pipeline_reward_sources_from_the_config():
    """rl.reward_fn alone: no reward-model stage and it judges a dataset's eval; with reward.dataset or
    a 'reward_model' weight the reward model is trained and summed with it; a built-in task keeps
    its gold judge."""
    from rloo.config import PipelineConfig

    ds = {"path": "data/x.jsonl"}
    alone = PipelineConfig(dataset=ds, rl={"reward_fn": "check.py:correct"})
    _, _, rl, ev = alone.stage_configs()
    assert not alone.trains_reward_model() and rl.reward_model is None and rl.reward_fn == "check.py:correct"
    assert ev.judge == rl.eval.judge == "check.py:correct" and ev.reward_model is None
    fns = ["a.py:f", "b.py:g"]
    for both in (
        PipelineConfig(dataset=ds, rl={"reward_fn": fns}, reward={"dataset": {"path": "data/p.jsonl"}}),
        PipelineConfig(dataset=ds, rl={"reward_fn": fns, "reward_weights": {"reward_model": 0.5}}),
    ):
        _, _, rl, ev = both.stage_configs()
        assert both.trains_reward_model() and rl.reward_model and rl.reward_fn == ["a.py:f", "b.py:g"]
        assert ev.judge is None and ev.reward_model == rl.reward_model  # judged by the reward model
    task = PipelineConfig(rl={"reward_fn": "check.py:correct"})
    assert task.stage_configs()[3].judge is None  # the built-in task's gold judge
    arith = PipelineConfig(task="arithmetic", rl={"reward_fn": "check.py:correct"})
    assert arith.stage_configs()[2].reward_fn == "check.py:correct" and not arith.trains_reward_model()


@pytest.mark.parametrize(
    ("row", "fields", "message"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, ("prompt", "completion"), "must end with an assistant"),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]},
            ("prompt", "chosen", "rejected"),
            "no column 'chosen'",
        ),
        ({"prompt": [{"role": "user", "content": "hi"}], "completion": ["ok"]}, ("prompt", "completion"), "list of"),
        (
            {
                "chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}],
                "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "y"}],
            },
            ("prompt", "chosen", "rejected"),
            "differ before their last assistant message",
        ),
    ],
)
def test_conversational_mistakes_are_one_line(tmp_path, row, fields, message):
    from rloo.config import DatasetSettings
    from rloo.data.datasets import load_records
    from rloo.errors import RlooError

    (tmp_path / "d.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(RlooError, match=message):
        load_records(DatasetSettings(path=str(tmp_path / "d.jsonl")), fields)


def test_text_columns_beside_a_messages_column_stay_plain(tmp_path):
    """A `prompt` text column wins over a `messages` column: the row is read as plain text."""
    from rloo.config import DatasetSettings
    from rloo.data.datasets import load_records

    row = {"prompt": "q?", "completion": " a", "messages": [{"role": "user", "content": "other"}]}
    (tmp_path / "d.jsonl").write_text(json.dumps(row) + "\n")
    rec = load_records(DatasetSettings(path=str(tmp_path / "d.jsonl")), ("prompt", "completion"))[0]
    assert (rec.prompt, rec.completion) == ("q?", " a")
