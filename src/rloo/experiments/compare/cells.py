"""Carry a long `rloo compare` study across sessions whose run folders are not kept.

`rloo compare` treats a run as done when its folder holds result.json: a tuning trial (the choice
reads only the trials' result.json, rloo.experiments.tuning.choose) and a reported run alike
(rloo.experiments.compare.run_cell skips it). A cell's remaining runs also read its SFT model's
evaluation (sft/result.json) and train from its SFT and reward models; the report reads every
reported run's result.json and metrics.jsonl (the equal-KL and equal-compute views). So `save`
keeps, from an output folder:
  - config.yaml (the study's settings: a resumed folder must hold the same, or compare refuses)
  - every cell's sft/result.json, every done run's result.json, and a reported run's metrics.jsonl
    (gzipped; a trial's is not read by anything)
  - the SFT and reward models of the cells begun but not finished (~6 MB a cell): retrained in
    another session they could differ in the last bits (another CPU kind: other kernels), and the
    cell's runs would not all start from the same model
  - manifest.json: the CPU kind each run was made on (recorded by the save after the session that
    made it; entries of earlier saves are kept)
and `restore` puts them into a fresh output folder, marked as a comparison, so that `rloo compare`
with the same settings continues with the runs not done.

    python -m rloo.experiments.compare.cells save /work/tuned-runs/study docs/results/compare-tuned-all/cells
    python -m rloo.experiments.compare.cells restore docs/results/compare-tuned-all/cells /work/tuned-runs/study
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
import time
from pathlib import Path

from rloo.config import CompareConfig, load_config
from rloo.errors import RlooError
from rloo.experiments.tuning import read_result, report_names, trial_variants, tuning_done, view_names
from rloo.runtime.runfolder.atomic import atomic_write_bytes, atomic_write_text
from rloo.runtime.runfolder.layout import is_bookkeeping_only, kind_of, write_marker
from rloo.runtime.runfolder.lock import is_busy
from rloo.runtime.runfolder.reading import read_bytes, read_text

STAGES = ("sft", "reward")


def cpu_kind() -> str:
    """avx512_bf16, avx512, avx2 or other: the widest vector ISA of this CPU (/proc/cpuinfo flags),
    which picks the float32 kernels (so a run's last bits) and whether `dtype: auto` would use bf16."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = set(next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []))
    return next(
        (k for k, f in (("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")) if f in flags), "other"
    )


def study_config(out: Path) -> CompareConfig:
    """The settings of study folder `out`; RlooError (one line) when `out` is another run's folder (its
    config.yaml would fail as a comparison's, key by key, in one very long line) or no run's."""
    kind = kind_of(out)
    if kind != "compare":
        if kind:
            what = f"is an `rloo {kind}` run's folder, not a study"
        else:
            what = "holds no rloo run, so it is not a study" if out.is_dir() else "does not exist"
        raise RlooError(f"{out} {what}; a study is the output_dir of `rloo compare`")
    return load_config(CompareConfig, out / "config.yaml")


def cells(out: Path) -> list[Path]:
    """Every cell folder of a study: tuning/<task>/seed-<s> and runs/<task>/seed-<s>."""
    return sorted(p for top in ("tuning", "runs") for p in (out / top).glob("*/seed-*") if p.is_dir())


def cell_done(out: Path, cell: Path, cfg: CompareConfig) -> bool:
    """Whether `rloo compare` would run nothing more in this cell."""
    task, seed = cell.parent.name, int(cell.name.removeprefix("seed-"))
    if cell.parent.parent.name == "tuning":
        return tuning_done(out, cfg.tuning, cfg.methods, task, seeds=[seed])
    views = view_names(cfg.tuning, cfg.methods) if cfg.tuning.trials else {}
    names = [n for n in report_names(cfg) if n not in views]  # a view may share its method's run
    return all((cell / n / "result.json").exists() for n in names) and all(
        (cell / v / "result.json").exists() or _at_updates(cell / m / "result.json", upd)
        for v, (m, upd) in views.items()
    )


def _at_updates(result: Path, upd: tuple[int, int]) -> bool:
    a = read_result(result).get("settings", {}).get("algorithm_settings", {})
    return (a.get("ppo_epochs"), a.get("num_minibatches")) == upd


def save(out: Path, dest: Path) -> dict[str, int]:
    """Copy what resuming needs (the module's docstring) from study folder `out` into `dest`; returns
    {"runs": done runs saved, "cells_with_models": unfinished cells whose models were saved}."""
    cfg = study_config(out)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "config.yaml", dest / "config.yaml")
    manifest_file = dest / "manifest.json"
    manifest = json.loads(read_text(manifest_file)) if manifest_file.exists() else {}
    runs = models = 0
    for cell in cells(out):
        rel = cell.relative_to(out)
        for run in sorted(p for p in cell.iterdir() if (p / "result.json").exists()):
            to = dest / rel / run.name
            to.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(run / "result.json", to / "result.json")
            if rel.parts[0] == "runs" and (run / "metrics.jsonl").exists():
                atomic_write_bytes(to / "metrics.jsonl.gz", gzip.compress(read_bytes(run / "metrics.jsonl"), mtime=0))
            if run.name not in STAGES:
                runs += 1
                manifest.setdefault(str(rel / run.name), {"cpu": cpu_kind(), "saved": time.strftime("%Y-%m-%d")})
        unfinished = (cell / "sft" / "model").is_dir() and not cell_done(out, cell, cfg)
        for stage in STAGES if unfinished else ():
            if (cell / stage / "model").is_dir() and not is_busy(cell / stage):  # not while it is written
                shutil.copytree(cell / stage / "model", dest / rel / stage / "model", dirs_exist_ok=True)
        models += unfinished
        for stage in STAGES if not unfinished else ():  # models saved by an earlier save: no longer needed
            shutil.rmtree(dest / rel / stage / "model", ignore_errors=True)
    atomic_write_text(manifest_file, json.dumps(manifest, indent=1, sort_keys=True))
    return {"runs": runs, "cells_with_models": models}


def restore(src: Path, out: Path) -> int:
    """Put a save into `out` (missing or empty): its runs, models and config, the folder marked as a
    comparison, so `rloo compare` with the same settings resumes there. Returns the runs restored."""
    if out.exists() and not is_bookkeeping_only(out):
        raise RlooError(f"{out} is not empty; restore into a fresh output folder (nothing was copied)")
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in sorted(p for p in src.rglob("*") if p.is_file() and p.name != "manifest.json"):
        to = out / f.relative_to(src)
        to.parent.mkdir(parents=True, exist_ok=True)
        if f.name == "metrics.jsonl.gz":
            atomic_write_bytes(to.with_suffix(""), gzip.decompress(f.read_bytes()))
        else:
            shutil.copyfile(f, to)
        n += f.name == "result.json" and f.parent.name not in STAGES
    write_marker(out, "compare")
    return n


def progress(out: Path) -> str:
    """`done/all trials, done reported cells` of a study folder, for a status line."""
    cfg = study_config(out)
    names = trial_variants(cfg.tuning, cfg.methods)
    trials = [tuning_root_cell / n for tuning_root_cell in _tuning_cells(out, cfg) for n in names]
    done = sum((t / "result.json").exists() for t in trials)
    reported = [out / "runs" / t / f"seed-{s}" for t in cfg.tasks for s in cfg.seeds]
    cells_done = sum(c.is_dir() and cell_done(out, c, cfg) for c in reported)
    return f"{done}/{len(trials)} tuning trials, {cells_done}/{len(reported)} reported cells done"


def _tuning_cells(out: Path, cfg: CompareConfig) -> list[Path]:
    return [out / "tuning" / t / f"seed-{s}" for t in cfg.tasks for s in cfg.tuning.seeds] if cfg.tuning.trials else []


def main(argv: list[str]) -> int:
    usage = "usage: python -m rloo.experiments.compare.cells save OUT DEST | restore DEST OUT | progress OUT"
    if (
        len(argv) < 2
        or argv[0] not in ("save", "restore", "progress")
        or len(argv) != (2 if argv[0] == "progress" else 3)
    ):
        print(usage, file=sys.stderr)
        return 2
    try:
        if argv[0] == "save":
            print(f"saved {save(Path(argv[1]), Path(argv[2]))} into {argv[2]} ({progress(Path(argv[1]))})")
        elif argv[0] == "restore":
            print(f"restored {restore(Path(argv[1]), Path(argv[2]))} runs into {argv[2]} ({progress(Path(argv[2]))})")
        else:
            print(progress(Path(argv[1])))
    except (RlooError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
