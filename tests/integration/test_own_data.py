"""Your own model and data from end to end: `rloo pipeline` through the CLI on a locally built
GPT-NeoX policy, a Qwen2 reward base and a BPE tokenizer trained here with `tokenizers`, a JSONL SFT
set and a Parquet preference set (key=value and the same as a YAML file). Tiny models, few steps."""

from __future__ import annotations

import json
import random

import pytest
import yaml

from rloo.cli import main
from rloo.config import Sampling

WORDS = [
    "rent",
    "landlord",
    "job",
    "boss",
    "car",
    "sister",
    "dog",
    "laptop",
    "exam",
    "gym",
    "loan",
    "wedding",
    "friend",
    "money",
    "house",
    "late",
    "help",
    "advice",
    "moving",
    "city",
]


def _posts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        topic = rng.sample(WORDS, 3)
        post = f"my {topic[0]} and the {topic[1]} made me {topic[2]} again, what do i do"
        out.append((f"POST: {post}\nTL;DR:", f" {topic[0]} {topic[1]} {topic[2]}"))
    return out


def _bpe_tokenizer(texts: list[str]):
    """A byte-level BPE trained on `texts`, wrapped for transformers, with EOS/PAD tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=320, special_tokens=["<|eos|>", "<|pad|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>")


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A folder as a user would have it: models/policy (GPT-NeoX), models/rm-base (Qwen2),
    data/sft.jsonl (prompt, completion), data/prefs.parquet (prompt, chosen, rejected), judge.py."""
    import torch
    from datasets import Dataset
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("own")
    rows = _posts(40)
    tok = _bpe_tokenizer([p + c for p, c in rows])
    special = dict(
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.eos_token_id,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(
        GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **special)
    )
    qwen = Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            tie_word_embeddings=True,
            **special,
        )
    )
    for model, name in ((neox, "policy"), (qwen, "rm-base")):
        model.save_pretrained(root / "models" / name)
        tok.save_pretrained(root / "models" / name)
    (root / "data").mkdir()
    with open(root / "data" / "sft.jsonl", "w") as f:
        for p, c in rows:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    rng = random.Random(1)
    Dataset.from_list(
        [{"prompt": p, "chosen": c, "rejected": " " + " ".join(rng.sample(WORDS, 5))} for p, c in _posts(30, seed=2)]
    ).to_parquet(str(root / "data" / "prefs.parquet"))
    (root / "judge.py").write_text(
        "def overlap(prompts, completions):\n"
        "    return [len(set(c.split()) & set(p.split())) for p, c in zip(prompts, completions)]\n"
    )
    return root


TINY = [
    "sft.epochs=1",
    "sft.batch_size=8",
    "reward.epochs=1",
    "reward.batch_size=8",
    "reward.eval_pairs=6",
    "rl.steps=2",
    "rl.batch_size=2",
    "rl.k=2",
    "rl.max_new_tokens=6",
    "rl.eval_every=null",
    "rl.eval_prompts=4",
    "rl.save_every=null",
    "eval.num_prompts=4",
    "max_prompt_tokens=48",
    "max_response_tokens=20",  # every target with its EOS, every preference response whole
]


def _check_report(out, judge: str, err: str) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge"] == judge and summary["dataset"] == "data/sft.jsonl"
    report = (out / "eval" / "report.md").read_text()
    assert f"win rate vs refs ({judge})" in report and f"score ({judge})" in report, report
    assert json.loads((out / "eval" / "summary.json").read_text())["judge"] == judge
    assert summary["eval"]["policy"]["win_rate"] is not None and summary["difference"] is not None
    assert (out / "rl" / "plots" / "reward.png").is_file() and summary["plots"]
    assert "[1/4] SFT of models/policy on data/sft.jsonl" in err
    assert "[2/4] reward model from models/rm-base on data/prefs.parquet" in err
    # labels true to own data: the prompts actually evaluated (the held-out rows, fewer than
    # eval.num_prompts=4 here), no built-in task, and the reward model's score not called "gold"
    from rloo.config import DatasetSettings
    from rloo.data.split import eval_records

    n = len(eval_records(DatasetSettings(path="data/sft.jsonl"), ("prompt",), 4))
    assert n < 4 and f"[4/4] evaluation on {n} held-out prompts" in err
    assert summary["task"] is None
    for policy in (summary["eval"]["policy"], json.loads((out / "eval" / "summary.json").read_text())["policy"]):
        assert "gold" not in policy and policy["judge_score"] is not None
    return summary


def test_pipeline_on_own_models_and_data_cli(own, monkeypatch, capsys):
    monkeypatch.chdir(own)
    rc = main(
        [
            "pipeline",
            "model=models/policy",
            "reward.model=models/rm-base",
            "dataset.path=data/sft.jsonl",
            "reward.dataset.path=data/prefs.parquet",
            "output_dir=runs/kv",
            *TINY,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    # default judge on a dataset: the reward model the pipeline trained, named as such
    _check_report(own / "runs" / "kv", "reward model (runs/kv/reward/model)", err)
    from rloo.modeling.loading import load_policy, load_reward_model

    assert type(load_policy(str(own / "runs/kv/rl/model"))[0]).__name__ == "GPTNeoXForCausalLM"
    assert type(load_reward_model(str(own / "runs/kv/reward/model"))[0]).__name__ == "Qwen2ForSequenceClassification"


def test_pipeline_on_own_models_and_data_yaml(own, monkeypatch, capsys):
    monkeypatch.chdir(own)
    cfg = {
        "model": "models/policy",
        "dataset": {"path": "data/sft.jsonl", "format": "plain"},
        "output_dir": "runs/yaml",
        "eval": {"judge": "judge.py:overlap"},
        "reward": {"model": "models/rm-base", "dataset": {"path": "data/prefs.parquet"}},
    }
    for item in TINY:
        key, value = item.split("=")
        node = cfg
        for part in key.split(".")[:-1]:
            node = node.setdefault(part, {})
        node[key.split(".")[-1]] = yaml.safe_load(value)
    (own / "own.yaml").write_text(yaml.safe_dump(cfg))
    rc = main(["pipeline", "--config", "own.yaml"])
    err = capsys.readouterr().err
    assert rc == 0, err
    _check_report(own / "runs" / "yaml", "judge.py:overlap", err)


def test_reward_model_on_another_tokenizer_reads_the_unstripped_text(monkeypatch):
    """A reward model on another tokenizer re-tokenizes each sample as decoded (a BPE's leading space
    kept: the layout of its training pairs, " text"), not the stripped text reward functions get."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from rloo.rewards import RewardModelScorer
    from rloo.rollout import rollout

    rows = _posts(40)
    tok = _bpe_tokenizer([p + c for p, c in rows])
    rm_tok = _bpe_tokenizer([p for p, _ in rows])  # another vocabulary
    torch.manual_seed(0)
    policy = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    )
    roll = rollout(
        policy,
        tok,
        [p for p, _ in rows[:16]],
        1,
        Sampling(max_new_tokens=5, max_prompt_tokens=48),
        generator=torch.Generator().manual_seed(0),
    )
    decoded = tok.batch_decode(
        roll.completion_ids.masked_fill(~roll.completion_mask, tok.pad_token_id).tolist(), skip_special_tokens=True
    )
    assert roll.raw_completions == decoded and [t.strip() for t in decoded] == roll.completions
    assert any(t != t.strip() for t in decoded), "some samples start with a space-prefixed BPE token"
    scorer = RewardModelScorer(None, rm_tok, policy_tokenizer=tok)
    assert not scorer.same_tokenizer
    seen = []
    monkeypatch.setattr(scorer, "score_texts", lambda p, c: seen.append(list(c)) or torch.zeros(len(c)))
    scorer(roll)
    assert seen == [decoded]
