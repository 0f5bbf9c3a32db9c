"""Is a tuned choice on its grid's edge hiding a better setting past it?

    python benchmarks/studies/tuning_edges.py STUDY OUT [--tasks summarize,dialogue] [--seeds 100,101]
    python benchmarks/studies/tuning_edges.py STUDY OUT --reported [--seeds 0,1,2,3,4]
    python benchmarks/studies/tuning_edges.py STUDY OUT --report            # the tables, from the runs done
    python benchmarks/studies/tuning_edges.py STUDY OUT --reproduce summarize/rloo.t00
    python benchmarks/studies/tuning_edges.py STUDY - --grids               # every trial's score, as grids

STUDY is a finished tuned `rloo compare` output_dir (its config.yaml, tuning/ and runs/).
For every method's choice, each tuned coordinate (lr and beta; dpo: dpo_lr and dpo_beta) that sits on
the first or last value tried gets one trial one step past it, the other settings kept at the
choice. The step continues the grid's spacing on a log scale (lr 1e-4 -> 3.3e-5, 3e-3 -> 9e-3; beta
0.25 -> 0.125, 1.0 -> 2.0; dpo beta 0.3 -> 0.9). A trial is run exactly as a tuning trial is
(compare's run_cell on the tuning seeds' own SFT and reward models, linked from STUDY, judged on the
same validation prompts) into OUT/tuning/<task>/seed-<s>/<method>.<key>-<below|above>[<r>]/. The
choice is then made again by compare's own rule over the study's trials and these; where it moved
to a point past the edge, that point's next step is tried, until every choice is inside what was
tried. Several processes may share OUT with disjoint --seeds (or --tasks).

--reported runs each choice that moved on the reported seeds, as compare runs a method at its
choice (the study's SFT and reward models of each seed, the evaluation prompts), into
OUT/runs/<task>/seed-<s>/<name>/.

--report prints every point past an edge with its mean validation win rate over the tuning seeds
against the study's choice (per seed) and whether it is the choice now; then, for each moved choice,
its win rate on the reported seeds, paired by seed with the study's run of the method and with
rloo's (95% t-intervals). The choice follows the selection rule (the higher mean over two tuning
seeds), not a significance test: it settles which setting tuning picks, not which is better.

--reproduce TASK/TRIAL reruns one finished trial of STUDY on its first tuning seed into OUT and says
whether its result.json equals the saved one in every field but the wall-clock `seconds` (bitwise on
the CPU kind the trial was made on): the check that the code still trains the study's runs.

--grids prints each method's trials as a grid (rows beta and updates, columns lr; dpo: dpo_beta and
dpo_lr) of mean validation win rates over the tuning seeds, the choice in bold.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from rloo.config import CompareConfig
from rloo.config.methods import DEFAULT_METHOD, spec_of_variant
from rloo.experiments.compare import run_cell
from rloo.experiments.compare.tables import mean_ci
from rloo.experiments.tuning import select_trial, trial_settings, tuning_root


def step_past(grid: list[float], value: float) -> tuple[str, float] | None:
    """('below'|'above', the next value past the grid's edge on its log spacing), or None when
    `value` is inside the grid (or the grid has one point: no spacing to continue)."""
    g = sorted(grid)
    if len(g) < 2 or not (math.isclose(value, g[0]) or math.isclose(value, g[-1])):
        return None
    if math.isclose(value, g[0]):
        return "below", g[0] * g[0] / g[1]
    return "above", g[-1] * g[-1] / g[-2]


def _get(settings: dict, key: str):
    return settings["algorithm_settings"][key.split(".", 1)[1]] if "." in key else settings[key]


def _with(settings: dict, key: str, value: float) -> dict:
    out = json.loads(json.dumps(settings))
    if "." in key:
        out.setdefault("algorithm_settings", {})[key.split(".", 1)[1]] = value
    else:
        out[key] = value
    return out


@dataclass
class Trial:
    name: str  # its run folder: the study's <method>.t<i>, or an edge point's <method>.<key>-<side>[<r>]
    settings: dict
    scores: list[float]  # validation score per tuning seed


def trials(cfg: CompareConfig, task: str, study: Path, out: Path, m: str) -> list[Trial]:
    """The study's trials of a method, then the edge points finished in OUT on every tuning seed."""
    metric, seeds = cfg.tuning.metric, cfg.tuning.seeds
    read = lambda root, name: [  # noqa: E731
        json.loads((tuning_root(root, task, s) / name / "result.json").read_text())[metric] for s in seeds
    ]
    done = [
        Trial(f"{m}.t{i:02d}", t, read(study, f"{m}.t{i:02d}")) for i, t in enumerate(trial_settings(cfg.tuning, m))
    ]
    first = tuning_root(out, task, seeds[0])
    for d in sorted(first.glob(f"{m}.*-*")) if first.exists() else []:
        if d.name.split(".", 1)[0] == m and all(
            (tuning_root(out, task, s) / d.name / "result.json").exists() for s in seeds
        ):
            done.append(Trial(d.name, json.loads((d / "result.json").read_text())["settings"], read(out, d.name)))
    return done


def chosen(ts: list[Trial]) -> Trial:
    """The selection rule of `rloo compare` (rloo.experiments.tuning.select_trial, no max_kl): the
    highest mean validation score, a tie to the earlier trial."""
    return ts[select_trial([t.scores for t in ts])]


def edge_points(cfg: CompareConfig, task: str, study: Path, out: Path) -> dict[str, tuple[str, dict]]:
    """{run name: (method, settings)}: for each method whose choice, over the study's trials and the
    edge points done so far, sits on the first or last value of a tuned coordinate among them, the
    point one step past it (the other settings kept). Empty when every choice is inside."""
    points = {}
    for m in cfg.methods:
        ts = trials(cfg, task, study, out, m)
        best = chosen(ts)
        keys = spec_of_variant(m).tuned  # ("lr", "beta") or dpo's ("algorithm_settings.dpo_lr", ...)
        for key, grid in zip(keys, cfg.tuning.grid_of(m)[:2], strict=True):
            values = sorted({_get(t.settings, key) for t in ts})
            past = step_past(values, _get(best.settings, key))
            if past:
                side = past[0]
                beyond = sum(v < min(grid) if side == "below" else v > max(grid) for v in values)
                name = f"{m}.{key.rsplit('.', 1)[-1]}-{side}{beyond + 1 if beyond else ''}"
                points[name] = (m, _with(best.settings, key, float(f"{past[1]:.3g}")))
    return points


def _link_models(study: Path, out: Path, task: str, seed: int, part: str = "tuning") -> None:
    """OUT's cell uses the study cell's SFT and reward models and SFT result (links, never copies)
    when STUDY still has both models; otherwise (a cell restored by rloo.experiments.compare.cells keeps only its
    runs' results) run_cell trains them again in OUT from the same seed."""
    src, dst = (r / part / task / f"seed-{seed}" for r in (study, out))
    dst.mkdir(parents=True, exist_ok=True)
    if all((src / m / "model").exists() for m in ("sft", "reward")):
        for m in ("sft", "reward"):
            if not (dst / m).exists():
                (dst / m).symlink_to((src / m).resolve(), target_is_directory=True)


def run(cfg: CompareConfig, study: Path, out: Path, tasks: list[str], seeds: list[int]) -> None:
    """Edge points on the tuning seeds until every choice is inside (a point's next step waits for
    its results on every tuning seed: a process given some seeds stops when only that is left)."""
    for task in tasks:
        while True:
            points = edge_points(cfg, task, study, out)
            todo = {n: p for n, p in points.items() if not all(_done(out, task, s, n) for s in seeds)}
            if not todo:
                break
            for seed in seeds:
                _link_models(study, out, task, seed)
                run_cell(cfg, task, seed, out / "tuning", todo, split="valid")


def _done(out: Path, task: str, seed: int, name: str) -> bool:
    return (tuning_root(out, task, seed) / name / "result.json").exists()


def moved(cfg: CompareConfig, study: Path, out: Path, task: str) -> dict[str, Trial]:
    """{method: its choice now} for the methods whose choice the edge points changed."""
    out_ = {}
    for m in cfg.methods:
        ts = trials(cfg, task, study, out, m)
        if not chosen(ts).name.startswith(f"{m}.t"):
            out_[m] = chosen(ts)
    return out_


def run_reported(cfg: CompareConfig, study: Path, out: Path, tasks: list[str], seeds: list[int]) -> None:
    """Each changed choice on the reported seeds, as compare runs a method at its choice (the study's
    SFT and reward models of each seed, the evaluation prompts): OUT/runs/<task>/seed-<s>/<name>."""
    for task in tasks:
        variants = {t.name: (m, t.settings) for m, t in moved(cfg, study, out, task).items()}
        for seed in seeds:
            _link_models(study, out, task, seed, part="runs")
            run_cell(cfg, task, seed, out / "runs", variants, split="eval") if variants else None


def report(cfg: CompareConfig, study: Path, out: Path) -> str:
    rows = [
        "| task | method | the study's choice (validation) | point past the edge | its validation | "
        "past - choice, per seed | chosen now |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in cfg.tasks:
        pending = edge_points(cfg, task, study, out)
        for m in cfg.methods:
            ts = trials(cfg, task, study, out, m)
            first, now = chosen([t for t in ts if t.name.startswith(f"{m}.t")]), chosen(ts)
            for t in ts:
                if not t.name.startswith(f"{m}.t"):
                    diff = ", ".join(f"{p - c:+.3f}" for p, c in zip(t.scores, first.scores, strict=True))
                    rows.append(
                        f"| {task} | {m} | {_short(first.settings)} ({_mean(first.scores):.3f}) | "
                        f"{_short(t.settings)} | {_mean(t.scores):.3f} | {diff} | {'YES' if t is now else 'no'} |"
                    )
            rows += [f"| {task} | {m} | | {_short(s)} | not run | | |" for n, (mm, s) in pending.items() if mm == m]
    return "\n".join(rows) + "\n\n" + reported_table(cfg, study, out)


def reported_table(cfg: CompareConfig, study: Path, out: Path) -> str:
    """For each changed choice: its win rate on the reported seeds against the study's run of the
    method and against rloo's, paired by seed (95% t-intervals)."""
    rows = [
        "| task | method at its new choice | win rate (reported seeds) | the study's choice | new - study's choice | "
        "new - rloo | study's choice - rloo |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in cfg.tasks:
        for m, t in moved(cfg, study, out, task).items():
            try:
                new, old, base = (
                    _reported(r, task, n, cfg.seeds) for r, n in ((out, t.name), (study, m), (study, DEFAULT_METHOD))
                )
            except FileNotFoundError:
                rows.append(f"| {task} | {m}: {_short(t.settings)} | not run | | | | |")
                continue
            rows.append(
                f"| {task} | {m}: {_short(t.settings)} | {_ci(new)[1:]} | {_ci(old)[1:]} | {_ci(_minus(new, old))} | "
                f"{_ci(_minus(new, base))} | {_ci(_minus(old, base))} |"
            )
    return "\n".join(rows)


def _reported(root: Path, task: str, name: str, seeds: list[int]) -> list[float]:
    return [
        json.loads((root / "runs" / task / f"seed-{s}" / name / "result.json").read_text())["win_rate"] for s in seeds
    ]


def _ci(xs: list[float]) -> str:
    return "{:+.3f} ± {:.3f}".format(*mean_ci(xs))


def _minus(a: list[float], b: list[float]) -> list[float]:
    return [x - y for x, y in zip(a, b, strict=True)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def grids(cfg: CompareConfig, study: Path) -> str:
    out = []
    for task in cfg.tasks:
        selection = json.loads((study / "tuning" / task / "selection.json").read_text())
        for m in cfg.methods:
            entry, keys = selection[m], spec_of_variant(m).tuned
            lrs = cfg.tuning.grid_of(m)[0]
            rows: dict[str, dict[float, str]] = {}
            for i, t in enumerate(entry["trials"]):
                s = t["settings"]
                upd = s.get("algorithm_settings", {})
                row = f"{keys[1].rsplit('.', 1)[-1]} {_get(s, keys[1]):g}" + (
                    f", {upd['ppo_epochs']}x{upd['num_minibatches']}" if "ppo_epochs" in upd else ""
                )
                star = "**" if i == entry["chosen"] else ""
                rows.setdefault(row, {})[_get(s, keys[0])] = f"{star}{t['score']:.3f}{star}"
            out += [
                f"\n### {task}, {m}\n",
                f"| | {' | '.join(f'{keys[0].rsplit(chr(46), 1)[-1]} {x:g}' for x in lrs)} |",
            ]
            out.append("|---" * (len(lrs) + 1) + "|")
            out += [f"| {r} | {' | '.join(v.get(x, '') for x in lrs)} |" for r, v in rows.items()]
    return "\n".join(out)


def _short(settings: dict) -> str:
    flat = {k: v for k, v in settings.items() if k != "algorithm_settings"} | settings.get("algorithm_settings", {})
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in flat.items())


def reproduce(cfg: CompareConfig, study: Path, out: Path, which: str) -> bool:
    task, name = which.split("/", 1)
    seed = cfg.tuning.seeds[0]
    method, i = name.rsplit(".t", 1)
    settings = trial_settings(cfg.tuning, method)[int(i)]
    _link_models(study, out, task, seed)
    run_cell(cfg, task, seed, out / "tuning", {name: (method, settings)}, split="valid")
    same = True
    for part in ("sft", name):  # the SFT model's own evaluation too (retrained when STUDY lost it)
        saved, again = (
            json.loads((tuning_root(r, task, seed) / part / "result.json").read_text()) for r in (study, out)
        )
        differ = sorted(k for k in saved.keys() | again.keys() if k != "seconds" and saved.get(k) != again.get(k))
        print(f"{task}/{part} seed {seed}: " + (f"DIFFERS in {differ}" if differ else "every field but seconds equal"))
        same = same and not differ
    return same


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("study", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--tasks", default=None)
    p.add_argument("--seeds", default=None)
    p.add_argument("--report", action="store_true")
    p.add_argument("--reproduce", default=None, metavar="TASK/TRIAL")
    p.add_argument("--grids", action="store_true")
    p.add_argument("--reported", action="store_true", help="run each changed choice on the reported seeds")
    args = p.parse_args(argv)
    cfg = CompareConfig(**yaml.safe_load((args.study / "config.yaml").read_text()))
    if args.grids:
        print(grids(cfg, args.study))
        return 0
    if args.report:
        print(report(cfg, args.study, args.out))
        return 0
    if args.reproduce:
        return 0 if reproduce(cfg, args.study, args.out, args.reproduce) else 1
    tasks = args.tasks.split(",") if args.tasks else list(cfg.tasks)
    if args.reported:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(cfg.seeds)
        run_reported(cfg, args.study, args.out, tasks, seeds)
        return 0
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(cfg.tuning.seeds)
    run(cfg, args.study, args.out, tasks, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
