"""Metrics to JSONL and TensorBoard, and the run's progress bar."""

from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path

from tqdm.auto import tqdm

from rloo.runtime.atomic import WriteError, describe_write_failure


class MetricsLogger:
    """Appends one JSON object per record to `metrics.jsonl` and mirrors scalars to TensorBoard.

    Lines are flushed as written, so a killed run keeps every record up to the kill; a resumed run
    first cuts the file back to its checkpoint (rloo.runtime.checkpoint.truncate_metrics).
    """

    def __init__(self, out_dir: Path, tensorboard: bool = True, purge_step: int | None = None):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._tb = None
        self.failed = False
        _TB_FAILED.clear()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # import is slow; only when used

            _quiet_tensorboard_errors()
            # purge_step hides events a resumed run is about to log again
            self._tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}
        try:
            self._file.write(json.dumps({"step": step, **clean}) + "\n")
            self._file.flush()
        except OSError as e:  # a full disk: one clear line, not a traceback of TensorBoard's thread
            self._fail(e, self.path)
        if self._tb is not None:
            tb_dir = self.path.parent / "tensorboard"
            if _TB_FAILED:
                self._fail(_TB_FAILED[-1], tb_dir)
            try:
                for k, v in clean.items():
                    if v is not None:
                        self._tb.add_scalar(k, v, step)
            except OSError as e:  # its writer thread failed; add_scalar re-raises that error
                self._fail(e, tb_dir)

    def _fail(self, e: OSError, where: Path):
        self.failed = True
        raise WriteError(f"could not write metrics to {where}: {describe_write_failure(e, where.parent)}") from e

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            if not self.failed:
                raise
        if self._tb is not None:
            try:
                self._tb.close()
            except OSError as e:  # its events are a mirror of metrics.jsonl: warn, do not fail the run
                if not self.failed:
                    say(
                        f"warning: TensorBoard events in {self.path.parent / 'tensorboard'} are incomplete "
                        f"({type(e).__name__}: {e})"
                    )


# TensorBoard writes events from a background thread; a full disk there would print that thread's
# traceback. Its OSErrors are kept here instead and reported by the next MetricsLogger.log.
_TB_FAILED: list[BaseException] = []


def _quiet_tensorboard_errors() -> None:
    """Chain a hook in front of the current threading.excepthook (installed when a logger opens,
    so a hook set earlier by a test runner or an application is kept for everything else)."""
    previous = threading.excepthook
    if getattr(previous, "_rloo_quiet_tb", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            _TB_FAILED.append(args.exc_value)
            return
        previous(args)

    hook._rloo_quiet_tb = True
    threading.excepthook = hook


def read_metrics(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def progress(total: int, desc: str, initial: int = 0, disable: bool = False):
    """A progress bar on stderr that stays quiet when stderr is not a terminal (CI, tests) or
    when `disable` (processes other than rank 0)."""
    return tqdm(
        total=total,
        desc=desc,
        initial=initial,
        dynamic_ncols=True,
        leave=True,
        disable=True if disable or not sys.stderr.isatty() else None,
    )


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def say_once(msg: str, _seen: set = set()) -> None:  # noqa: B006 - the set is the memory
    """`say(msg)` the first time this process is told `msg`."""
    if msg not in _seen:
        _seen.add(msg)
        say(msg)
