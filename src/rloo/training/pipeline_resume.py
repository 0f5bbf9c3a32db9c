"""`rloo pipeline --resume`: the pipeline continues at the stage and step where it stopped.

- the pipeline's settings must be those it was started with (its config.yaml): any change is
  refused in one line, as RL's resume refuses one that changes what its state means;
- a finished stage is kept: its folder holds a run of its kind whose config.yaml is the stage's
  config now (else refused in one line) and its final outputs (`FINAL`), its model files whole;
- the interrupted stage continues from its newest whole checkpoint (bit for bit, as on its own:
  rloo.training.supervised for SFT, the reward model and DPO, rloo.training.rl for the online methods);
- the stages after it run; the evaluation, the last stage, always runs again (it is deterministic
  and writes the summary the pipeline reads back).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import yaml

from rloo.config import upgrade_saved_config
from rloo.errors import RlooError, option
from rloo.runtime.checkpoint.resumecheck import check_resume_config
from rloo.runtime.inputs.weightfiles import check_weight_files
from rloo.runtime.runfolder.layout import is_bookkeeping_only, kind_of, run_kind
from rloo.runtime.runfolder.reading import read_text
from rloo.runtime.tracking.log import say
from rloo.training.loop import RLResult
from rloo.training.resumable import FINAL, check_something_to_resume
from rloo.training.reward import RewardResult

PLOTS = ("reward.png", "kl.png", "win_rate.png")  # rloo.eval.plots.plot_training's files, in its order


def _saved_config(folder: Path) -> dict | None:
    try:
        held = yaml.safe_load(read_text(Path(folder) / "config.yaml"))  # a FIFO there: refused, not waited on
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return upgrade_saved_config(held) if isinstance(held, dict) else None


def check_pipeline_resume(cfg) -> bool:
    """Whether `cfg.output_dir` holds a pipeline to continue; RlooError (one line, nothing written)
    when its settings were others."""
    out = Path(cfg.output_dir)
    held = _saved_config(out)
    if held is None:
        check_something_to_resume(out, "pipeline")  # a typo in output_dir: refused, not a new pipeline
        say(f"{option('resume')}: no pipeline in {out}; starting from its first stage")
        return False
    # check_resume_config: 'key: old -> new' of every other setting (refusing, in its own line, those
    # no resume may change); a pipeline's stages read all of them, so any change is refused
    changed = check_resume_config(held, cfg.model_dump(mode="json"))
    if changed:
        raise RlooError(
            f"cannot resume the pipeline in {out} with changed settings ({'; '.join(changed)}); use its "
            f"original settings, or pass {option('overwrite')} to start it over"
        )
    return True


def _moved(held: dict, out: Path) -> dict:
    """A stage's saved config `held` with every path inside the pipeline folder it was run in
    rewritten to the pipeline folder that holds `out` now: the stages name each other's models by
    path (reward: sft_model, RL: policy and reward_model), so a pipeline copied or moved elsewhere
    would otherwise look run with other settings."""
    old = held.get("output_dir")
    if not isinstance(old, str) or Path(old).parent == out.parent:
        return held
    old_root, new_root = str(Path(old).parent), str(out.parent)

    def move(v: object) -> object:
        if isinstance(v, str) and (v == old_root or v.startswith(old_root + os.sep)):
            return new_root + v[len(old_root) :]
        if isinstance(v, dict):
            return {k: move(x) for k, x in v.items()}
        return [move(x) for x in v] if isinstance(v, list) else v

    return {k: move(v) for k, v in held.items()}


def finished(stage_cfg) -> bool:
    """Whether the stage of `stage_cfg` is complete in its folder (see the module's docstring)."""
    out, kind = Path(stage_cfg.output_dir), run_kind(stage_cfg)
    if not out.is_dir() or kind_of(out) != kind or not all((out / f).exists() for f in FINAL[kind]):
        return False
    held, current = _saved_config(out), stage_cfg.model_dump(mode="json")
    changed = ["config.yaml unreadable"] if held is None else check_resume_config(_moved(held, out), current)
    if changed:
        raise RlooError(
            f"cannot resume: the finished stage in {out} was run with other settings ({'; '.join(changed)}); "
            f"pass {option('overwrite')} to start the pipeline over"
        )
    check_weight_files(str(out / "model"), f"the finished stage in {out}: model")
    return True


def run_stage(train: Callable, stage_cfg, resume: bool, kept: Callable | None = None):
    """Run one stage of the pipeline: from its start (a new pipeline), or with `resume`: kept when
    finished (`kept(out)` reads back the result the pipeline uses; None: it uses none), continued
    from its newest checkpoint when it was interrupted (from step 0 when it has none), started when
    it never was."""
    out = Path(stage_cfg.output_dir)
    if resume and finished(stage_cfg):
        say(f"  finished in {out}: kept")
        return kept(out) if kept is not None else None
    started = out.is_dir() and not is_bookkeeping_only(out)
    if resume and started:
        return train(stage_cfg, resume=True)
    return train(stage_cfg, overwrite=True)


def kept_reward(out: Path) -> RewardResult:
    acc = json.loads(read_text(out / "accuracy.json"))
    return RewardResult(out / "model", acc["vs_labeler"], acc["vs_gold"])


def kept_rl(out: Path) -> RLResult:
    return RLResult(out / "model", plots=[out / "plots" / p for p in PLOTS if (out / "plots" / p).exists()])
