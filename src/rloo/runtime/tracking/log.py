"""Metrics to JSONL and TensorBoard, and the run's progress bar."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
from pathlib import Path

from tqdm.auto import tqdm

from rloo.config import normalize_report_to
from rloo.runtime.runfolder.atomic import WriteError, describe_write_failure, open_append
from rloo.runtime.runfolder.confine import make_folder
from rloo.runtime.runfolder.reading import read_text
from rloo.runtime.tracking.progress_text import PlainProgress
from rloo.runtime.tracking.trackers import start_trackers


class MetricsLogger:
    """Appends one JSON object per record to `metrics.jsonl` and mirrors scalars to the trackers of
    `report_to` (rloo.runtime.tracking.trackers: TensorBoard by default, wandb, none).

    Lines are flushed as written, so a killed run keeps every record up to the kill; a resumed run
    first cuts the file back to its checkpoint (rloo.runtime.checkpoint.save.truncate_metrics).
    """

    def __init__(
        self,
        out_dir: Path,
        tensorboard: bool = True,
        purge_step: int | None = None,
        report_to: str | list[str] = "tensorboard",
        config: dict | None = None,
    ):
        make_folder(out_dir)
        self.path = out_dir / "metrics.jsonl"
        self._file = open_append(self.path)
        names = normalize_report_to(report_to) if tensorboard else []
        self.failed = False
        _TB_FAILED.clear()
        if "tensorboard" in names:
            _quiet_tensorboard_errors()
        self._trackers = start_trackers(names, out_dir, purge_step, config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}
        try:
            self._file.write(json.dumps({"step": step, **clean}) + "\n")
            self._file.flush()
        except OSError as e:  # a full disk: one clear line, not a traceback
            self._fail(e, self.path)
        if _TB_FAILED:
            self._fail(_TB_FAILED[-1], self.path.parent / "tensorboard")
        for t in self._trackers:
            try:
                t.scalars(step, clean)
            except OSError as e:
                self._fail(e, self.path.parent)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """A table of sample completions (prompt, completion, score, kl, advantage) at `step`."""
        for t in self._trackers:
            t.samples(step, rows)

    def _fail(self, e: OSError, where: Path):
        self.failed = True
        raise WriteError(f"could not write metrics to {where}: {describe_write_failure(e, where.parent)}") from e

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            if not self.failed:
                raise
        for t in self._trackers:
            try:
                t.close()
            except OSError as e:  # trackers mirror metrics.jsonl: warn, do not fail the run
                if not self.failed:
                    say(f"warning: tracker output in {self.path.parent} is incomplete ({type(e).__name__}: {e})")


def read_metrics(path: Path) -> list[dict]:
    try:
        text = read_text(path)  # a FIFO or link planted there is refused, never blocked on
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# TensorBoard writes events from a background thread; a full disk there would print that thread's
# traceback. Its OSErrors are kept here instead and reported by the next MetricsLogger.log.
_TB_FAILED: list[BaseException] = []


class _QuietTensorboardHook:
    """A threading.excepthook that keeps the TensorBoard writer thread's OSErrors in _TB_FAILED and
    hands every other exception to the hook it was put in front of."""

    def __init__(self, previous) -> None:
        self.previous = previous

    def __call__(self, args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            _TB_FAILED.append(args.exc_value)
            return
        self.previous(args)


def _quiet_tensorboard_errors() -> None:
    """Chain a hook in front of the current threading.excepthook (installed when a logger opens,
    so a hook set earlier by a test runner or an application is kept for everything else)."""
    previous = threading.excepthook
    if isinstance(previous, _QuietTensorboardHook):  # an earlier logger's: chained once
        return
    threading.excepthook = _QuietTensorboardHook(previous)


def progress(total: int, desc: str, initial: int = 0, disable: bool = False, plain_lines: bool = True):
    """A progress bar on stderr when it is a terminal; otherwise (CI, a log file) plain lines with an
    ETA every tenth of the run (rloo.runtime.tracking.progress_text), or nothing when not `plain_lines` (a loop that
    prints its own). `disable`: quiet (processes other than rank 0)."""
    if not disable and is_main_process():
        _say_held_notes()  # a terminal's bar is drawn by tqdm, not by say
    if disable or not sys.stderr.isatty():
        if plain_lines and not disable:
            return PlainProgress(total, desc, say, initial)
        return tqdm(total=total, desc=desc, initial=initial, disable=True)
    return tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, leave=True)


def say(msg: str) -> None:
    """A progress/info line on stderr; under torchrun only rank 0 speaks (errors are printed apart)."""
    if is_main_process():
        _say_held_notes()
        print(msg, file=sys.stderr, flush=True)


# Notes held while the CLI runs a command (`hold_notes`); None: say them at once
_held_notes: list[str] | None = None


def note(msg: str) -> None:
    """A line about how the command will run (dtype=auto's choice) that matters only if it does run:
    under `hold_notes` it is said just before the next line, and dropped when the command stops on
    an error first, so that a refusal stays the only line on stderr."""
    if _held_notes is None:
        say(msg)
    elif is_main_process():
        _held_notes.append(msg)


def _say_held_notes() -> None:
    while _held_notes:
        print(_held_notes.pop(0), file=sys.stderr, flush=True)


@contextlib.contextmanager
def hold_notes():
    """Within this block `note` lines wait for the next `say` (or progress bar, or the block's end)
    and are dropped if the block raises before one (the CLI then prints its one error line)."""
    global _held_notes
    _held_notes = []
    try:
        yield
        _say_held_notes()
    finally:
        _held_notes = None


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def say_once(msg: str, _seen: set = set()) -> None:  # noqa: B006 - the set is the memory
    """`say(msg)` the first time this process is told `msg`."""
    if msg not in _seen:
        _seen.add(msg)
        say(msg)
