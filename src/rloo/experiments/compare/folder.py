"""The output folder of `rloo compare`, shared by every process started with the same command.

Each process holds the study's shared lock (rloo.runtime.runfolder.sharedlock) for its whole run and claims
one cell at a time (a (task, seed) folder, by its run lock). `--overwrite` takes the study's lock
exclusively and empties the folder only through rloo.runtime.runfolder.layout.empty_run_folder, so it
never deletes under another live process nor deletes anything rloo did not write. A step that
reads another cell's models (the gradient variance reads seed 0's SFT and reward models) waits for
the process making them, and makes them itself when no live process is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

import yaml

from rloo.config import CompareConfig, load_config
from rloo.errors import ConfigError, RlooError, option
from rloo.experiments.readback import read_variance
from rloo.experiments.tuning import read_reported_result, read_result
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.confine import make_folder
from rloo.runtime.runfolder.layout import (
    empty_run_folder,
    is_bookkeeping_only,
    kind_of,
    refuse_linked_folders,
    write_marker,
)
from rloo.runtime.runfolder.lock import RunFolderBusy, describe_holder, is_busy, run_folder
from rloo.runtime.runfolder.sharedlock import SharedFolder
from rloo.runtime.tracking.log import say
from rloo.training.common import refuse_a_file

WAIT_POLL_S = 10.0  # how often a process waiting for another's models looks again


def open_study(cfg: CompareConfig, overwrite: bool) -> SharedFolder:
    """Take the study folder `cfg.output_dir` (created if missing) for this process: emptied first
    with `overwrite`; refused when it holds something other than a comparison of cfg's settings.
    The caller closes the returned lock when it is done."""
    out = Path(cfg.output_dir)
    refuse_a_file(out)
    make_folder(out)
    study = SharedFolder(out, overwrite=overwrite)
    try:
        if overwrite:
            empty_run_folder(out, "compare")
        elif kind_of(out) != "compare" and not is_bookkeeping_only(out):
            raise RlooError(
                f"{out} is not empty and does not hold an rloo comparison; choose another output_dir "
                f"(nothing was deleted)"
            )
        refuse_linked_folders(out, "compare")
        saved = out / "config.yaml"
        if saved.exists() and not same_settings(saved, cfg):
            raise RlooError(
                f"{out} holds a comparison with other settings; pass {option('overwrite')} or choose another output_dir"
            )
        for result in sorted(out.glob("*/*/seed-*/*/result.json")):  # runs/ and tuning/ cells
            read_result(result)  # a damaged or linked result refuses the rerun now, before any model loads
        for result in sorted(out.glob("runs/*/seed-*/*/result.json")):
            read_reported_result(result)  # and one the report could not plot (`{}`, null or NaN numbers)
        for variance in sorted(out.glob("runs/*/seed-*/gradient_variance.json")):
            read_variance(variance)  # likewise a damaged gradient variance (the report's table reads it)
        if study.exclusive:  # the only writer of the marker and config (a process joining later reads them)
            write_marker(out, "compare")
            if not saved.exists():
                atomic_write_text(saved, _dump(cfg))
            study.share()
    except BaseException:
        study.close(refused=True)
        raise
    return study


@contextmanager
def claim(cell: Path, quiet: bool = False):
    """Lets several `rloo compare` processes on one output_dir share the cells: a cell whose lock
    (rloo.runtime.runfolder.lock) a live process holds is left to it; the lock of a killed run is taken over."""
    make_folder(cell)
    with ExitStack() as stack:
        try:
            stack.enter_context(run_folder(cell))
        except RunFolderBusy as e:
            if not quiet:
                say(f"compare: {e}; skipping it here")
            yield False
            return
        yield True


def wait_for_models(cell: Path, needs_reward: bool, make_cell: Callable[[], None]) -> None:
    """Return once the SFT (and reward) model of `cell` are whole and no process is writing them:
    while another live process holds the cell, wait (a line per look); when none does (it died,
    or never began), run the cell here (`make_cell`), which makes them."""
    stages = ["sft", "reward"] if needs_reward else ["sft"]
    while not all((cell / s / "model").is_dir() and not is_busy(cell / s) for s in stages):
        with claim(cell, quiet=True) as mine:
            if mine:
                make_cell()
                continue
        say(
            f"compare: waiting for the {' and '.join(stages)} models of {cell}, which {describe_holder(cell)} is "
            f"making; looking again in {WAIT_POLL_S:.0f}s"
        )
        time.sleep(WAIT_POLL_S)


def same_settings(saved: Path, cfg: CompareConfig) -> bool:
    """Whether a comparison's saved config.yaml holds cfg's settings; read through CompareConfig, so
    a comparison saved before a key was added (tuning, equal_kl, rl.eval_split: their defaults are
    what it ran) is still recognised, and its report can be rebuilt by rerunning its command."""
    try:
        held = load_config(CompareConfig, saved)
    except ConfigError:
        return False
    # where the study lies is not one of its settings: a study copied or moved elsewhere is the same study
    return _dump(held.model_copy(update={"output_dir": cfg.output_dir})) == _dump(cfg)


def _dump(cfg: CompareConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
