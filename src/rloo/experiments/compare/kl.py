"""The equal-KL and equal-compute views of `rloo compare`: each method's win rate read at common KL
values, or at common training seconds, from its training trajectory (the periodic evals of
metrics.jsonl), so that methods which move further from the reference per sample, or spend more
compute per sample, are compared where they are equally far from it or have spent as much; and
the report's tables of those views and of the tuning."""

from __future__ import annotations

import json
from pathlib import Path

from rloo.config.methods import DEFAULT_METHOD
from rloo.experiments.compare.tables import mean_ci
from rloo.experiments.tuning import describe
from rloo.runtime.runfolder.reading import read_text


def trajectory(metrics: list[dict]) -> list[tuple[float, float]]:
    """(KL, win rate) of each periodic evaluation of a run, in step order: J records of metrics.jsonl
    that carry both `eval/kl` (mean sum_t log pi/pi_sft of the evaluated samples) and
    `eval/win_rate` -> a list of J pairs. The first is the step-0 evaluation (the SFT model, KL 0)
    when the run evaluated before its first step."""
    evals = [m for m in metrics if "eval/kl" in m and "eval/win_rate" in m]
    return [(float(m["eval/kl"]), float(m["eval/win_rate"])) for m in sorted(evals, key=lambda m: m["step"])]


def win_at_kl(points: list[tuple[float, float]], kl: float) -> float | None:
    """The win rate where a trajectory first reaches `kl`, linearly interpolated between the two
    evaluations around that crossing. points: J pairs (KL_j, win_j) in step order (`trajectory`);
    kl: a scalar. With j the first index where KL_j >= kl:
        win = win_{j-1} + (kl - KL_{j-1}) / (KL_j - KL_{j-1}) * (win_j - win_{j-1}).
    Returns win_0 when KL_0 == kl, and None when the run never reaches kl or starts beyond it (no
    extrapolation: a method that stayed closer to the reference has no value there). Any increasing
    coordinate works the same way (compute_trajectory's training seconds)."""
    for j, (k, w) in enumerate(points):
        if k >= kl:
            if k == kl:
                return w
            if j == 0:
                return None
            k0, w0 = points[j - 1]
            return w0 + (kl - k0) / (k - k0) * (w - w0)
    return None


def compute_trajectory(metrics: list[dict]) -> list[tuple[float, float]]:
    """(training seconds, win rate) of each periodic evaluation of a run, in step order: the seconds
    are the sum of the `time/*` phases (rollout, score, update, ...) of every training record up to
    the evaluation's step (a record at step s is training step s, an evaluation at step s comes
    after it), so evaluation time is left out. Needs log_every = 1 (every step recorded); a run that
    logs no phase times (dpo) gives []."""
    train = [
        (m["step"], sum(v for k, v in m.items() if k.startswith("time/")))
        for m in metrics
        if "eval/win_rate" not in m and any(k.startswith("time/") for k in m)
    ]
    if not train:
        return []
    evals = sorted((m for m in metrics if "eval/win_rate" in m), key=lambda m: m["step"])
    return [(sum(t for s, t in train if s <= e["step"]), float(e["eval/win_rate"])) for e in evals]


def _cell(xs: list[float], signed: bool = False) -> str:
    if not xs:
        return "-"
    m, h = mean_ci(xs)
    fmt = "+.3f" if signed else ".3f"
    return f"{m:{fmt}} (n={len(xs)})" if h is None else f"{m:{fmt}} ± {h:.3f} (n={len(xs)})"


def equal_kl_table(cfg, data: dict, task: str, base: str = DEFAULT_METHOD) -> str:
    """Per method and KL value: win rate at that KL (mean ± 95% t-interval over the seeds whose run
    reached it), and its difference from `base` paired by seed (seeds where both reached it)."""
    return _at_table(cfg, data, task, trajectory, list(cfg.equal_kl), [f"KL {k:g}" for k in cfg.equal_kl], base)


def compute_points(cfg, data: dict, task: str, base: str = DEFAULT_METHOD) -> tuple[list[float], list[str]]:
    """The training seconds of the equal-compute view, T x each of cfg.equal_compute with T the
    shortest training time (compute_trajectory's last point) of `base`'s runs on the task (so every
    base run reaches 1.0), and their labels; ([], []) when no base run logged phase times."""
    ends = [pts[-1][0] for r in data[task].get(base, []) if (pts := compute_trajectory(r.get("metrics", [])))]
    if not ends:
        return [], []
    xs = [f * min(ends) for f in cfg.equal_compute]
    return xs, [f"{f:g} x {base}'s time ({x:.0f} s)" for f, x in zip(cfg.equal_compute, xs, strict=True)]


def equal_compute_table(cfg, data: dict, task: str, base: str = DEFAULT_METHOD) -> str:
    """As equal_kl_table, at the training seconds of compute_points."""
    xs, labels = compute_points(cfg, data, task, base)
    if not xs:
        return f"(no {base} run with phase times)"
    return _at_table(cfg, data, task, compute_trajectory, xs, labels, base)


def values_at(data: dict, task: str, traj, xs: list[float]) -> dict[str, dict[int, list[float | None]]]:
    """{run name: {seed: [win rate where traj(metrics) first reaches x, for each x (None: never)]}}."""
    return {
        name: {r["seed"]: [win_at_kl(traj(r.get("metrics", [])), x) for x in xs] for r in rs}
        for name, rs in data[task].items()
        if name != "sft"
    }


def _at_table(cfg, data: dict, task: str, traj, xs: list[float], labels: list[str], base: str) -> str:
    """Rows: methods; per x: the win rate where each run's trajectory (traj(metrics)) first reaches
    x, and its difference from `base` paired by seed."""
    head = [c for lab in labels for c in (f"win @ {lab}", f"− {base} @ {lab}")]
    rows = ["| method | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    at = values_at(data, task, traj, xs)
    xs_none: list[float | None] = [None] * len(xs)  # a seed base has no run on
    ref = at.get(base, {})
    for name in [m for m in cfg.methods if m in at]:
        cells = []
        for i in range(len(xs)):
            level = [x for v in at[name].values() if (x := v[i]) is not None]
            diffs = [
                x - r
                for s, v in at[name].items()
                if (x := v[i]) is not None and (r := ref.get(s, xs_none)[i]) is not None
            ]
            cells += [_cell(level), "" if name == base else _cell(diffs, signed=True)]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def tuning_table(cfg, data: dict, out: Path) -> str:
    """Per method and task: the settings its reported runs used (from their result.json), and from
    the task's tuning/<task>/selection.json the chosen trial's mean validation score and the range
    over all its trials (how much the choice mattered)."""
    rows = ["| method | " + " | ".join(cfg.tasks) + " |", "|---" * (len(cfg.tasks) + 1) + "|"]
    for name in cfg.methods:
        cells = []
        for task in cfg.tasks:
            chosen = {describe(r["settings"]) for r in data[task].get(name, []) if r.get("settings")}
            cell = "; ".join(sorted(chosen)) or "-"
            f = out / "tuning" / task / "selection.json"
            sel = json.loads(read_text(f)).get(name) if f.exists() else None
            if sel:
                scores = [t["score"] for t in sel["trials"]]
                cell += f" (validation {scores[sel['chosen']]:.3f}; trials {min(scores):.3f}-{max(scores):.3f})"
            cells.append(cell)
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
