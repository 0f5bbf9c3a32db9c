"""PNG plots of a training run's metrics (matplotlib, no display needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rloo.runtime.runfolder.atomic import atomic_savefig
from rloo.runtime.runfolder.confine import make_folder
from rloo.runtime.tracking.log import read_metrics


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def score_keys(records: list[dict]) -> list[str]:
    """The judge's score metrics present (rloo.eval.judge.score_key: eval/gold, eval/judge_<kind>)."""
    keys = {k for r in records for k in r if k == "eval/gold" or k.startswith("eval/judge_")}
    return sorted(keys)


def _smooth(ys: list[float], window: int) -> list[float]:
    out, acc = [], []
    for y in ys:
        acc = (acc + [y])[-window:]
        out.append(sum(acc) / len(acc))
    return out


def plot_training(metrics_path: Path, out_dir: Path, title: str = "", judge: str = "gold judge") -> list[Path]:
    """reward.png, kl.png, win_rate.png and judge_score.png (success.png for episodes) from a run's
    metrics.jsonl; returns the files written. `judge` names who produced the win rate and the score
    (the eval set's judge). The score's plot is the one that moves: a win rate against references is
    0 on every eval while the policy's responses score below every reference, however much the score
    rises."""
    # imported here, not at the top: the file backend must be chosen before pyplot loads, and
    # only when plotting (importing this module must not change a notebook's backend)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    make_folder(out_dir)  # never a link out of the run folder (rloo.runtime.runfolder.confine)
    panels = [
        ("reward.png", ["reward/score", "reward/total"], "reward"),
        ("kl.png", ["reward/kl"], "KL(pi || pi_ref) per response"),
        ("win_rate.png", ["eval/win_rate"], f"win rate vs references ({judge})"),
        ("judge_score.png", score_keys(records), f"mean score ({judge})"),
        ("success.png", ["eval/success"], "success rate of held-out episodes"),  # env= runs
    ]
    written = []
    for fname, keys, ylabel in panels:
        fig = _panel(plt, records, keys, ylabel, title)
        if fig is None:
            continue
        atomic_savefig(fig, out_dir / fname, dpi=100)
        plt.close(fig)
        written.append(out_dir / fname)
    return written


def _panel(plt, records, keys, ylabel: str, title: str):
    """One figure of `keys` over steps, or None when none has data. A long label (a judge's path) is
    wrapped to the axis height: tight_layout cannot fit a label taller than the figure."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in keys:
        xs, ys = _series(records, key)
        if not xs:
            continue
        smooth = key.startswith("reward/")
        ax.plot(
            xs,
            _smooth(ys, 10) if smooth else ys,
            marker=None if smooth else "o",
            label=key + (" (10-step mean)" if smooth else ""),
        )
    if not ax.lines:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("\n".join(textwrap.wrap(ylabel, 32, break_on_hyphens=False)))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
