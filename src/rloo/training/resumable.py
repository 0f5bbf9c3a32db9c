"""What `--resume` may continue, decided before any model loads or any file is written:

- a run folder that does not exist, or holds nothing of a run (empty, or only a lock), has nothing
  to resume: refused in one line (a typo in output_dir started a fresh full run);
- a finished run (its final outputs written, `FINAL`) with no checkpoint has nothing left to do:
  refused in one line, nothing changed (it was trained again and its model/ rewritten);
- a run of this kind that has started continues from its newest whole checkpoint, or from step 0
  when it saved none (killed before its first), as the stages say.
"""

from __future__ import annotations

from pathlib import Path

from rloo.errors import RlooError, option
from rloo.runtime.runfolder.layout import holds_a_run, kind_of, run_kind

# What a stage writes last, once its training is over: a folder holding these is a finished stage
FINAL = {"sft": ("model",), "reward": ("model", "accuracy.json"), "train": ("model",)}


def is_finished(out: Path, kind: str) -> bool:
    """Whether `out` holds a run of `kind` whose final outputs (FINAL) are written."""
    out = Path(out)
    return out.is_dir() and kind_of(out) == kind and all((out / f).exists() for f in FINAL.get(kind, ("model",)))


def check_something_to_resume(out: Path, kind: str) -> None:
    """RlooError (one line) when `out` holds nothing of a run to resume: it does not exist, or it is
    empty or holds only a lock (a run of another kind, or files not rloo's, are refused as such
    when the run folder is prepared: rloo.training.common.prepare_output_dir)."""
    out = Path(out)
    if holds_a_run(out):
        return
    what = "does not exist" if not out.exists() else "holds no run"
    raise RlooError(
        f"nothing to resume: {out} {what}; check output_dir, or drop {option('resume')} to start a new run there"
    )


def refuse_finished(cfg) -> None:
    """RlooError (one line, nothing changed) for `--resume` of a finished run with no checkpoint to
    continue from (called once none was found)."""
    out, kind = Path(cfg.output_dir), run_kind(cfg)
    if is_finished(out, kind):
        raise RlooError(
            f"nothing to resume: {out} holds a finished {kind} run (its model: {out / 'model'}) and no checkpoint "
            f"to continue from; nothing was changed. To train it again pass {option('overwrite')}"
        )
