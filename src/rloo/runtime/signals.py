"""SIGINT/SIGTERM/SIGHUP during a run: every stop ends with one line that says what stopped and how
to continue (the CLI prints it; exit code 128 + the signal's number: 130 for SIGINT, 143 for
SIGTERM, 129 for SIGHUP: a closed terminal or ssh session stops a run as SIGTERM does).

  - `StopFlag`: inside a training loop a signal only sets a flag; the loop stops after the step it
    is in with a checkpoint (the RL loop, rloo.training.loop; the SFT, reward-model and DPO stages,
    rloo.training.supervised: `stage_interrupted`). A second signal
    stops at once (StopNow), and so does one that came after the last step, once the stage is done,
    under `rloo compare` or `rloo pipeline`.
  - `signals_stop_now`: everywhere else (loading, judging, a study between its runs) SIGTERM and
    SIGHUP stop at once as SIGINT does (KeyboardInterrupt), instead of their default, a silent exit.

A handler's StopNow raised while the main thread runs a finalizer (an object's `__del__`, as in a
model load) is dropped by Python ("Exception ignored in ... __del__"), and the run went on: while a
handler is ours, such a StopNow sends its signal again (`_resend_dropped_stops`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rloo.errors import Interrupted, StopNow, how_to_continue, more_stages_follow, rerun_hint
from rloo.runtime.tracking.log import say

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Seconds before a signal whose StopNow a finalizer dropped is sent again: the finalizer has returned
RESEND_AFTER_S = 0.05


class StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps; `note` is said when the first
    arrives (what happens next; by default the RL loop's: a checkpoint, unless its caller reruns it
    from the start, rloo.errors.rerun_continues)."""

    def __init__(self, note: str | None = None, quiet: Callable[[], bool] | None = None):
        self.signum = None
        self.note = note or ("stopping after this step" + ("" if rerun_hint() else " and writing a checkpoint"))
        # when it says True a signal is only recorded: under torchrun, its SIGTERM to the survivors of
        # a lost process (whose step cannot finish; the stage's one line says what happened)
        self.quiet = quiet
        self._old = {}

    def __enter__(self):
        # Signal handlers can only be set from the main thread; elsewhere the default applies.
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
            self._resending = _resend_dropped_stops()
            self._resending.__enter__()
        return self

    def _handle(self, signum, frame):
        if self.quiet is not None and self.quiet():
            self.signum = self.signum or signum
            return
        if self.signum is not None:  # a second signal: the user means it
            raise StopNow(signum)
        self.signum = signum
        say(f"\nreceived {signal.Signals(signum).name}: {self.note}")

    def __exit__(self, exc_type, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        if self._old:
            self._resending.__exit__(None, None, None)
        # A signal the loop did not act on (it came after the last step's check: the final eval or
        # save) ends the run normally; under a study or pipeline, whose next stage or run would
        # ignore it, it then stops the process as a second signal would (the caller's rerun hint).
        if exc_type is None and self.signum is not None and more_stages_follow():
            raise StopNow(self.signum)


def stage_interrupted(stage: str, signum: int, step: int, total: int, saved: Path | None) -> Interrupted:
    """The stop of a stage after its step `step` of `total`, with the checkpoint `saved` (None under
    `rloo compare`, which reruns the stage from its start: rloo.errors.rerun_hint)."""
    stopped = f"{signal.Signals(signum).name} received; {stage} stopped at step {step}/{total}"
    if saved is not None:
        return Interrupted(f"{stopped} and saved {saved}; {how_to_continue(True)}", signum)
    return Interrupted(f"{stopped}; {how_to_continue(True)}", signum)


def _stop_now(signum, frame):
    raise StopNow(signum)


def _resend(signum: int) -> None:
    time.sleep(RESEND_AFTER_S)
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def _resend_dropped_stops():
    """Within this block a StopNow that Python dropped (raised by a handler while a finalizer ran:
    sys.unraisablehook) is not printed; its signal is sent again from a helper thread, so the main
    thread's handler raises it anew once the finalizer has returned. Other unraisable exceptions go
    to the hook as before."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, StopNow):
            return previous(unraisable)
        signum = unraisable.exc_value.exit_code - 128
        threading.Thread(target=_resend, args=(signum,), name="rloo-resend-signal", daemon=True).start()

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


@contextlib.contextmanager
def _raising_stop_now(*signums: int):
    """Within this block each signal of `signums` raises StopNow in the main thread; elsewhere a
    no-op (Python installs handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _stop_now) for s in signums}
    try:
        with _resend_dropped_stops():
            yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def signals_stop_now():
    """Within this block SIGTERM and SIGHUP raise StopNow (a KeyboardInterrupt, as SIGINT raises one)
    in the main thread, so `finally` blocks run and the CLI prints its line; outside the main
    thread, a no-op."""
    return _raising_stop_now(signal.SIGTERM, signal.SIGHUP)


def sigint_stops_now():
    """Within this block SIGINT raises StopNow (in the main thread; elsewhere a no-op), so that a plain
    KeyboardInterrupt raised inside is the code's own, not a Ctrl-C (the user's modules, loaded by
    rloo.runtime.inputs.user_code, are told apart from a real signal this way)."""
    return _raising_stop_now(signal.SIGINT)
