"""The `rloo compare` report: the paper's table, frontier, curves, PPO diagnostics, variance.

Everything is read back from the run folders (result.json, metrics.jsonl, gradient_variance.json),
so the report can be regenerated without training: `write_report(cfg, out)`. The tables are made
in rloo.experiments.compare.tables, the plots in rloo.experiments.compare.plots.
"""

from __future__ import annotations

import json
from pathlib import Path

from rloo.experiments.compare.episodes import episode_section, training_curves
from rloo.experiments.compare.kl import equal_compute_table, equal_kl_table, tuning_table
from rloo.experiments.compare.order import BOOTSTRAP_DRAWS, correlation_table, ordering_table, paper_pairs
from rloo.experiments.compare.plots import plot_all
from rloo.experiments.compare.tables import (  # noqa: F401 - mean_ci re-exported
    mean_ci,
    paired_differences,
    pass_differences,
    pass_table,
    ppo_lambda_table,
    results_table,
    variance_table,
)
from rloo.experiments.tuning import read_result, report_names, updates_of, view_names
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.confine import make_folder
from rloo.runtime.tracking.log import read_metrics
from rloo.tasks import get_task, plays_episodes

PER_PROMPT = ("metrics", "gold_per_prompt", "pass_counts", "success_counts")  # left out of report/results.json


def collect(cfg, out: Path) -> dict:
    """{task: {method, view or 'sft': [result per seed]}}, with each run's metrics attached. A view
    (ppo@2x2, rloo.experiments.tuning.view_names) without its own run is its method's run when that
    was made at the view's updates (the overall choice is then also the view's)."""
    data: dict = {}
    views = view_names(cfg.tuning, cfg.methods) if cfg.tuning.trials else {}
    for task in cfg.tasks:
        data[task] = {}
        for seed in cfg.seeds:
            root = out / "runs" / task / f"seed-{seed}"
            for name in ["sft", *report_names(cfg)]:
                d = _run_dir(root, name, views)
                if (d / "result.json").exists():
                    r = read_result(d / "result.json")
                    r["metrics"] = read_metrics(d / "metrics.jsonl") if name != "sft" else []
                    r["seed"] = seed
                    data[task].setdefault(name, []).append(r)
    return data


def _run_dir(root: Path, name: str, views: dict) -> Path:
    """The folder of `name`'s run in a cell: a view's own, or its method's when the view has none and
    the method ran at the view's updates."""
    if name not in views or (root / name / "result.json").exists():
        return root / name
    method, upd = views[name]
    f = root / method / "result.json"
    same = f.exists() and updates_of(read_result(f).get("settings", {})) == upd
    return root / method if same else root / name


def pass_section(cfg, data: dict, tasks: list[str]) -> list[str]:
    text = [
        "## pass@k on the tasks scored by a checker",
        "",
        f"{cfg.eval.pass_samples} samples per held-out problem ({cfg.eval.num_prompts} distinct problems), the "
        "unbiased estimator 1 − C(n−c,k)/C(n,k) averaged over problems; mean ± 95% t-interval over seeds. "
        f"zero-var@{cfg.rl.k} (eval): the estimated share of groups of k = {cfg.rl.k} samples whose rewards are "
        "all equal (no gradient for any group baseline); zero-var (training): the same share measured on the "
        "training batches (groups/zero_variance), averaged over the run. With one seed, values marked * "
        "carry the 95% normal interval over problems instead (differences paired over problems): it "
        "covers the evaluation's sampling of problems and responses, not the randomness of training.",
        "",
    ]
    for task in tasks:
        text += [
            f"### {task}",
            "",
            pass_table(cfg, data, task),
            "",
            "Differences from rloo, paired by seed:",
            "",
            pass_differences(cfg, data, task),
            "",
        ]
    return text


def tuning_section(cfg, data: dict, out: Path) -> list[str]:
    t = cfg.tuning
    if not t.trials:
        return []
    return [
        "## Tuning",
        "",
        f"Every method got {t.trials} trials per task, drawn from lr {t.lr} x beta {t.beta} (dpo: dpo_lr x "
        f"dpo_beta), times (epochs, minibatches) {[list(u) for u in t.updates]} for the methods that take "
        f"several steps per batch; each trial trained on tuning seeds {t.seeds} (own SFT and reward models) "
        f"and was judged on {t.valid_prompts} validation prompts per seed (the task's valid split, never an "
        f"evaluation prompt). Chosen: the highest mean {t.metric} over the tuning seeds"
        + (f" among trials with mean validation KL <= {t.max_kl:g}" if t.max_kl is not None else "")
        + ". "
        + "".join(
            f"{m}'s own grid: {', '.join(f'{k} {v}' for k, v in g.model_dump(exclude_none=True).items())}. "
            for m, g in t.grids.items()
            if m in cfg.methods
        )
        + "".join(
            f"{v}: {m} chosen among its trials at {e}x{n} updates only (the same rule). "
            for v, (m, (e, n)) in view_names(t, cfg.methods).items()
        )
        + ("<method>@untuned: the method at the shared rl settings, in the same cells. " if t.untuned else "")
        + "Every trial's score: tuning/<task>/selection.json. Settings of the reported runs, with the "
        "chosen trial's mean validation score and the range over the method's trials:",
        "",
        tuning_table(cfg, data, out),
        "",
    ]


def equal_kl_section(cfg, data: dict) -> list[str]:
    text = [
        "## Equal KL: win rate at common distances from the SFT model",
        "",
        "Each run's periodic evaluations (every rl.eval_every steps, rl.eval_prompts evaluation prompts, KL = "
        "mean sum_t log pi/pi_sft) give a trajectory of (KL, win rate vs references); the win rate where it "
        "first reaches each KL is interpolated linearly between the two evaluations around it. Runs that "
        "never reach a KL are left out there (n = seeds that did); differences from rloo are paired by seed "
        "over the seeds where both reached it. Mean ± 95% t-interval over seeds.",
        "",
    ]
    for task in cfg.tasks:
        text += [f"### {task}", "", equal_kl_table(cfg, data, task), ""]
    text += [
        "## Equal compute: win rate at common training time",
        "",
        "The same reading along training seconds instead of KL: the wall-clock of each step's logged phases "
        "(time/rollout, time/score, time/update, ...; evaluations left out), summed up to each periodic "
        "evaluation, read at multiples of the shortest rloo run's training time on the task. Wall-clock on a "
        "shared machine: compare methods of the same seed, which ran in the same process one after another. "
        "dpo logs no phase times.",
        "",
    ]
    for task in cfg.tasks:
        text += [f"### {task}", "", equal_compute_table(cfg, data, task), ""]
    return text


def ordering_section(cfg, data: dict) -> list[str]:
    """The paper's ordering pair by pair and its rank correlation (rloo.experiments.compare.order)."""
    if not any(paper_pairs([n for n in data[t] if n != "sft"]) for t in cfg.tasks):
        return []
    text = [
        "## The paper's ordering, pair by pair",
        "",
        "Each adjacent pair of the paper's TL;DR order (RLOO k=4 77.9 > RLOO k=2 74.2 > RAFT 73.2 > REINFORCE "
        "70.7 > vanilla PG 70.4 > PPO 67.6 > DPO 66.6; update views such as ppo@2x2 also in their method's "
        "place): better − worse in win rate against the references, paired by seed, mean ± 95% t-interval, "
        "and whether the paper's order holds (interval above 0), reverses (below 0) or is unresolved; n = "
        "seeds paired. Views: the final win rate (equal samples), the win rate at each equal-KL value and at "
        "each equal-compute time (as in the sections above; a run that never reaches one has no value there, "
        "dpo has none at equal compute).",
        "",
    ]
    for task in cfg.tasks:
        text += [f"### {task}", "", ordering_table(cfg, data, task), ""]
    text += [
        "Spearman's rank correlation of the methods' mean win rates with the paper's order (+1: the same "
        "order), over the seeds every ranked method has in that view; the interval is the 2.5-97.5 "
        f"percentile of rho over {BOOTSTRAP_DRAWS} resamples of those seeds with replacement (all methods "
        "resampled together). With 5 seeds it is coarse and tends to be too narrow: read it as a guide.",
        "",
    ]
    for task in cfg.tasks:
        text += [f"### {task}", "", correlation_table(cfg, data, task), ""]
    return text


def write_report(cfg, out: Path) -> Path:
    report = out / "report"
    make_folder(report)
    data = collect(cfg, out)
    # the tables' and plots' rows: the methods and their update views (ppo@2x2); a copy, not validated
    cfg = cfg.model_copy(update={"methods": report_names(cfg)})
    episodic = plays_episodes(get_task(cfg.tasks[0]))  # a study is all text or all episode tasks (config)
    plots = [training_curves(cfg, data, report / "training_curves.png")] if episodic else plot_all(cfg, data, report)
    atomic_write_text(
        report / "results.json",
        json.dumps(
            {
                t: {m: [{k: v for k, v in r.items() if k not in PER_PROMPT} for r in rs] for m, rs in d.items()}
                for t, d in data.items()
            },
            indent=1,
        ),
    )
    budget = cfg.rl.steps * cfg.rl.batch_size * cfg.rl.k
    if episodic:
        text = [
            "# RLOO and the methods that train on episodes, on the tasks played as episodes",
            "",
            f"Tasks {', '.join(cfg.tasks)}; seeds {cfg.seeds}; every method trained on {budget} episodes "
            f"({cfg.rl.steps} steps x {cfg.rl.batch_size} prompts x k={cfg.rl.k}) from the same SFT model per seed.",
            "",
            *episode_section(cfg, data),
        ]
    else:
        text = _text_body(cfg, data, out, budget)
    text += ["## Plots", "", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    atomic_write_text(report / "report.md", "\n".join(text))
    return report


def _text_body(cfg, data: dict, out: Path, budget: int) -> list[str]:
    """The report's sections for text tasks (win rates)."""
    checked = [t for t in cfg.tasks if any("pass" in r for rs in data[t].values() for r in rs)]
    return [
        "# RLOO and the methods it is compared with, on the built-in tasks",
        "",
        f"Tasks {', '.join(cfg.tasks)}; seeds {cfg.seeds}; every online method trained on {budget} generated "
        f"samples ({cfg.rl.steps} steps x {cfg.rl.batch_size} prompts x k={cfg.rl.k}; rloo_k2 uses "
        f"{cfg.rl.batch_size * cfg.rl.k // 2} prompts x 2); dpo trained offline on the reward model's "
        f"{cfg.reward.num_pairs} pairs. Win rates by the task's gold judge on {cfg.eval.num_prompts} held-out "
        "prompts, one sample each; mean ± 95% t-interval over seeds (no interval with one seed). "
        "'win vs SFT' is head to head against the SFT model's sample for the same prompt (ties count half). "
        "KL: mean sum_t log pi/pi_sft of the evaluated samples.",
        "",
        results_table(cfg, data),
        "",
        *(pass_section(cfg, data, checked) if checked else []),
        "## Differences from RLOO, paired by seed",
        "",
        "Method minus rloo in win rate against the references, per seed (same SFT model, reward model, eval "
        "prompts and eval sampling noise), mean ± 95% t-interval over seeds; 'seeds ahead': seeds where the "
        "method won more often than rloo.",
        "",
        paired_differences(cfg, data),
        "",
        *tuning_section(cfg, data, out),
        *ordering_section(cfg, data),
        *equal_kl_section(cfg, data),
        "## PPO: GAE lambda 0.95 vs 1.0 (final win rate vs references)",
        "",
        ppo_lambda_table(cfg, data),
        "",
        "## Gradient variance at a fixed snapshot",
        "",
        f"{cfg.variance_batches} independent batches of {cfg.variance_samples} completions per estimator; "
        "tr Cov(g) = E||g - Eg||^2 of the policy gradient of the reward-model score; noise/signal = "
        "tr Cov(g) / ||E g||^2 (debiased). 'weak' = SFT on "
        f"{cfg.weak_sft_fraction:.0%} of the SFT data for one epoch.",
        "",
        variance_table(out, cfg),
        "",
    ]
