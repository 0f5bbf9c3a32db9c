"""`rloo compare` with tuning, end to end on tiny models: selection sees only the validation split
and the tuning seeds (the evaluation prompts are poisoned until the choice is made), the reported
seeds run at the chosen settings, and the report holds the tuning and equal-KL tables."""

from __future__ import annotations

import fcntl
import json
import os
from types import SimpleNamespace

import yaml

import rloo.experiments.compare.study as compare_mod
from helpers.tiny import TINY_STUDY as TINY
from rloo.config import CompareConfig
from rloo.experiments.compare.folder import same_settings
from rloo.experiments.tuning import trial_name, trial_settings, tuning_root


def test_tuning_selects_on_validation_prompts_and_tuning_seeds_only(tuned_study):
    """The shared tuned study (tests/helpers/tuned_study.py) ran with the evaluation prompts poisoned
    until the choice was made and every RL run recorded."""
    cfg, root = tuned_study.cfg, tuned_study.out
    # every run before the choice trained on the tuning seed and was evaluated on the valid split:
    # each method's two trials; after it, the reported runs: each method at its choice and untuned,
    # and ppo@2x2 when ppo's own choice was not at 2x2 (then the view has a run of its own)
    before = [(s, split) for s, split, sel in tuned_study.train_seeds if not sel]
    after = [(s, split) for s, split, sel in tuned_study.train_seeds if sel]
    view = (root / "runs/summarize/seed-0/ppo@2x2/result.json").exists()
    assert before == [(5, "valid")] * 4 and after == [(0, "eval")] * (4 + view)
    assert tuned_study.scored_eval > 0  # the reported runs were judged on the evaluation prompts
    # the reported runs use the trial with the best mean validation win rate, recomputed here
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
    text = (root / "report" / "report.md").read_text()
    assert "## Tuning" in text and "| ppo | lr " in text and "updates (validation " in text
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
    # is a different open file, so the run lock sees it as held)
    cell = tuning_root(tmp_path, "summarize", 6)
    fd = os.open(cell / ".rloo.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": "h", "started": 0, "command": "other"}).encode())
    sleeps = []

    def other_process_finishes(seconds):  # the holder writes its result and exits
        sleeps.append(seconds)
        (cell / trial_name("rloo", 1) / "result.json").write_text(result(0.9))
        os.close(fd)

    # only compare's own wait (the run lock sleeps too, through the time module)
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
