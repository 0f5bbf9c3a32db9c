"""Reward sources: a reward model with its own tokenizer, weighted combinations, judges."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

from rloo.config import Sampling
from rloo.modeling.loading import load_policy, load_reward_model, load_value_model, resolve_dtype
from rloo.rewards import FunctionReward, RewardModelScorer, WeightedReward
from rloo.rewards.judges import make_judge
from rloo.rollout import rollout
from rloo.tasks import get_task
from tolerance import TINY_MODEL_FORWARD, assert_close

PROMPTS = ["post : job rent tl;dr :", "post : exam car dog tl;dr :"]


def other_tokenizer_rm(path, seed=0):
    """A reward model whose tokenizer numbers the words differently from the policy's (reversed
    vocabulary, pad/eos at the end), so scoring the policy's token ids directly would be wrong."""
    words = ["<unk>"] + sorted(set(get_task("summarize").words()), reverse=True) + ["<eos>", "<pad>"]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<unk>", "<eos>", "<pad>"])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.equivalence
def test_reward_model_with_other_tokenizer_scores_like_direct(tiny_model_dir, tmp_path):
    policy, ptok = load_policy(str(tiny_model_dir))
    rm, rtok = load_reward_model(str(other_tokenizer_rm(tmp_path / "rm")))
    assert rtok.get_vocab() != ptok.get_vocab()
    scorer = RewardModelScorer(rm.eval(), rtok, policy_tokenizer=ptok)
    assert not scorer.same_tokenizer
    roll = rollout(policy, ptok, PROMPTS, 3, Sampling(6, 16), generator=torch.Generator().manual_seed(0))
    got = scorer(roll)
    # the plain computation: the reward model on its own tokenization of prompt + completion + EOS,
    # one sequence at a time (no padding), read at the last token by transformers' own pooling
    want = []
    with torch.no_grad():
        for p, c in zip(roll.prompts, roll.completions, strict=False):
            ids = rtok(p, add_special_tokens=False)["input_ids"] + rtok(c, add_special_tokens=False)["input_ids"]
            want.append(rm(input_ids=torch.tensor([ids + [rtok.eos_token_id]])).logits[0, 0].item())
    assert_close(got, torch.tensor(want), TINY_MODEL_FORWARD)  # batched and padded vs one at a time
    assert got.std() > 0


def test_weighted_sum_of_sources():
    class Roll:
        prompts, completions = ["a", "b"], ["x y", "z"]

    length = FunctionReward(lambda p, c: [len(s.split()) for s in c], name="length")
    one = FunctionReward(lambda p, c: [1.0] * len(c), name="one")
    r = WeightedReward({"length": length, "one": one}, {"length": 2.0})
    assert r(Roll).tolist() == [2 * 2 + 1, 2 * 1 + 1]
    assert r.part_metrics() == {"reward/part/length": 1.5, "reward/part/one": 1.0}
    assert r.score_texts(Roll.prompts, Roll.completions).tolist() == [5.0, 3.0]
    # a weight on a source after the first (a sum that dropped the later weights passed the lines above)
    later = WeightedReward({"length": length, "one": one}, {"one": 3.0})
    assert later(Roll).tolist() == [2 + 3.0, 1 + 3.0]


def test_judges(tmp_path, monkeypatch):
    task = get_task("summarize")
    gold = make_judge(None, task=task)
    assert gold.name == "gold judge (summarize)"
    ex = task.examples("eval", 3, seed=0)
    assert [gold(e.prompt, e.reference) for e in ex] == [task.gold_score(e.prompt, e.reference) for e in ex]
    (tmp_path / "myjudge.py").write_text(
        "def words(prompts, completions):\n    return [len(c.split()) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert make_judge("myjudge:words")("p", "a b c") == 3.0
    assert make_judge("myjudge:words").name == "myjudge:words"
    fn = FunctionReward(lambda p, c: [7.0] * len(c))
    assert make_judge(None, task=task, reward_scorer=fn, use_task=False)("p", "x") == 7.0
    assert make_judge("reward_model", reward_scorer=fn)("p", "x") == 7.0
    assert make_judge("reward_model", reward_scorer=fn, reward_name="reward model (rm/)").name == "reward model (rm/)"
    assert make_judge(None, use_task=False) is None


def test_model_options(tiny_model_dir):
    # weights are fp32 everywhere (on CUDA bf16 autocast runs over fp32 masters: issue 34)
    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("auto", "cuda:0") == torch.float32
    value, _ = load_value_model(str(tiny_model_dir))
    assert value.config.num_labels == 1
    # dtype=bfloat16 on CPU is mixed precision: fp32 master weights (rloo.runtime.precision);
    # a torch dtype is taken as is
    m, _ = load_policy(str(tiny_model_dir), dtype="bfloat16")
    assert next(m.parameters()).dtype == torch.float32
    m, _ = load_policy(str(tiny_model_dir), dtype=torch.bfloat16)
    assert next(m.parameters()).dtype == torch.bfloat16
