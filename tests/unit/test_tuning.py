"""Tuning in `rloo compare` and its equal-KL view: the trials, the selection rule, the interpolation
at fixed KL and its paired table, and the config's disjointness checks (hand-derived numbers)."""

from __future__ import annotations

import json

import pytest

from rloo.config import CompareConfig
from rloo.config.tools import TuningSettings
from rloo.errors import ConfigError
from rloo.experiments.compare.kl import compute_trajectory, equal_compute_table, equal_kl_table, trajectory, win_at_kl
from rloo.experiments.tuning import choose, select_trial, trial_name, trial_settings, tuning_root
from rloo.tasks import get_task

# --- interpolation at fixed KL --------------------------------------------------------------------


def test_win_at_kl_interpolates_at_the_first_crossing():
    pts = [(0.0, 0.40), (0.2, 0.50), (0.6, 0.70), (0.4, 0.90), (1.0, 0.60)]
    # 0.5 is first reached between (0.2, 0.50) and (0.6, 0.70): 0.50 + (0.3 / 0.4) * 0.20 = 0.65
    assert win_at_kl(pts, 0.5) == pytest.approx(0.65)
    # a later dip below 0.5 and back (0.4 -> 1.0) is not read: the first crossing counts
    # 0.1 between (0, 0.40) and (0.2, 0.50): 0.40 + 0.5 * 0.10 = 0.45
    assert win_at_kl(pts, 0.1) == pytest.approx(0.45)
    assert win_at_kl(pts, 0.2) == pytest.approx(0.50)  # exactly on an evaluation
    assert win_at_kl(pts, 0.0) == pytest.approx(0.40)
    assert win_at_kl(pts, 1.5) is None  # never reached: no extrapolation
    assert win_at_kl([(0.3, 0.5), (0.6, 0.6)], 0.1) is None  # starts beyond it


def test_trajectory_orders_by_step_and_skips_training_records():
    metrics = [
        {"step": 20, "eval/kl": 0.5, "eval/win_rate": 0.6},
        {"step": 1, "loss/policy": 0.1},
        {"step": 0, "eval/kl": 0.0, "eval/win_rate": 0.4},
    ]
    assert trajectory(metrics) == [(0.0, 0.4), (0.5, 0.6)]


def _run(seed, kls, wins):
    metrics = [
        {"step": 10 * i, "eval/kl": k, "eval/win_rate": w} for i, (k, w) in enumerate(zip(kls, wins, strict=True))
    ]
    return {"seed": seed, "metrics": metrics}


def test_equal_kl_table_pairs_by_seed():
    cfg = CompareConfig(methods=["rloo", "ppo"], tasks=["summarize"], seeds=[0, 1, 2], equal_kl=[0.5, 2.0])
    # at KL 0.5, halfway along each run's one segment: rloo 0.45, 0.55, 0.65 (from 0.4/0.5/0.6 to
    # 0.5/0.6/0.7); ppo 0.5, 0.6, 0.7 (from 0.3/0.4/0.5 to 0.7/0.8/0.9, seed order scrambled), so
    # ppo - rloo = +0.05 on every seed, interval 0
    rloo = [_run(s, [0.0, 1.0], [0.4 + 0.1 * s, 0.5 + 0.1 * s]) for s in range(3)]
    ppo = [_run(s, [0.0, 1.0], [0.3 + 0.1 * s, 0.7 + 0.1 * s]) for s in (2, 0, 1)]
    text = equal_kl_table(cfg, {"summarize": {"sft": [], "rloo": rloo, "ppo": ppo}}, "summarize")
    row = next(line for line in text.splitlines() if line.startswith("| ppo |"))
    # win 0.5, 0.6, 0.7: mean 0.6, sd 0.1 -> 4.303 * 0.1 / sqrt(3) = 0.248; KL 2.0 is never reached
    assert row == "| ppo | 0.600 ± 0.248 (n=3) | +0.050 ± 0.000 (n=3) | - | - |"


# --- the trials and the selection rule ------------------------------------------------------------


def test_every_method_gets_the_same_number_of_distinct_trials():
    t = TuningSettings(trials=5, lr=[1e-4, 3e-4], beta=[0.1, 0.2, 0.4], updates=[(1, 1), (2, 2)])
    for m in ("rloo", "ppo", "dpo", "rloo_clip", "vanilla_pg"):
        trials = trial_settings(t, m)
        assert len(trials) == 5 and len({json.dumps(x, sort_keys=True) for x in trials}) == 5
    assert all(set(x) == {"lr", "beta"} for x in trial_settings(t, "rloo"))
    assert trial_settings(t, "rloo") == trial_settings(t, "reinforce")  # same grid: same trials
    assert all(set(x["algorithm_settings"]) == {"ppo_epochs", "num_minibatches"} for x in trial_settings(t, "ppo"))
    assert all(set(x["algorithm_settings"]) == {"dpo_lr", "dpo_beta"} for x in trial_settings(t, "dpo"))
    full = TuningSettings(trials=6, lr=[1e-4, 3e-4], beta=[0.1, 0.2, 0.4])
    assert [(x["lr"], x["beta"]) for x in trial_settings(full, "rloo")] == [
        (lr, b) for lr in (1e-4, 3e-4) for b in (0.1, 0.2, 0.4)
    ]  # the whole grid when trials = its size, in grid order


def test_select_trial_takes_the_best_mean_validation_score():
    # means 0.5, 0.6, 0.6, 0.4: trial 1 (the tie with 2 goes to the earlier trial)
    scores = [[0.4, 0.6], [0.5, 0.7], [0.7, 0.5], [0.4, 0.4]]
    assert select_trial(scores) == 1
    # KL cap 1.0: trials 1 and 2 (mean KL 1.5, 1.25) are out, trial 0 (0.5) beats 3 (0.75)
    kls = [[0.5, 0.5], [1.0, 2.0], [1.5, 1.0], [0.5, 1.0]]
    assert select_trial(scores, kls, max_kl=1.0) == 0
    assert select_trial(scores, kls, max_kl=0.1) == 1  # none qualifies: the cap is ignored


def test_choose_reads_only_validation_results(tmp_path):
    t = TuningSettings(trials=2, seeds=[7, 8], lr=[1e-4, 3e-4], beta=[0.25])
    for seed in t.seeds:
        for i, score in enumerate([0.3, 0.6]):
            d = tuning_root(tmp_path, "summarize", seed) / trial_name("rloo", i)
            d.mkdir(parents=True)
            d.joinpath("result.json").write_text(json.dumps({"win_rate": score, "kl": 0.5, "split": "valid"}))
    # a reported run on the evaluation split that would favour trial 0 is not read
    ev = tmp_path / "runs" / "summarize" / "seed-0" / "rloo"
    ev.mkdir(parents=True)
    ev.joinpath("result.json").write_text(json.dumps({"win_rate": 1.0, "kl": 0.5, "split": "eval"}))
    assert choose(tmp_path, t, ["rloo"], "summarize") == {"rloo": {"lr": 3e-4, "beta": 0.25}}
    sel = json.loads((tmp_path / "tuning" / "summarize" / "selection.json").read_text())
    assert sel["rloo"]["chosen"] == 1 and sel["rloo"]["trials"][1]["score"] == pytest.approx(0.6)
    # a trial judged on other prompts is refused
    tuning_root(tmp_path, "summarize", 8).joinpath(trial_name("rloo", 0), "result.json").write_text(
        json.dumps({"win_rate": 0.3, "kl": 0.5, "split": "eval"})
    )
    with pytest.raises(RuntimeError, match="validation split"):
        choose(tmp_path, t, ["rloo"], "summarize")


# --- disjointness ---------------------------------------------------------------------------------


def test_tuning_seeds_must_not_be_reported_seeds():
    with pytest.raises(ConfigError, match=r"tuning.seeds \[2\] are also reported seeds") as e:
        CompareConfig(seeds=[0, 1, 2], tuning={"trials": 2, "seeds": [2, 3]})
    assert "\n" not in str(e.value)
    CompareConfig(seeds=[0, 1, 2], tuning={"trials": 2, "seeds": [3, 4]})
    CompareConfig(seeds=[0], tuning={"trials": 0, "seeds": [0]})  # no tuning: nothing to keep apart


def test_equal_kl_values_are_positive():
    with pytest.raises(ConfigError, match=r"equal_kl: needs values > 0"):
        CompareConfig(equal_kl=[0.5, 0.0])


def test_trials_must_fit_every_methods_grid():
    with pytest.raises(ConfigError, match="more than the 2 lr x beta settings"):
        TuningSettings(trials=3, lr=[1e-4], beta=[0.1, 0.2])


@pytest.mark.parametrize("name", ["summarize", "dialogue", "arithmetic"])
def test_validation_prompts_are_never_evaluation_prompts(name):
    task = get_task(name)
    valid = {e.prompt for s in range(3) for e in task.examples("valid", 500, seed=s)}
    evals = {e.prompt for s in range(3) for e in task.examples("eval", 500, seed=s)}
    assert valid and evals and not valid & evals


def test_compute_trajectory_sums_the_phase_times_up_to_each_evaluation():
    metrics = [
        {"step": 0, "eval/kl": 0.0, "eval/win_rate": 0.4},
        {"step": 1, "time/rollout": 1.0, "time/update": 0.5, "loss/policy": 0.1},
        {"step": 2, "time/rollout": 2.0, "time/update": 0.5},
        {"step": 2, "eval/kl": 0.3, "eval/win_rate": 0.5},  # after training step 2
        {"step": 3, "time/rollout": 1.0},
        {"step": 3, "eval/kl": 0.5, "eval/win_rate": 0.7},
    ]
    # seconds 0, 1.5 + 2.5 = 4.0, 4.0 + 1.0 = 5.0
    assert compute_trajectory(metrics) == [(0.0, 0.4), (4.0, 0.5), (5.0, 0.7)]
    assert compute_trajectory([{"step": 0, "eval/win_rate": 0.4}]) == []  # dpo: no phase times


def test_equal_compute_reads_at_multiples_of_the_shortest_rloo_time():
    cfg = CompareConfig(methods=["rloo", "ppo"], tasks=["summarize"], seeds=[0, 1], equal_compute=[0.5, 1.0])

    def run(seed, step_seconds, wins):  # two steps, an evaluation before and after each
        m = [{"step": 0, "eval/win_rate": wins[0]}]
        for s in (1, 2):
            m += [{"step": s, "time/update": step_seconds}, {"step": s, "eval/win_rate": wins[s]}]
        return {"seed": seed, "metrics": m}

    # rloo: 10 s per step on seed 0, 12 s on seed 1: T = 20 s (the shorter run), read at 10 and 20 s.
    # seed 0: 0.5 at 10 s, 0.7 at 20 s; seed 1: at 10 s 0.4 + (10/12) * 0.2 = 0.5667, at 20 s
    # 0.6 + (8/12) * 0.2 = 0.7333. ppo: 20 s per step, wins 0.4, 0.8, 0.9: at 10 s 0.6, at 20 s 0.8 on
    # both seeds: differences at 20 s +0.1 and +0.0667, mean +0.0833
    rloo = [run(0, 10.0, [0.4, 0.5, 0.7]), run(1, 12.0, [0.4, 0.6, 0.8])]
    ppo = [run(1, 20.0, [0.4, 0.8, 0.9]), run(0, 20.0, [0.4, 0.8, 0.9])]
    text = equal_compute_table(cfg, {"summarize": {"rloo": rloo, "ppo": ppo}}, "summarize")
    assert "1 x rloo's time (20 s)" in text
    row = next(line for line in text.splitlines() if line.startswith("| ppo |")).split(" | ")
    assert row[1] == "0.600 ± 0.000 (n=2)" and row[3].startswith("0.800 ± 0.000")
    # differences at 20 s: 0.1 and 0.0667: mean 0.0833, sd 0.02357, t_{0.975,1} = 12.706 ->
    # 12.706 * 0.02357 / sqrt(2) = 0.212
    assert row[4] == "+0.083 ± 0.212 (n=2) |"
