"""Errors a user can act on. The CLI prints them as one line (a traceback only with --debug)."""

import contextlib
import contextvars


class RlooError(Exception):
    """A problem with the user's input or environment, with a message that says how to fix it."""

    exit_code = 2


class ConfigError(RlooError):
    """An invalid config: unknown key, wrong type, value out of range."""


class RewardError(RlooError):
    """A reward source misbehaved: raised, returned the wrong number of scores, NaN, non-numbers."""


class EnvError(RlooError):
    """A multi-turn environment misbehaved: raised, returned the wrong types, or passed its step timeout."""


class NonFiniteError(RlooError):
    """Too many steps in a row had a non-finite loss or gradient."""


class Interrupted(RlooError):
    """SIGINT/SIGTERM arrived; a checkpoint was written at a safe point. Exit code 128 + signal."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.exit_code = 128 + signum


class StoppedByCallback(Interrupted):
    """A callback of the Python API asked the stage to stop (rloo.training.callbacks); a checkpoint
    was written after the step, as for SIGINT, and `resume=True` continues from it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.exit_code = 1


class StopNow(KeyboardInterrupt):
    """A second SIGINT/SIGTERM during a run: stop at once (raised by the loop's signal handler).
    The CLI exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int = 2):
        super().__init__(signum)
        self.exit_code = 128 + signum


# Messages that tell the user to "pass --resume" must say `resume=True` to a Python caller of
# rloo.train/sft/...: the CLI sets this flag for the duration of its command.
_via_cli = contextvars.ContextVar("rloo_via_cli", default=False)


def option(name: str) -> str:
    """How the caller spells the run option `name` ("resume", "overwrite"): `--resume` on the
    command line, `resume=True` from Python."""
    return f"--{name}" if _via_cli.get() else f"{name}=True"


@contextlib.contextmanager
def cli_options():
    """Within this block errors name the CLI's flags (see `option`)."""
    token = _via_cli.set(True)
    try:
        yield
    finally:
        _via_cli.reset(token)


# How an interrupted stage continues depends on who runs it: a command of its own (`rloo train
# --resume`), a study that runs it again from its start (`rloo compare`), or a pipeline that resumes
# it (`rloo pipeline --resume`); set with `rerun_continues`: (hint, whether the caller resumes).
_rerun_hint: contextvars.ContextVar[tuple[str, bool] | None] = contextvars.ContextVar("rloo_rerun_hint", default=None)


@contextlib.contextmanager
def rerun_continues(hint: str, resumes: bool = False):
    """Within this block an interrupted stage says `hint` for how to continue. A caller that reruns
    its stages from the start (`rloo compare`) saves no checkpoint its rerun would not read; one
    that `resumes` them (`rloo pipeline --resume`) lets each stage save its checkpoint as on its own."""
    token = _rerun_hint.set((hint, resumes))
    try:
        yield
    finally:
        _rerun_hint.reset(token)


def rerun_hint() -> str | None:
    """The hint of a caller that reruns its stages from the start (`rerun_continues`): then a stage
    saves no checkpoint; None when the stage runs on its own or under a caller that resumes it."""
    held = _rerun_hint.get()
    return held[0] if held is not None and not held[1] else None


def more_stages_follow() -> bool:
    """Whether a study or pipeline runs this stage (`rerun_continues`): a signal that came after the
    stage's last step must then stop the process, not let the caller start its next stage."""
    return _rerun_hint.get() is not None


def study_rerun() -> str:
    """How an interrupted `rloo compare` continues (rloo.experiments.compare: a run is done once its
    result.json is written; an unfinished one starts over)."""
    return "rerun the same command to continue the study (finished runs are kept; unfinished ones start over)"


def pipeline_rerun() -> str:
    """How an interrupted `rloo pipeline` continues (rloo.training.pipeline): finished stages are
    kept, the interrupted one continues from its newest checkpoint."""
    return f"continue with the same command plus {option('resume')}"


def how_to_continue(resumable: bool) -> str:
    """After an interrupt: the caller's `rerun_continues` hint, else --resume for a stage that
    saved a checkpoint (`resumable`), else --overwrite (the stage starts over)."""
    held = _rerun_hint.get()
    if held is not None:
        return held[0]
    if resumable:
        return f"continue with the same command plus {option('resume')}"
    return f"rerun the same command with {option('overwrite')} to start it over"
