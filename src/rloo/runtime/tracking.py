"""Metrics to JSONL and TensorBoard, and the run's progress bar."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from tqdm.auto import tqdm


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
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # import is slow; only when used

            # purge_step hides events a resumed run is about to log again
            self._tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def progress(total: int, desc: str, initial: int = 0, disable: bool = False):
    """A progress bar on stderr that stays quiet when stderr is not a terminal (CI, tests) or
    when `disable` (processes other than rank 0)."""
    return tqdm(total=total, desc=desc, initial=initial, dynamic_ncols=True, leave=True,
                disable=True if disable or not sys.stderr.isatty() else None)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def say_once(msg: str, _seen: set = set()) -> None:  # noqa: B006 - the set is the memory
    """`say(msg)` the first time this process is told `msg`."""
    if msg not in _seen:
        _seen.add(msg)
        say(msg)
