"""Own data without dataset.eval_split: the rows evaluation reads are never read by a training stage
(SFT, reward model, RL prompts, the pairs DPO reuses), by one rule (rloo.data.split)."""

from __future__ import annotations

import json

import pytest

import rloo.training.evalset as evalset_mod
import rloo.training.evaluate as evaluate_mod
import rloo.training.reward as reward_mod
import rloo.training.sft as sft_mod
from rloo import PipelineConfig, pipeline
from rloo.config import DatasetSettings

WORDS = ["landlord", "rent", "job", "car", "sister", "dog", "laptop", "exam", "gym", "loan"]


def _rows(n: int) -> list[dict]:
    """n rows with distinct prompts (so a prompt names its row) and every field a stage needs."""
    rows = []
    for i in range(n):
        a, b = WORDS[i % 10], WORDS[(i // 10) % 10]
        prompt = f"post : my {a} and my {b} , row {i} tl;dr :"
        rows.append({"prompt": prompt, "completion": f" {a} {b}", "chosen": f" {a} {b}", "rejected": " um"})
    return rows


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(80)))
    return path


def _spy(monkeypatch, module, name, seen: list, pick):
    """Wrap module.name so that every call appends pick(args, kwargs) (prompts) to `seen`."""
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        seen.extend(pick(args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


def test_no_stage_trains_on_an_evaluation_row(data, tiny_model_dir, tmp_path, monkeypatch):
    seen = {k: [] for k in ("sft", "rl", "rm_held", "rl_eval", "eval")}
    _spy(monkeypatch, sft_mod, "encode_prompts", seen["sft"], lambda a, k: a[1])
    _spy(monkeypatch, evalset_mod, "PromptStream", seen["rl"], lambda a, k: a[0])
    _spy(monkeypatch, reward_mod, "evaluate_reward_model", seen["rm_held"], lambda a, k: [p[0] for p in a[3]])
    _spy(monkeypatch, evalset_mod, "evaluate_policy", seen["rl_eval"], lambda a, k: a[2])
    _spy(monkeypatch, evaluate_mod, "evaluate_policy", seen["eval"], lambda a, k: a[2])
    cfg = PipelineConfig(
        model=str(tiny_model_dir),
        dataset={"path": str(data)},
        output_dir=tmp_path / "run",
        max_prompt_tokens=24,
        max_response_tokens=4,
        report_to="none",
        sft={"epochs": 1, "batch_size": 16},
        reward={"epochs": 1, "batch_size": 16, "eval_pairs": 50},
        rl={"steps": 2, "batch_size": 2, "k": 2, "max_new_tokens": 4, "eval_every": 1, "eval_prompts": 50},
        eval={"num_prompts": 50},
    )
    pipeline(cfg)
    trained = {
        "sft": set(seen["sft"]),
        "reward model (pairs.jsonl, also DPO's pairs)": {
            json.loads(line)[0] for line in (tmp_path / "run" / "reward" / "pairs.jsonl").open()
        },
        "rl": set(seen["rl"]),
    }
    evaluated = set(seen["eval"]) | set(seen["rl_eval"]) | set(seen["rm_held"])
    assert seen["eval"] and seen["rl_eval"] and seen["rm_held"], "every evaluation read held-out rows"
    for stage, prompts in trained.items():
        assert prompts, stage
        assert not prompts & evaluated, f"{stage} trained on {len(prompts & evaluated)} evaluation rows"
    # every row is on one side: the training stages read all the others
    assert trained["sft"] | evaluated == {r["prompt"] for r in _rows(80)}


def test_split_follows_the_prompt_not_the_row_order_or_limit(tmp_path):
    from rloo.data.split import held_out, train_eval_records

    rows = _rows(80)
    for name, part in (("fwd", rows), ("rev", rows[::-1]), ("head", rows[:40])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    held = {}
    for name in ("fwd", "rev", "head"):
        s = DatasetSettings(path=str(tmp_path / f"{name}.jsonl"), eval_fraction=0.25)
        train, ev = train_eval_records(s, ("prompt", "completion"), n_eval=1000)
        held[name] = {r.prompt for r in ev}
        assert not held[name] & {r.prompt for r in train}
    assert held["fwd"] == held["rev"] and held["head"] == {p for p in held["fwd"] if int(p.split()[-3]) < 40}
    assert held["fwd"] == {r["prompt"] for r in rows if held_out(r["prompt"], 0.25)}
    assert 0 < len(held["fwd"]) < 80


def test_a_file_that_holds_out_no_row_is_one_line(tmp_path):
    from rloo import RlooError
    from rloo.data.split import eval_records, held_out, train_records

    rows = [r for r in _rows(80) if not held_out(r["prompt"], 0.1)][:3]
    (tmp_path / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = DatasetSettings(path=str(tmp_path / "few.jsonl"))
    assert len(train_records(s, ("prompt",))) == 3  # training alone needs no held-out row
    with pytest.raises(RlooError) as e:
        eval_records(s, ("prompt",), 10)
    assert "none of its 3 rows is held out for evaluation" in str(e.value) and "\n" not in str(e.value)
    assert "dataset.eval_fraction" in str(e.value) and "dataset.eval_split" in str(e.value)
