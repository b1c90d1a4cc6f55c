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


class FailedAtSite(FedaucError):
    """A hospital's flow or task run failed. Its state and logs reach the consortium's Prefect server, and what
    failed usually names the hospital's files (a YAML, a data root, an image), so the message says only the step
    and the kind of problem; ``at_site`` is the whole error, for the hospital's own log and command line."""

    def __init__(self, step: str, at_site: BaseException, log: str):
        super().__init__(f"{step} failed at the site ({type(at_site).__name__}); the message names the hospital's "
                         f"files, so it stays in the hospital's own log (logger {log!r} of its worker)",
                         fix="at the hospital: read the worker's log, or run the step there with `fedauc`")
        self.at_site: BaseException | None = at_site

    def __reduce__(self):
        # Prefect persists a failed run's exception as its result: pickled, it is what may leave the site.
        return _failed_at_site, (self.args[0], self.fix)


def _failed_at_site(message: str, fix: str | None) -> FailedAtSite:
    failed = FailedAtSite.__new__(FailedAtSite)
    FedaucError.__init__(failed, message, fix)
    failed.at_site = None
    return failed


def problem_message(error: dict) -> str:
    """A pydantic error's message (one of ``ValidationError.errors()``) in the words a user reads."""
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return "unknown field"
    if error["type"] == "missing":
        return "required field is missing"
    return error["msg"].removeprefix("Value error, ")
