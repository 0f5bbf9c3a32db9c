"""How far off-policy can RLOO go, with which estimator? (docs/async.md, "Bounded estimators")

    S=benchmarks/studies/offpolicy_study.py
    python $S base RUNS                                            # the SFT model, once
    python $S run RUNS --seeds 0-9 --cells 1e-4:0:paper,1e-4:16:tis,...   # resumable
    python $S collect RUNS --seeds 0-9 --cells ... --out results.json.xz # every run's numbers
    python $S report results.json.xz --cells ...                     # the table (or from RUNS)
    python $S collect RUNS2 --seeds 0-9 --cells ... --into results.json.xz   # a later session's cells, merged
    python $S cost RUNS --cells 1e-4:16:none,1e-4:16:tis,... --steps 12   # s/update side by side

`base` runs `rloo pipeline task=TASK seed=0 rl.steps=20` into RUNS/base: one SFT model and the pipeline's
RL and evaluation configs, shared by every cell and seed (the question is the estimator, not the SFT
model: one SFT model takes the SFT stage's variance out of every difference). A cell LR:N:CORR trains
the RL stage again from that model (`rloo train -c RUNS/base/rl/config.yaml lr=LR max_staleness=N
is_correction=CORR seed=S steps=STEPS`, the rest the pipeline's) into RUNS/lr<LR>/N<N>-<CORR>/seed<S>,
then evaluates it like the pipeline's evaluation stage (`rloo eval -c RUNS/base/eval/config.yaml`: the
same held-out prompts for every run: pass@1 from the checker on a checker task such as arithmetic, the
win rate against the references by the gold judge on the demo's summarize). CORR `paper` is the paper's update
(is_correction unset; N must be 0). The seed changes the RL stage's sampling and the evaluation's
samples; every cell of a seed shares them, so differences between cells of one seed are paired.

Runs are in this process (`rloo.cli.main`: no interpreter start per run); a finished run (its
eval/summary.json) is skipped, so an interrupted study continues where it stopped (seed by seed:
`run --seeds 0-4` first, then `--seeds 5-9` where the intervals are still wide).

The demo: `base RUNS --task summarize`, then `run RUNS --steps 100 ...` (the pipeline's RL length).

`report` (from RUNS or from `collect`'s results.json): per cell the mean final score over seeds,
the paired difference in points to the same lr's N = 0 paper run and to the same lr and N's `none`
and `tis` runs, each with the half-width of its 95% t-interval over seeds; the median seconds per RL
step; the logged share of clipped, truncated or masked samples (is/clipped, is/truncated,
is/masked: means over steps and seeds).
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import statistics
import sys
import time
from pathlib import Path

# 97.5% quantiles of Student's t by degrees of freedom (a table: no scipy in rloo's dependencies)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
        19: 2.093, 20: 2.086, 24: 2.064, 29: 2.045, 39: 2.023}  # fmt: skip
STAT_KEYS = ("is/clipped", "is/truncated", "is/masked")  # the shares the table shows
SCORE_KEYS = ("pass@1", "win_rate")  # a checker task's pass@1; a judged task's win rate (summarize)


def rloo(*argv: str) -> None:
    from rloo.cli import main

    rc = main(list(argv))
    if rc:
        raise SystemExit(f"rloo {' '.join(argv)}: exit {rc}")


def base(runs: Path, task: str, extra: list[str]) -> None:
    out = runs / "base"
    if (out / "summary.json").exists():
        return
    rloo("pipeline", f"task={task}", "seed=0", f"output_dir={out}", "report_to=none", *extra, "--overwrite")


def run_dir(runs: Path, cell: str, seed: int) -> Path:
    lr, n, corr = cell.split(":")
    return runs / f"lr{lr}" / f"N{n}-{corr}" / f"seed{seed}"


def run_one(runs: Path, cell: str, seed: int, steps: int, eval_args: list[str], train_args: list[str]) -> bool:
    out = run_dir(runs, cell, seed)
    if (out / "eval" / "summary.json").exists():
        return False
    lr, n, corr = cell.split(":")
    if corr == "paper" and n != "0":
        raise SystemExit(f"{cell}: the paper's update is on-policy (N = 0)")
    train = [f"output_dir={out}", f"lr={lr}", f"max_staleness={n}", f"seed={seed}", f"steps={steps}"]
    train += ([] if corr == "paper" else [f"is_correction={corr}"]) + train_args
    t0 = time.perf_counter()
    rloo("train", "-c", str(runs / "base" / "rl" / "config.yaml"), *train, "eval_every=null", "report_to=none",
         "--overwrite")  # fmt: skip
    ev = [f"policy={out / 'model'}", f"output_dir={out / 'eval'}", "baseline=null", f"seed={seed}", *eval_args]
    rloo("eval", "-c", str(runs / "base" / "eval" / "config.yaml"), *ev, "--overwrite")
    print(f"done {cell} seed {seed} in {time.perf_counter() - t0:.0f} s", flush=True)
    return True


def cost(runs: Path, lr: str, n: int, corrs: list[str], rounds: int, steps: int) -> dict[str, dict[str, float]]:
    """Seconds per update of each estimator, side by side: `rounds` rounds of a short run of every
    estimator in turn (the same lag, lr and seed; the order reversed every other round), in this
    process, so that a neighbour's load falls on all alike. Per estimator the median over every
    round's steps of time/update (the loss and its backward pass: where the estimators differ) and
    of the whole step (sampling and scoring too, the same work for every estimator)."""
    times: dict[str, dict[str, list[float]]] = {c: {"update": [], "step": []} for c in corrs}
    for r in range(rounds):
        for corr in corrs if r % 2 == 0 else corrs[::-1]:
            out = runs / "cost" / f"round{r}" / corr
            train = [f"output_dir={out}", f"lr={lr}", f"max_staleness={n}", f"steps={steps}", "eval_every=null"]
            train += [] if corr == "paper" else [f"is_correction={corr}"]
            rloo("train", "-c", str(runs / "base" / "rl" / "config.yaml"), *train, "report_to=none", "--overwrite")
            rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            for row in rows[1:]:  # the first step warms up (allocations, oneDNN's kernels)
                if "time/update" in row:
                    times[corr]["update"].append(row["time/update"])
                    times[corr]["step"].append(sum(v for k, v in row.items() if k.startswith("time/")))
    return {c: {k: statistics.median(v) for k, v in t.items()} for c, t in times.items()}


def final_score(runs: Path, cell: str, seed: int) -> dict[str, float] | None:
    """The run's evaluation: {"pass@1": ...} on a checker task, {"win_rate": ...} on a judged one."""
    f = run_dir(runs, cell, seed) / "eval" / "summary.json"
    if not f.exists():
        return None
    policy = json.loads(f.read_text())["policy"]
    if "pass" in policy:
        return {"pass@1": policy["pass"]["pass_at_k"]["1"]["mean"]}
    return {"win_rate": policy["win_rate"]}


def score(run: dict) -> float:
    """A collected run's score, whichever the task's (SCORE_KEYS)."""
    return next(run[k] for k in SCORE_KEYS if k in run)


def run_stats(runs: Path, cell: str, seed: int) -> dict[str, float]:
    """Means over the run's steps of the logged is/ shares, and its median seconds per step."""
    rows = [json.loads(x) for x in (run_dir(runs, cell, seed) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/update" in r]  # the training steps (not the periodic evaluations)
    out = {k: statistics.fmean(r[k] for r in rows if k in r) for k in STAT_KEYS if any(k in r for r in rows)}
    times = [sum(v for k, v in r.items() if k.startswith("time/")) for r in rows]
    if times:  # sampling, scoring and the update (time/rollout, time/score, time/update)
        out["step_s"] = statistics.median(times)
    return out


def collect(runs: Path, seeds: list[int], cells: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """cell -> seed -> {"pass@1" or "win_rate": ..., the run's stats}: every finished run, what
    `report` reads (results.json here: the study's numbers without its models)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for cell in cells:
        for seed in seeds:
            if (got := final_score(runs, cell, seed)) is not None:
                out.setdefault(cell, {})[str(seed)] = got | run_stats(runs, cell, seed)
    return out


def load(path: Path) -> dict:
    """A results file `collect` wrote: JSON, xz-compressed where the name ends in .xz (the committed
    ones: a tenth of the size, so docs/results stays under its 3 MB)."""
    raw = path.read_bytes()
    return json.loads(lzma.decompress(raw) if path.suffix == ".xz" else raw)


def save(path: Path, text: str) -> None:
    """`load`'s inverse: the text, xz-compressed where the name ends in .xz."""
    data = text.encode()
    path.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME) if path.suffix == ".xz" else data)


def merge(into: dict, new: dict) -> dict:
    """`new`'s cells added to a committed results dict (a later session's runs of the same frozen code):
    a new cell after the last cell of its lr:N (a new lr:N at the end), a committed cell's new seeds
    beside its own, in seed order; a seed both hold keeps the committed numbers (its s/step)."""
    out = dict(into)
    for cell, by_seed in new.items():
        if cell in out:
            both = by_seed | out[cell]
            out[cell] = {s: both[s] for s in sorted(both, key=int)}
            continue
        items, group = list(out.items()), cell.rsplit(":", 1)[0]
        at = max((i + 1 for i, (c, _) in enumerate(items) if c.rsplit(":", 1)[0] == group), default=len(items))
        out = dict(items[:at] + [(cell, by_seed)] + items[at:])
    return out


def dump(results: dict) -> str:
    """results.json's text: a line per cell; scores to 6 significant digits (exact: counts over at most
    1600 samples), the rest to the 3 the report prints (docs/results stays under its 3 MB)."""

    def digits(k: str, v: float) -> float:
        return float(f"{v:.6g}") if k in SCORE_KEYS else float(f"{v:.3g}")

    rounded = {c: {s: {k: digits(k, v) for k, v in r.items()} for s, r in by.items()} for c, by in results.items()}
    compact = lambda x: json.dumps(x, separators=(",", ":"))  # noqa: E731 - no spaces: 12% of the file
    return "{\n" + ",\n".join(f"{json.dumps(c)}:{compact(by)}" for c, by in rounded.items()) + "\n}\n"


def interval(diffs: list[float]) -> tuple[float, float | None]:
    """Mean and 95% t half-width of paired differences (points)."""
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, None
    dof = len(diffs) - 1
    t = T975.get(dof) or next((v for d, v in sorted(T975.items()) if d >= dof), 1.96)
    return mean, t * statistics.stdev(diffs) / math.sqrt(len(diffs))


def paired(results: dict, cell: str, other: str) -> dict | None:
    """The cell minus another at the seeds both have, in points."""
    a, b = results.get(cell, {}), results.get(other, {})
    diffs = [100 * (score(a[s]) - score(b[s])) for s in a if s in b]
    if not diffs or cell == other:
        return None
    mean, half = interval(diffs)
    return {"vs": other, "seeds": len(diffs), "diff": mean, "ci95": half}


def report(results: dict, cells: list[str]) -> list[dict]:
    table = []
    for cell in cells:
        lr, n, _ = cell.split(":")
        runs = results.get(cell, {})
        if not runs:
            continue
        keys = {k for r in runs.values() for k in r if k not in SCORE_KEYS}
        metric = next(k for k in SCORE_KEYS if k in next(iter(runs.values())))
        row = {"cell": cell, "seeds": len(runs), "metric": metric}
        row["mean"] = statistics.fmean(score(r) for r in runs.values())
        row["stats"] = {k: statistics.fmean(r[k] for r in runs.values() if k in r) for k in keys}
        others = [f"{lr}:0:paper", f"{lr}:{n}:none", f"{lr}:{n}:tis"]
        row["paired"] = [p for o in others if (p := paired(results, cell, o))]
        table.append(row)
    return table


def markdown(table: list[dict]) -> str:
    metric = table[0].get("metric", "pass@1").replace("_", " ") if table else "pass@1"
    head = f"| lr | N | estimator | seeds | {metric} | minus N = 0 | minus none | minus tis | s/step | "
    head += "clipped / truncated / masked |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for row in table:
        lr, n, corr = row["cell"].split(":")
        by = {p["vs"].split(":", 1)[1]: p for p in row["paired"]}

        def cmp(key: str, by: dict = by) -> str:
            p = by.get(key)
            return "-" if p is None else f"{p['diff']:+.1f}" + (f" ± {p['ci95']:.1f}" if p["ci95"] is not None else "")

        st = row["stats"]
        shares = " / ".join(f"{100 * st[k]:.1f}%" if k in st else "-" for k in STAT_KEYS)
        step = f"{st['step_s']:.2f}" if "step_s" in st else "-"
        lines.append(f"| {lr} | {n} | {corr} | {row['seeds']} | {row['mean']:.3f} | {cmp('0:paper')} | "
                     f"{cmp(f'{n}:none')} | {cmp(f'{n}:tis')} | {step} | {shares} |")  # fmt: skip
    return "\n".join(lines)


def seed_list(text: str) -> list[int]:
    """'0-9' or '0,1,2' or '0-4,7'."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("what", choices=["base", "run", "collect", "report", "cost"])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--base-args", default="rl.steps=20", help="KEY=VALUE ... for `base`'s pipeline (RL unused)")
    ap.add_argument("--eval-args", default="pass_samples=8", help="KEY=VALUE ... for every run's `rloo eval`")
    ap.add_argument("--train-args", default="", help="KEY=VALUE ... for every run's `rloo train`")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--cells", default="1e-4:0:paper")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=None)
    ap.add_argument("--into", default=None, help="collect: merge into this results file (`merge`), written in place")
    a = ap.parse_args()
    a.runs = a.runs.absolute()  # base writes it into the stage configs: a relative one only works from its cwd
    seeds, cells = seed_list(a.seeds), a.cells.split(",")
    if a.what == "base":
        base(a.runs, a.task, a.base_args.split())
    elif a.what == "run":
        for seed in seeds:  # seed by seed: a study cut short has every cell at the same seeds
            for cell in cells:
                run_one(a.runs, cell, seed, a.steps, a.eval_args.split(), a.train_args.split())
    elif a.what == "cost":  # --cells LR:N:CORR,... at one LR and N; --steps per run (e.g. 12), 3 rounds
        lr, n, _ = cells[0].split(":")
        res = cost(a.runs, lr, int(n), [c.split(":")[2] for c in cells], rounds=3, steps=a.steps)
        first = res[cells[0].split(":")[2]]
        for corr, t in res.items():
            print(f"| {corr} | {t['update']:.3f} | {t['update'] / first['update']:.2f} | {t['step']:.3f} |")
        if a.out:
            Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "cost": res}, indent=1))
    elif a.what == "collect":  # RUNS -> --out (results.json.xz: compressed); --into: merged into that file
        got = collect(a.runs, seeds, cells)
        save(Path(a.into or a.out), dump(merge(load(Path(a.into)), got) if a.into else got))
    else:  # report from RUNS, or from a results file (results.json.xz) given as RUNS
        results = load(a.runs) if a.runs.is_file() else collect(a.runs, seeds, cells)
        print(markdown(report(results, cells)))


if __name__ == "__main__":
    main()
