"""Exceptions a user can cause. The CLI prints their message as one line and exits 2."""


class UserError(Exception):
    """A problem with the user's input (file, option, config): fixable without reading our code."""


class DatasetError(UserError, ValueError):
    """A dataset that cannot be used as given. The message names the file, key and row."""


class ConfigError(UserError, ValueError):
    """An unknown or inconsistent option."""


class MissingDependencyError(UserError, ImportError):
    """An optional dependency (extra) is not installed."""
