"""The ``fedauc`` Typer application: its ``--debug`` option, how a user's error ends a command (one message, its
fix, exit code 1) and the Prefect flows the commands run, imported once the embedded-Prefect defaults are set."""

from __future__ import annotations

import logging
import os

import typer
from typer.core import TyperGroup

from common.errors import FailedAtSite, FedaucError
from pipelines.store_uri import tracking_uri


class _UserErrorsAsMessages(TyperGroup):
    """A FedaucError (a problem the user fixes: a data file, a YAML, a missing shard) ends any command with
    one message, its fix and exit code 1; ``fedauc --debug ...`` (or FEDAUC_DEBUG=1) shows the traceback.
    Anything else is a bug and keeps its traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except FedaucError as err:
            # A flow run at this site told its Prefect server only the step; here, at the site, the whole error.
            at_site = err.at_site if isinstance(err, FailedAtSite) else err
            if debug_requested() or not isinstance(at_site, FedaucError):
                raise at_site from None
            typer.echo(f"error: {at_site}", err=True)
            typer.echo("(`fedauc --debug ...` shows the traceback)", err=True)
            raise typer.Exit(code=1) from None


_options_given = {"debug": False}  # set by the app callback on every invocation


def debug_requested() -> bool:
    return _options_given["debug"] or bool(os.environ.get("FEDAUC_DEBUG"))


class _DropUserErrorTracebacks(logging.Filter):
    """Prefect logs a failed task or flow with its full traceback; for a FedaucError the command line prints
    the one message that matters instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], FedaucError))


app = typer.Typer(
    cls=_UserErrorsAsMessages,
    help="Federated AUC maximization for hospitals: onboard sites, preprocess, train, compare.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error.")) -> None:
    _options_given["debug"] = debug
    # Every command, and every process it starts, records in and reads the same store: the one
    # MLFLOW_TRACKING_URI names, else the fedauc folder's (pipelines/store_uri.py). Without it, an MlflowClient
    # made before a command's own ``tracking.configure()`` used MLflow's default, a new mlflow.db in the current
    # folder (`fedauc ui` once found no training that way, and left that file in the checkout).
    os.environ.setdefault("MLFLOW_TRACKING_URI", tracking_uri())


def quiet_prefect_user_errors() -> None:
    from pipelines.site_params import SITE_LOG

    # The site's own log of a failed step: this command prints that error itself (once per process: a command
    # run again in it, as the tests do, adds no second handler).
    site_log = logging.getLogger(SITE_LOG)
    site_log.propagate = False
    if not site_log.handlers:
        site_log.addHandler(logging.NullHandler())
    if debug_requested():
        return
    for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_DropUserErrorTracebacks())


def flows():
    """The Prefect flows. Prefect reads its settings when imported: the command calling this has set the
    embedded-Prefect environment defaults first (``pipelines.prefect_env.configure_prefect_env``, at its entry)."""
    from pipelines import flows as prefect_flows

    quiet_prefect_user_errors()
    return prefect_flows


def fail(err: Exception) -> None:
    typer.echo(str(err), err=True)
    raise typer.Exit(code=1) from None
