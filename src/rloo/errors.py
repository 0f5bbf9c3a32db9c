"""Errors a user can act on. The CLI prints them as one line (a traceback only with --debug)."""


class RlooError(Exception):
    """A problem with the user's input or environment, with a message that says how to fix it."""


class ConfigError(RlooError):
    """An invalid config: unknown key, wrong type, value out of range."""


class RewardError(RlooError):
    """A reward source misbehaved: raised, returned the wrong number of scores, NaN, non-numbers."""
