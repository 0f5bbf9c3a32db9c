"""Plots of the `rloo compare` report (matplotlib, no display). Each reads the collected runs:
data[task][method] = [result dict with its 'metrics' records, one per seed]."""

from __future__ import annotations

from pathlib import Path

from rloo.config.methods import spec_of_variant
from rloo.experiments.tuning import base_of
from rloo.runtime.runfolder.atomic import atomic_savefig


def _plt():
    # imported here, not at the top: the file backend must be chosen before pyplot loads, and
    # only when plotting (importing this module must not change a notebook's backend)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _evals(records: list[dict]) -> list[dict]:
    """The periodic-eval records: those with a judge's score, `eval/gold` (a task's gold judge) or
    `eval/judge_<kind>` (eval.judge=reward_model or a function; the gold curves then stay empty)."""
    return [r for r in records if any(k == "eval/gold" or k.startswith("eval/judge_") for k in r)]


def _mean_curve(runs: list[dict], key: str, xkey=lambda r: r["step"]):
    """Mean of `key` over seeds at each x present in every seed's eval records."""
    per_seed = [{xkey(r): r[key] for r in _evals(run["metrics"]) if r.get(key) is not None} for run in runs]
    xs = sorted(set.intersection(*(set(d) for d in per_seed))) if per_seed else []
    return xs, [sum(d[x] for d in per_seed) / len(per_seed) for x in xs]


def _methods_run(cfg, data: dict, task: str):
    """(method, its runs over seeds) for the methods of `task` that have results."""
    return [(name, data[task][name]) for name in cfg.methods if data[task].get(name)]


def _grid(plt, n_rows: int, n_cols: int):
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(5.5 * n_cols, 4 * n_rows), squeeze=False)
    return fig, axes


def _save(plt, fig, path: Path) -> Path:
    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=90)
    plt.close(fig)
    return path


def _legend(ax):
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)


def frontier(plt, cfg, data, path: Path) -> Path:
    """Gold score against KL to the SFT model: training trajectory (mean over seeds) and final point."""
    fig, axes = _grid(plt, 1, len(cfg.tasks))
    for ax, task in zip(axes[0], cfg.tasks, strict=False):
        for name, runs in _methods_run(cfg, data, task):
            kl, gold = (_mean_curve(runs, key)[1] for key in ("eval/kl", "eval/gold"))
            (line,) = ax.plot(kl, gold, alpha=0.5, label=name)
            fk = sum(r["kl"] for r in runs) / len(runs)
            fg = sum(r["gold"] for r in runs) / len(runs)
            ax.plot([fk], [fg], "o", color=line.get_color())
        sft = data[task].get("sft", [])
        if sft:
            ax.plot([0], [sum(r["gold"] for r in sft) / len(sft)], "k*", markersize=12, label="sft")
        ax.set(title=f"{task}: gold score vs KL (dots: final eval)", xlabel="KL(pi || pi_sft)", ylabel="gold score")
        _legend(ax)
    return _save(plt, fig, path)


def learning_curves(plt, cfg, data, path: Path) -> Path:
    """Periodic-eval win rate against the references over training (x: samples, or pairs for dpo)."""
    fig, axes = _grid(plt, 1, len(cfg.tasks))
    per_step = cfg.rl.batch_size * cfg.rl.k
    for ax, task in zip(axes[0], cfg.tasks, strict=False):
        for name, runs in _methods_run(cfg, data, task):
            offline = not spec_of_variant(base_of(name)).online  # dpo: steps of dpo_batch_size pairs
            scale = cfg.rl.algorithm_settings.dpo_batch_size if offline else per_step
            xs, ys = _mean_curve(runs, "eval/win_rate")
            ax.plot([x * scale for x in xs], ys, marker=".", label=name + (" (x: pairs)" if offline else ""))
        ax.set(title=f"{task}: win rate vs references during training", xlabel="generated samples", ylabel="win rate")
        _legend(ax)
    return _save(plt, fig, path)


def clip_fraction(plt, cfg, data, path: Path) -> Path | None:
    """ppo/clipfrac per batch over training for the methods that clip."""
    fig, axes = _grid(plt, 1, len(cfg.tasks))
    for ax, task in zip(axes[0], cfg.tasks, strict=False):
        for name, runs in _methods_run(cfg, data, task):
            color = None  # one colour per method, one line per seed
            for run in runs:
                pts = [(r["step"], r["ppo/clipfrac"]) for r in run["metrics"] if r.get("ppo/clipfrac") is not None]
                if pts:
                    (line,) = ax.plot(*zip(*pts, strict=False), alpha=0.5, color=color, label=None if color else name)
                    color = line.get_color()
        ax.set(
            title=f"{task}: fraction clipped per batch (tokens; rloo_clip: sequences)",
            xlabel="step",
            ylabel="clip fraction",
        )
        _legend(ax)
    if not any(ax.lines for ax in axes[0]):
        plt.close(fig)
        return None
    return _save(plt, fig, path)


def overoptimization(plt, cfg, data, path: Path) -> Path:
    """Gold score and reward-model score against KL over training, per method (mean over seeds)."""
    fig, axes = _grid(plt, len(cfg.tasks), 2)
    for row, task in zip(axes, cfg.tasks, strict=False):
        for name, runs in _methods_run(cfg, data, task):
            kl, gold, rm = (_mean_curve(runs, key)[1] for key in ("eval/kl", "eval/gold", "eval/reward"))
            row[0].plot(kl, gold, marker=".", label=name)
            if len(rm) == len(kl):
                row[1].plot(kl, rm, marker=".", label=name)
        row[0].set(title=f"{task}: gold judge vs KL", xlabel="KL(pi || pi_sft)", ylabel="gold score")
        row[1].set(title=f"{task}: reward model vs KL", xlabel="KL(pi || pi_sft)", ylabel="RM score")
        _legend(row[0])
    return _save(plt, fig, path)


def plot_all(cfg, data, report: Path) -> list[Path]:
    plt = _plt()
    paths = [
        frontier(plt, cfg, data, report / "frontier.png"),
        learning_curves(plt, cfg, data, report / "learning_curves.png"),
        clip_fraction(plt, cfg, data, report / "ppo_clip_fraction.png"),
        overoptimization(plt, cfg, data, report / "overoptimization.png"),
    ]
    return [p for p in paths if p is not None]
