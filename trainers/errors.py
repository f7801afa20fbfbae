"""``ConfigError``: a configuration (a file, a key, a plugin list) that cannot be used. Its own
module so that ``trainers.config`` and ``trainers.plugins`` (which config imports) both raise it
without importing each other. A ``UserError`` (``agent_gym/cli_errors.py``): a command prints it as
one line and exits 2."""

from agent_gym.cli_errors import UserError


class ConfigError(UserError, ValueError):
    pass


__all__ = ["ConfigError"]
