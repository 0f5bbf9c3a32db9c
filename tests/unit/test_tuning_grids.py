"""Per-method tuning grids (tuning.grids) and update views (tuning.update_views, ppo@2x2): the trials
they give, their validation (one-line refusals), the view's choice among its method's trials, the
reported runs and the report's reading of a view that shares its method's run."""

from __future__ import annotations

import json

import pytest

from rloo.config import CompareConfig
from rloo.config.tools import TuningSettings
from rloo.errors import ConfigError
from rloo.experiments.compare import tuned_variants
from rloo.experiments.compare.report import collect
from rloo.experiments.tuning import choose, report_names, trial_name, trial_settings, tuning_root, view_names


def test_a_method_grid_replaces_the_shared_one_for_that_method_only():
    t = TuningSettings(
        trials=4,
        lr=[1e-4, 3e-4],
        beta=[0.1, 0.25],
        grids={"rloo": {"lr": [1e-3, 3e-3]}, "dpo": {"beta": [0.03, 0.3]}, "ppo": {"updates": [[2, 2]]}},
    )
    # trials = grid size: each method's whole grid, in grid order
    assert [(x["lr"], x["beta"]) for x in trial_settings(t, "rloo")] == [
        (1e-3, 0.1),
        (1e-3, 0.25),
        (3e-3, 0.1),
        (3e-3, 0.25),
    ]
    assert [(x["lr"], x["beta"]) for x in trial_settings(t, "reinforce")] == [
        (1e-4, 0.1),
        (1e-4, 0.25),
        (3e-4, 0.1),
        (3e-4, 0.25),
    ]
    dpo = [x["algorithm_settings"] for x in trial_settings(t, "dpo")]  # dpo's own beta, the shared lr
    assert [(a["dpo_lr"], a["dpo_beta"]) for a in dpo] == [(1e-4, 0.03), (1e-4, 0.3), (3e-4, 0.03), (3e-4, 0.3)]
    assert {
        (x["algorithm_settings"]["ppo_epochs"], x["algorithm_settings"]["num_minibatches"])
        for x in trial_settings(t, "ppo")
    } == {(2, 2)}
    # without grids: the trials of before (the earlier tuned study's study.yaml draws the same)
    old = TuningSettings(trials=9, lr=[1e-4, 3e-4, 1e-3], beta=[0.1, 0.25, 0.5], updates=[(1, 1), (2, 2)])
    assert trial_settings(old.model_copy(update={"grids": {}}), "ppo") == trial_settings(old, "ppo")


@pytest.mark.parametrize(
    ("grids", "message"),
    [
        ({"rlooo": {"lr": [1e-3]}}, "grids: unknown method 'rlooo'"),
        ({"rloo": {"lr": [1e-3], "eta": [1.0]}}, "unknown key 'grids.rloo.eta'"),
        ({"rloo": {"updates": [[2, 2]]}}, "grids.rloo.updates: rloo takes one optimizer step per batch"),
        ({"rloo": {"lr": [1e-3, 1e-3]}}, "grids.rloo.lr: needs distinct values"),
        ({"rloo": {"lr": [1e-3]}}, "grids.rloo: 2 trials is more than its 1 settings"),
    ],
)
def test_a_bad_method_grid_is_refused_in_one_line(grids, message):
    with pytest.raises(ConfigError, match=message) as e:
        TuningSettings(trials=2, lr=[1e-4, 3e-4], beta=[0.25], grids=grids)
    assert "\n" not in str(e.value)


def test_an_update_view_must_name_a_multi_step_method_and_one_of_its_updates():
    with pytest.raises(ConfigError, match="update_views: 'rloo' is not a method that takes several steps"):
        TuningSettings(update_views={"rloo": [[2, 2]]})
    with pytest.raises(ConfigError, match=r"update_views.ppo: \[\[4, 4\]\] not among its updates"):
        TuningSettings(updates=[(1, 1), (2, 2)], update_views={"ppo": [[4, 4]]})
    t = TuningSettings(updates=[(1, 1), (2, 2)], update_views={"ppo": [[2, 2]]})
    assert view_names(t, ["rloo", "ppo"]) == {"ppo@2x2": ("ppo", (2, 2))}
    assert view_names(t, ["rloo"]) == {}  # no ppo compared: no view
    cfg = CompareConfig(methods=["ppo", "rloo"], tuning=t.model_dump() | {"trials": 2})
    assert report_names(cfg) == ["ppo", "ppo@2x2", "rloo"]
    untuned = CompareConfig(methods=["ppo", "rloo"], tuning=t.model_dump() | {"trials": 2, "untuned": True})
    assert report_names(untuned) == ["ppo", "ppo@2x2", "rloo", "ppo@untuned", "rloo@untuned"]


def _write_trials(out, t, method, scores):
    for seed in t.seeds:
        for i, score in enumerate(scores):
            d = tuning_root(out, "summarize", seed) / trial_name(method, i)
            d.mkdir(parents=True)
            d.joinpath("result.json").write_text(json.dumps({"win_rate": score, "kl": 1.0, "split": "valid"}))


def test_the_view_chooses_among_its_methods_trials_at_its_updates(tmp_path):
    t = TuningSettings(
        trials=4,
        seeds=[7],
        lr=[1e-4, 3e-4],
        beta=[0.1, 0.25],
        updates=[(1, 1), (2, 2)],
        grids={"ppo": {"beta": [0.25]}},
        update_views={"ppo": [[2, 2]]},
    )
    trials = trial_settings(t, "ppo")  # the whole grid: (1e-4, 1x1), (1e-4, 2x2), (3e-4, 1x1), (3e-4, 2x2)
    _write_trials(tmp_path, t, "ppo", [0.5, 0.4, 0.7, 0.6])
    chosen = choose(tmp_path, t, ["ppo"], "summarize")
    assert chosen == {"ppo": trials[2], "ppo@2x2": trials[3]}  # overall 0.7 (1x1); among the 2x2 ones 0.6
    sel = json.loads((tmp_path / "tuning" / "summarize" / "selection.json").read_text())
    assert sel["ppo@2x2"]["of"] == "ppo" and [x["index"] for x in sel["ppo@2x2"]["trials"]] == [1, 3]
    assert sel["ppo@2x2"]["trials"][sel["ppo@2x2"]["chosen"]]["score"] == pytest.approx(0.6)
    # both run on the reported seeds; when the overall choice is at 2x2 the view is not run twice
    assert tuned_variants(chosen) == {"ppo": ("ppo", trials[2]), "ppo@2x2": ("ppo", trials[3])}
    assert tuned_variants({"ppo": trials[3], "ppo@2x2": trials[3]}) == {"ppo": ("ppo", trials[3])}


def test_the_report_reads_the_methods_run_for_a_view_chosen_alike(tmp_path):
    cfg = CompareConfig(
        methods=["ppo"],
        tasks=["summarize"],
        seeds=[0, 1],
        tuning={
            "trials": 2,
            "lr": [1e-4, 3e-4],
            "beta": [0.25],
            "updates": [[1, 1], [2, 2]],
            "update_views": {"ppo": [[2, 2]]},
        },
    )
    two = {"lr": 1e-4, "beta": 0.25, "algorithm_settings": {"ppo_epochs": 2, "num_minibatches": 2}}
    one = {"lr": 1e-4, "beta": 0.25, "algorithm_settings": {"ppo_epochs": 1, "num_minibatches": 1}}
    for seed, runs in ((0, {"ppo": (two, 0.6)}), (1, {"ppo": (one, 0.7), "ppo@2x2": (two, 0.5)})):
        for name, (settings, win) in runs.items():
            d = tmp_path / "runs" / "summarize" / f"seed-{seed}" / name
            d.mkdir(parents=True)
            d.joinpath("result.json").write_text(json.dumps({"win_rate": win, "settings": settings}))
    data = collect(cfg, tmp_path)["summarize"]
    # seed 0: ppo chose 2x2, so its run is the view's too; seed 1: the view's own run
    assert [(r["seed"], r["win_rate"]) for r in data["ppo@2x2"]] == [(0, 0.6), (1, 0.5)]
    assert [(r["seed"], r["win_rate"]) for r in data["ppo"]] == [(0, 0.6), (1, 0.7)]
