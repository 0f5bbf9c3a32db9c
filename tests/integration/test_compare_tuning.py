"""`rloo compare` with tuning, end to end on tiny models: selection sees only the validation split
and the tuning seeds (the evaluation prompts are poisoned until the choice is made), the reported
seeds run at the chosen settings, and the report holds the tuning and equal-KL tables."""

from __future__ import annotations

import fcntl
import json
import os
from types import SimpleNamespace

import yaml

import rloo.experiments.compare as compare_mod
from helpers.tiny import TINY_STUDY as TINY
from rloo.config import CompareConfig
from rloo.experiments.compare import compare
from rloo.experiments.compare_folder import same_settings
from rloo.experiments.tuning import trial_name, trial_settings, tuning_root
from rloo.tasks.base import stable_hash
from rloo.tasks.summarize import EVAL_BUCKETS, SummarizeTask


def _is_eval_prompt(prompt: str) -> bool:
    """summarize's evaluation partition (SummarizeTask.sample_prompt): the hash of the post."""
    post = prompt.removeprefix("post : ").removesuffix(" tl;dr :")
    return stable_hash(post) % EVAL_BUCKETS == 0


def test_tuning_selects_on_validation_prompts_and_tuning_seeds_only(tmp_path, monkeypatch):
    cfg = CompareConfig(
        methods=["rloo", "rloo_clip"],
        tasks=["summarize"],
        seeds=[0],
        output_dir=tmp_path / "c",
        tuning={
            "trials": 2,
            "seeds": [5],
            "lr": [1e-4, 3e-2],
            "beta": [0.25],
            "updates": [[1, 1], [2, 2]],
            "metric": "win_rate_vs_sft",  # the tiny SFT models almost never beat a reference
        },
        equal_kl=[0.01, 100.0],
        **(TINY | {"variance_batches": 0}),
    )
    state = {"selected": False, "train_seeds": [], "scored_eval": 0}
    gold = SummarizeTask.gold_score

    def poisoned(self, prompt, response):
        # adversarial evaluation split: before the choice, any score of an evaluation prompt is an
        # error (and would rank the trials backwards if it were read)
        if _is_eval_prompt(prompt):
            if not state["selected"]:
                raise AssertionError(f"an evaluation prompt was scored before selection: {prompt!r}")
            state["scored_eval"] += 1
            return -gold(self, prompt, response)
        return gold(self, prompt, response)

    real_train, real_choose = compare_mod.train, compare_mod.choose

    def spy_train(rl_cfg, **kw):
        state["train_seeds"].append((rl_cfg.seed, rl_cfg.eval_split, state["selected"]))
        return real_train(rl_cfg, **kw)

    def spy_choose(*a, **kw):
        chosen = real_choose(*a, **kw)
        state["selected"] = True
        return chosen

    monkeypatch.setattr(SummarizeTask, "gold_score", poisoned)
    monkeypatch.setattr(compare_mod, "train", spy_train)
    monkeypatch.setattr(compare_mod, "choose", spy_choose)
    report = compare(cfg)

    # every run before the choice trained on the tuning seed and was evaluated on the valid split
    before = [(s, split) for s, split, sel in state["train_seeds"] if not sel]
    after = [(s, split) for s, split, sel in state["train_seeds"] if sel]
    assert before == [(5, "valid")] * 4 and after == [(0, "eval")] * 2
    assert state["scored_eval"] > 0  # the reported runs were judged on the evaluation prompts
    # the reported runs use the trial with the best mean validation win rate, recomputed here
    root = tmp_path / "c"
    differ = False
    for m in cfg.methods:
        trials = trial_settings(cfg.tuning, m)
        res = [
            json.loads((root / "tuning/summarize/seed-5" / trial_name(m, i) / "result.json").read_text())
            for i in range(2)
        ]
        assert {r["split"] for r in res} == {"valid"}
        differ |= res[0]["win_rate_vs_sft"] != res[1]["win_rate_vs_sft"]
        best = max(range(2), key=lambda i: (res[i]["win_rate_vs_sft"], -i))
        reported = json.loads((root / "runs/summarize/seed-0" / m / "result.json").read_text())
        assert reported["settings"] == trials[best] and reported["split"] == "eval"
    assert differ, "every trial scored alike: the choice would not show which results it read"
    assert not (root / "tuning/summarize/seed-0").exists() and not (root / "runs/summarize/seed-5").exists()
    text = (report / "report.md").read_text()
    assert "## Tuning" in text and "| rloo_clip | lr " in text and "updates (validation " in text
    assert "## Equal KL" in text and "| rloo | " in text
    # KL 100 is never reached in 2 steps: no value there, and rloo has no difference from itself
    kl_part = text.split("## Equal KL")[1]
    row = next(line for line in kl_part.splitlines() if line.startswith("| rloo | "))
    assert row.endswith("|  | - |  |")
    # equal compute: every rloo run reaches 1 x the shortest rloo run's training time
    compute_part = text.split("## Equal compute")[1]
    row = next(line for line in compute_part.splitlines() if line.startswith("| rloo | "))
    assert row.endswith("(n=1) |  |")


def test_a_comparison_saved_before_tuning_existed_is_still_recognised(tmp_path):
    cfg = CompareConfig(methods=["rloo"], tasks=["summarize"], seeds=[0], output_dir=tmp_path / "c", **TINY)
    old = cfg.model_dump(mode="json")
    for key in ("tuning", "equal_kl"):
        old.pop(key)
    old["rl"].pop("eval_split")
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(old, sort_keys=False))
    assert same_settings(saved, cfg)
    assert not same_settings(saved, CompareConfig(**(cfg.model_dump() | {"seeds": [1]})))
    assert not same_settings(saved, CompareConfig(**(cfg.model_dump() | {"tuning": {"trials": 1}})))
    saved.write_text(yaml.safe_dump(old | {"from_the_future": 1}))
    assert not same_settings(saved, cfg)


def test_selection_waits_for_a_tuning_cell_another_process_holds(tmp_path, monkeypatch):
    cfg = CompareConfig(
        methods=["rloo"],
        tasks=["summarize"],
        seeds=[0],
        output_dir=tmp_path,
        tuning={"trials": 2, "seeds": [5, 6], "lr": [1e-4, 3e-4], "beta": [0.25]},
        **TINY,
    )
    result = lambda score: json.dumps({"win_rate": score, "kl": 0.1, "split": "valid"})  # noqa: E731
    for seed in (5, 6):
        for i in range(2):
            d = tuning_root(tmp_path, "summarize", seed) / trial_name("rloo", i)
            d.mkdir(parents=True)
            if (seed, i) != (6, 1):
                d.joinpath("result.json").write_text(result(0.2))
    # another process holds seed 6's cell, its last trial unfinished (a raw flock from this process
    # is a different open file, so runlock sees it as held)
    cell = tuning_root(tmp_path, "summarize", 6)
    fd = os.open(cell / ".rloo.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": "h", "started": 0, "command": "other"}).encode())
    sleeps = []

    def other_process_finishes(seconds):  # the holder writes its result and exits
        sleeps.append(seconds)
        (cell / trial_name("rloo", 1) / "result.json").write_text(result(0.9))
        os.close(fd)

    # only compare's own wait (runlock sleeps too, through the time module)
    monkeypatch.setattr(compare_mod, "time", SimpleNamespace(sleep=other_process_finishes))
    chosen = compare_mod._tuned(cfg, tmp_path, "summarize", poll_s=0.5)
    # it waited once, trained nothing itself (no SFT model anywhere: seed 5 was finished, seed 6
    # held), and chose with the holder's result: trial 1 has mean (0.2 + 0.9) / 2 = 0.55 > 0.2
    assert sleeps == [0.5] and chosen == {"rloo": {"lr": 3e-4, "beta": 0.25}}
    assert not list(tmp_path.rglob("sft"))


def test_the_committed_study_config_loads_and_matches_its_report():
    """docs/results/compare-tuned/study.yaml (the README's command) is a valid compare config, and it is the
    study whose resolved config the report folder holds (same methods, seeds, tuning)."""
    from pathlib import Path

    from rloo.config import load_config

    docs = Path(__file__).resolve().parents[2] / "docs" / "results" / "compare-tuned"
    asked = load_config(CompareConfig, docs / "study.yaml")
    ran = CompareConfig(**yaml.safe_load((docs / "config.yaml").read_text()))
    assert asked.tuning.trials == 9 and asked.methods == ["rloo", "ppo"]
    assert (asked.methods, asked.tasks, asked.seeds, asked.tuning, asked.rl) == (
        ran.methods,
        ran.tasks,
        ran.seeds,
        ran.tuning,
        ran.rl,
    )
