"""``ConfigError``: a configuration (a file, a key, a plugin list) that cannot be used. Its own
module so that ``trainers.config`` and ``trainers.plugins`` (which config imports) both raise it
without importing each other."""


class ConfigError(ValueError):
    pass


__all__ = ["ConfigError"]
