"""Errors raised for the user's mistakes. Each message names the value, the limit or the allowed values."""


class DietError(ValueError):
    """Base class: a mistake in the user's configuration or data, reported without a traceback by the CLI."""


class ConfigError(DietError):
    """An invalid model or run configuration (unknown name, nonsensical combination)."""


class InputError(DietError):
    """Model inputs outside what the configuration allows (token ids, lengths, segment ids)."""


class DataError(DietError):
    """A missing, empty or malformed data file; the message names the file and line."""
