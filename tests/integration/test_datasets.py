"""Datasets in every supported layout, their formats, clear errors, and the stages wired to them
(load -> train a few steps -> save -> load again, through the CLI and the Python API)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rloo import EvalConfig, RLConfig, RlooError, SFTConfig, evaluate, sft, train
from rloo.cli import main
from rloo.config import DatasetSettings
from rloo.data.datasets import load_records, split_dialogue
from rloo.data.split import held_out, train_eval_records
from rloo.modeling.loading import load_policy, load_reward_model

# `datasets` is optional (the GPU machine has none): skip this file rather than abort collection
datasets = pytest.importorskip("datasets")
Dataset, DatasetDict = datasets.Dataset, datasets.DatasetDict

sys.path.insert(0, str(Path(__file__).parents[1] / "helpers"))  # dist_worker:reward_short

POSTS = [
    "so my landlord raised the rent",
    "i got fired from my job",
    "my sister took my car",
    "the dog ate my laptop",
    "exam tomorrow and no gym",
    "wedding debt and a loan",
]
SUMMARIES = ["landlord rent", "fired job", "sister car", "dog laptop", "exam gym", "wedding debt loan"]


def _hh(i):
    ctx = f"\n\nHuman: help with {POSTS[i]}\n\nAssistant: sure\n\nHuman: more please\n\nAssistant:"
    return {"chosen": ctx + f" {SUMMARIES[i]}", "rejected": ctx + " no"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    with open(d / "sft.jsonl", "w") as f:  # plain, with other column names (mapped in the config)
        for p, s in zip(POSTS, SUMMARIES, strict=False):
            f.write(json.dumps({"question": f"post : {p} tl;dr :", "answer": s}) + "\n")
    Dataset.from_list(
        [
            {"subreddit": "advice", "title": "help", "post": p, "summary": s}
            for p, s in zip(POSTS, SUMMARIES, strict=False)
        ]
    ).to_parquet(str(d / "tldr.parquet"))
    Dataset.from_list(
        [
            {
                "info": {"post": p, "title": "t", "subreddit": "r"},
                "summaries": [{"text": s}, {"text": "um"}],
                "choice": i % 2,
            }
            for i, (p, s) in enumerate(zip(POSTS, SUMMARIES, strict=False))
        ]
    ).to_parquet(str(d / "cmp.parquet"))
    DatasetDict(
        {
            "train": Dataset.from_list([_hh(i) for i in range(4)]),
            "test": Dataset.from_list([_hh(i) for i in range(4, 6)]),
        }
    ).save_to_disk(str(d / "hh"))
    (d / "empty.jsonl").write_text("")
    return d


def test_plain_jsonl_with_column_mapping(data_dir):
    s = DatasetSettings(path=str(data_dir / "sft.jsonl"), columns={"prompt": "question", "completion": "answer"})
    recs = load_records(s, ("prompt", "completion"))
    assert len(recs) == 6 and recs[0].prompt == f"post : {POSTS[0]} tl;dr :" and recs[0].completion == SUMMARIES[0]
    # no eval_split: the rows whose prompt the hash holds out (rloo.data.split), in dataset order
    train_recs, held = train_eval_records(s.model_copy(update={"eval_fraction": 0.5}), ("prompt", "completion"), 2)
    out = [i for i, p in enumerate(POSTS) if held_out(f"post : {p} tl;dr :", 0.5)]
    assert len(out) > 2 and [r.completion for r in held] == [SUMMARIES[i] for i in out[:2]]
    assert [r.completion for r in train_recs] == [s for i, s in enumerate(SUMMARIES) if i not in out]


def test_tldr_formats(data_dir):
    recs = load_records(DatasetSettings(path=str(data_dir / "tldr.parquet"), format="tldr"), ("prompt", "completion"))
    assert recs[0].prompt == f"SUBREDDIT: r/advice\nTITLE: help\nPOST: {POSTS[0]}\nTL;DR:"
    assert recs[0].completion == " " + SUMMARIES[0]
    pairs = load_records(
        DatasetSettings(path=str(data_dir / "cmp.parquet"), format="tldr"), ("prompt", "chosen", "rejected")
    )
    assert (pairs[0].chosen, pairs[0].rejected) == (" " + SUMMARIES[0], " um")  # choice 0
    assert (pairs[1].chosen, pairs[1].rejected) == (" um", " " + SUMMARIES[1])  # choice 1
    assert pairs[0].prompt.startswith("SUBREDDIT: r/r\nTITLE: t\nPOST: ")


def test_hh_format_splits_dialogues(data_dir):
    s = DatasetSettings(path=str(data_dir / "hh"), format="hh", eval_split="test")
    train_recs, held = train_eval_records(s, ("prompt", "chosen", "rejected"), n_eval=10)
    assert len(train_recs) == 4 and len(held) == 2
    r = train_recs[0]
    assert r.prompt.endswith("more please\n\nAssistant:") and r.chosen == " " + SUMMARIES[0] and r.rejected == " no"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert split_dialogue(msgs) == ("\n\nHuman: hi\n\nAssistant:", " hello")


def test_chat_template_applied_when_tokenizer_has_one(data_dir, tiny_model_dir):
    _, tok = load_policy(str(tiny_model_dir))
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    s = DatasetSettings(path=str(data_dir / "hh"), format="hh")
    rec = load_records(s, ("prompt",), tokenizer=tok)[0]
    assert rec.prompt == f"<user> help with {POSTS[0]} <assistant> sure <user> more please <assistant>"
    off = load_records(s.model_copy(update={"chat_template": False}), ("prompt",), tokenizer=tok)[0]
    assert off.prompt.startswith("\n\nHuman:")


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(path="/nonexistent/x.jsonl"), "does not exist"),
        (dict(path="{d}/empty.jsonl"), "is empty"),
        (dict(path="{d}/sft.jsonl"), "has no column 'prompt'"),
        (dict(path="{d}/hh", split="validation"), "has no split 'validation'"),
    ],
)
def test_dataset_errors_are_one_line(settings, message, data_dir):
    s = DatasetSettings(**{k: v.format(d=data_dir) for k, v in settings.items()})
    with pytest.raises(RlooError) as e:
        load_records(s, ("prompt", "completion"))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_cli_stages_on_datasets(data_dir, tiny_model_dir, tmp_path, capsys):
    """sft (JSONL) -> reward (save_to_disk, hh) -> train (Parquet, tldr) -> eval, each loading the
    previous stage's saved model."""
    common = ["max_prompt_tokens=24", "max_response_tokens=8"]
    rc = main(
        [
            "sft",
            f"model={tiny_model_dir}",
            f"output_dir={tmp_path / 'sft'}",
            "epochs=1",
            "batch_size=3",
            f"dataset.path={data_dir / 'sft.jsonl'}",
            "dataset.columns={prompt: question, completion: answer}",
            *common,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rc = main(
        [
            "reward",
            f"sft_model={tmp_path / 'sft' / 'model'}",
            f"output_dir={tmp_path / 'rm'}",
            "epochs=1",
            "batch_size=2",
            "eval_pairs=2",
            f"dataset.path={data_dir / 'hh'}",
            "dataset.format=hh",
            "dataset.eval_split=test",
            *common,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rc = main(
        [
            "train",
            f"policy={tmp_path / 'sft' / 'model'}",
            f"reward_model={tmp_path / 'rm' / 'model'}",
            f"output_dir={tmp_path / 'rl'}",
            "steps=2",
            "batch_size=2",
            "k=2",
            "max_new_tokens=4",
            "eval_every=1",
            "eval_prompts=2",
            f"dataset.path={data_dir / 'tldr.parquet'}",
            "dataset.format=tldr",
            "dataset.eval_fraction=0.3",  # of 6 rows: 3 held out (0.1 holds out none)
            *common,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    recs = [json.loads(x) for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/win_rate" in r for r in recs), "the reward model judges eval when a dataset replaces the task"
    rc = main(
        [
            "eval",
            f"policy={tmp_path / 'rl' / 'model'}",
            f"baseline={tmp_path / 'sft' / 'model'}",
            f"reward_model={tmp_path / 'rm' / 'model'}",
            f"output_dir={tmp_path / 'ev'}",
            "judge=reward_model",
            "num_prompts=2",
            f"dataset.path={data_dir / 'tldr.parquet'}",
            "dataset.format=tldr",
            "dataset.eval_fraction=0.3",
            *common,
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert "win rate" in (tmp_path / "ev" / "report.md").read_text()
    load_policy(str(tmp_path / "rl" / "model")), load_reward_model(str(tmp_path / "rm" / "model"))


def test_api_sft_then_train_on_dataset(data_dir, tiny_model_dir, tmp_path):
    ds = DatasetSettings(path=str(data_dir / "sft.jsonl"), columns={"prompt": "question", "completion": "answer"})
    s = sft(SFTConfig(model=str(tiny_model_dir), output_dir=tmp_path / "sft", epochs=1, batch_size=3, dataset=ds))
    r = train(
        RLConfig(
            policy=str(s.model_path),
            output_dir=tmp_path / "rl",
            steps=2,
            batch_size=2,
            k=2,
            max_new_tokens=4,
            eval_every=None,
            dataset=ds,
            reward_fn="dist_worker:reward_short",
        )
    )
    model, _ = load_policy(str(r.model_path))
    res = evaluate(
        EvalConfig(
            policy=str(r.model_path),
            output_dir=tmp_path / "ev",
            num_prompts=2,
            dataset=ds,
            judge="dist_worker:reward_short",
        )
    )
    assert res["policy"].win_rate is not None
