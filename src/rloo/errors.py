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
