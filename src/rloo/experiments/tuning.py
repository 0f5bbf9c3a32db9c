"""Tuning in `rloo compare`: each method's trials, and the choice among them.

Every method gets `tuning.trials` trials drawn from its grid (lr x beta, times (ppo_epochs,
num_minibatches) for the methods that take several steps per batch). A trial is an ordinary
compare run, in out/tuning/<task>/seed-<s>/<method>.t<i>/, trained with a tuning seed and judged on
that seed's validation prompts (the task's `valid` split, never an evaluation prompt). The choice
reads only those validation results: the trial with the highest mean score over the tuning seeds.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
import stat
from pathlib import Path

from rloo.config.methods import spec_of_variant
from rloo.config.tools import TuningSettings
from rloo.errors import RlooError, option
from rloo.experiments.readback import RESULT_NUMBERS, result_shape_problem
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.confine import make_folder


def read_result(path: Path) -> dict:
    """A run's result.json as `rloo compare` wrote it (atomically, last: the run is done once it is
    there). One RlooError line naming the file when it is a link, not a regular file, not JSON or not
    an object: a result damaged or edited by hand is neither guessed from nor replaced."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # never read through a link
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise _damaged(path, "it is a symbolic link, which rloo never reads or writes through") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _damaged(path, "it is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = json.loads(fh.read().decode())
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError: cut off or edited
        raise _damaged(path, f"it is not valid JSON ({str(e).splitlines()[0][:80]})") from None
    finally:
        os.close(fd)
    if not isinstance(data, dict):
        raise _damaged(path, f"it holds a {type(data).__name__}, not the object rloo writes")
    why = result_shape_problem(data)  # `{}`, NaN or null where a number goes: a KeyError in the report before
    if why:
        raise _damaged(path, why)
    return data


def read_reported_result(path: Path) -> dict:
    """`read_result`, and the numbers the report plots and tabulates are there (RESULT_NUMBERS): a
    reported run's result.json holding `{}` was a KeyError in the report's plots."""
    data = read_result(path)
    why = result_shape_problem(data, RESULT_NUMBERS)
    if why:
        raise _damaged(path, why)
    return data


def _damaged(path: Path, why: str) -> RlooError:
    return RlooError(
        f"the run result {path} cannot be used: {why}; remove it to make that run again, or rerun with "
        f"{option('overwrite')} to start the study over (nothing was changed)"
    )


def trial_settings(tuning: TuningSettings, method: str) -> list[dict]:
    """The `tuning.trials` settings a method is tried at, drawn from tuning.grid_of(method): each an
    override of the method's rl settings ({"lr", "beta"} or, for dpo, {"algorithm_settings":
    {"dpo_lr", "dpo_beta"}}, plus ppo_epochs/num_minibatches for the multi-step methods). Methods
    with the same grid size get the same draw of grid indices (one draw per size), in grid order."""
    tuned = spec_of_variant(method).tuned  # (lr, beta), or dpo's own (algorithm_settings.dpo_lr, ...)
    grid = list(itertools.product(*tuning.grid_of(method)))  # its own grid (tuning.grids) or the shared one
    picked = sorted(
        random.Random(f"rloo.tuning/{tuning.search_seed}/{len(grid)}").sample(range(len(grid)), tuning.trials)
    )
    out = []
    for lr, beta, upd in (grid[i] for i in picked):
        over: dict = {k: v for k, v in zip(tuned, (lr, beta), strict=True) if "." not in k}
        algo = {k.split(".", 1)[1]: v for k, v in zip(tuned, (lr, beta), strict=True) if "." in k}
        if upd is not None:
            algo |= {"ppo_epochs": upd[0], "num_minibatches": upd[1]}
        out.append(over | ({"algorithm_settings": algo} if algo else {}))
    return out


def trial_name(method: str, i: int) -> str:
    return f"{method}.t{i:02d}"


def trial_variants(tuning: TuningSettings, methods: list[str]) -> dict[str, tuple[str, dict]]:
    """{run name: (method, settings)} of every trial of every method (the runs of one tuning cell)."""
    return {trial_name(m, i): (m, s) for m in methods for i, s in enumerate(trial_settings(tuning, m))}


def select_trial(scores: list[list[float]], kls: list[list[float]] | None = None, max_kl: float | None = None) -> int:
    """Index of the chosen trial. scores[i][j]: validation score of trial i on tuning seed j (the
    same seeds for every trial); kls[i][j] its validation KL. The trial with the highest mean score
    among those whose mean KL is at most max_kl (all when None, or when none qualifies); a tie goes
    to the earlier trial. Only validation numbers enter: the caller passes nothing else."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    ok = list(range(len(scores)))
    if max_kl is not None and kls is not None:
        ok = [i for i in ok if mean(kls[i]) <= max_kl] or ok
    return max(ok, key=lambda i: (mean(scores[i]), -i))


def tuning_root(out: Path, task: str, seed: int) -> Path:
    return out / "tuning" / task / f"seed-{seed}"


def tuning_done(
    out: Path, tuning: TuningSettings, methods: list[str], task: str, seeds: list[int] | None = None
) -> bool:
    """Whether every trial of every method has its validation result on every tuning seed (of `seeds`)."""
    names = trial_variants(tuning, methods)
    return all((tuning_root(out, task, s) / n / "result.json").exists() for s in seeds or tuning.seeds for n in names)


def view_names(tuning: TuningSettings, methods: list[str]) -> dict[str, tuple[str, tuple[int, int]]]:
    """{view name: (method, (epochs, minibatches))} of tuning.update_views, e.g. ppo@2x2: the method
    chosen among its trials at those updates only (methods not compared have no view)."""
    return {f"{m}@{e}x{n}": (m, (e, n)) for m, ps in tuning.update_views.items() if m in methods for e, n in ps}


def base_of(name: str) -> str:
    """The method of a reported name: `ppo` for the view `ppo@2x2`, the name itself otherwise."""
    return name.split("@", 1)[0]


def updates_of(settings: dict) -> tuple[int, int] | None:
    a = settings.get("algorithm_settings", {})
    return (a["ppo_epochs"], a["num_minibatches"]) if "ppo_epochs" in a else None


def untuned_name(method: str) -> str:
    return f"{method}@untuned"


def report_names(cfg) -> list[str]:
    """cfg.methods with each method's update views after it (the rows of a tuned report), then each
    method's untuned run (tuning.untuned)."""
    if not cfg.tuning.trials:
        return list(cfg.methods)
    views = view_names(cfg.tuning, cfg.methods)
    names = [n for m in cfg.methods for n in (m, *(v for v, (b, _) in views.items() if b == m))]
    return names + ([untuned_name(m) for m in cfg.methods] if cfg.tuning.untuned else [])


def choose(out: Path, tuning: TuningSettings, methods: list[str], task: str) -> dict[str, dict]:
    """{method or view: chosen settings} from the trials' validation results (tuning must be done);
    a view (view_names) chooses among its method's trials at its updates only. Writes
    out/tuning/<task>/selection.json with every trial's mean validation score and KL."""
    chosen, table = {}, {}
    for m in methods:
        trials = trial_settings(tuning, m)
        res = [
            [read_result(tuning_root(out, task, s) / trial_name(m, i) / "result.json") for s in tuning.seeds]
            for i in range(len(trials))
        ]
        if any(r.get("split") != "valid" for rs in res for r in rs):  # a run judged on other prompts
            raise RuntimeError(f"tuning of {m} on {task}: a trial was not judged on the validation split")
        scores = [[r[tuning.metric] for r in rs] for rs in res]
        kls = [[r["kl"] for r in rs] for rs in res]
        best = select_trial(scores, kls, tuning.max_kl)
        chosen[m] = trials[best]
        table[m] = {
            "chosen": best,
            "trials": [
                {"settings": t, "score": sum(s) / len(s), "kl": sum(k) / len(k)}
                for t, s, k in zip(trials, scores, kls, strict=True)
            ],
        }
    for v, (m, upd) in view_names(tuning, methods).items():
        idx = [i for i, t in enumerate(trial_settings(tuning, m)) if updates_of(t) == upd]
        if not idx:  # the draw gave the method no trial at these updates
            continue
        sub = [table[m]["trials"][i] for i in idx]
        best = select_trial([[t["score"]] for t in sub], [[t["kl"]] for t in sub], tuning.max_kl)  # the means
        chosen[v] = trial_settings(tuning, m)[idx[best]]
        table[v] = {"of": m, "chosen": best, "trials": [t | {"index": i} for i, t in zip(idx, sub, strict=True)]}
    make_folder(out / "tuning" / task)
    atomic_write_text(out / "tuning" / task / "selection.json", json.dumps(table, indent=1))
    return chosen


def describe(settings: dict) -> str:
    """`lr 1e-04, beta 0.25, 2x2 updates` for the report."""
    a = settings.get("algorithm_settings", {})
    parts = [f"lr {settings.get('lr', a.get('dpo_lr')):.0e}", f"beta {settings.get('beta', a.get('dpo_beta')):g}"]
    if "ppo_epochs" in a:
        parts.append(f"{a['ppo_epochs']}x{a['num_minibatches']} updates")
    return ", ".join(parts)
