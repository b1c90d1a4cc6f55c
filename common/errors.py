"""The error family for problems a user can fix (a data file, a site or federation YAML, a missing shard).

The command line prints such an error as one message, with its fix, and exits non-zero without a
traceback (``--debug`` shows it); anything else is a bug and keeps its traceback. Packages at every layer
raise these, so this module sits at the bottom of the dependency order and imports nothing of fedauc's.
"""

from __future__ import annotations


class FedaucError(Exception):
    """A problem the user can act on. ``fix`` says what to do, when there is one thing to do."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.fix = fix

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message}\n  fix: {self.fix}" if self.fix else message


class ConfigError(FedaucError, ValueError):
    """A site, federation or training configuration that cannot be used as written."""


class DataError(FedaucError, ValueError):
    """Input data (a label file, an image, a shard) that cannot be read as its layout says."""


def problem_message(error: dict) -> str:
    """A pydantic error's message (one of ``ValidationError.errors()``) in the words a user reads."""
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return "unknown field"
    if error["type"] == "missing":
        return "required field is missing"
    return error["msg"].removeprefix("Value error, ")
