"""Errors a user can act on. The CLI prints them as one line (a traceback only with --debug)."""


class RlooError(Exception):
    """A problem with the user's input or environment, with a message that says how to fix it."""

    exit_code = 2


class ConfigError(RlooError):
    """An invalid config: unknown key, wrong type, value out of range."""


class RewardError(RlooError):
    """A reward source misbehaved: raised, returned the wrong number of scores, NaN, non-numbers."""


class NonFiniteError(RlooError):
    """Too many steps in a row had a non-finite loss or gradient."""


class Interrupted(RlooError):
    """SIGINT/SIGTERM arrived; a checkpoint was written at a safe point. Exit code 128 + signal."""

    def __init__(self, message: str, signum: int = 2):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopNow(KeyboardInterrupt):
    """A second SIGINT/SIGTERM during a run: stop at once (raised by the loop's signal handler)."""
