"""``fedauc evaluate``: registered models scored by every site on its own valid and test splits, pooled at the
centre (pipelines/evaluations.py), in this process or at the hospitals over NVIDIA FLARE."""

from __future__ import annotations

import typer

from federated.settings import DEFAULT_LAUNCHER
from pipelines.cli.application import flows
from pipelines.cli.train_options import ADMIN_KIT, FLARE_ENV, FLARE_WORKSPACE, FlareEnv, TrainBackend
from pipelines.cli.training import launcher_from_options


def evaluate_command(
    federation: str = typer.Option(..., "--federation", help="A federation YAML."),
    shards: str = typer.Option(None, "--shards", help="Where the sites' shards are, for --backend inprocess and "
                               "--flare-env sim / poc (default: $FEDAUC_SHARDS, else the federation's shards:, "
                               "else shards/); refused with --flare-env prod (each hospital reads its own)."),
    model_version: list[str] = typer.Option([], "--model-version", help="A registered version of fedauc-<task>; "
                                            "repeat it to compare several on the same data (default: the champion)."),
    backend: TrainBackend = typer.Option(DEFAULT_LAUNCHER, "--backend",
                                         help="inprocess or torchrun: every site's shards are here and scored in "
                                              "this process; flare: an NVIDIA FLARE job scores them at the sites."),
    flare_env: FlareEnv = FLARE_ENV,
    flare_workspace: str = FLARE_WORKSPACE,
    kit: str = ADMIN_KIT,
    eval_noise_multiplier: float = typer.Option(
        None, "--eval-noise-multiplier", min=0.0,
        help="Each site releases its score histograms with this noise multiplier (charged to its privacy ledger) "
             "and no per-site metric; without it a site with a privacy budget refuses the evaluation."),
    wide: bool = typer.Option(False, "--wide", help="Every metric of every disease, not the macro means only "
                              "(the default, readable in a 100-column terminal; MLflow has them all)."),
) -> None:
    """Registered models (default: the champion) on every site's valid and test splits, pooled (the Prefect flow
    evaluate); several --model-version are scored in one evaluation and compared in one table."""
    import pandas as pd

    from pipelines.checks import check_evaluation
    from pipelines.evaluations import comparison_rows, metrics_rows
    from pipelines.prefect_env import configure_prefect_env
    from pipelines.tables import markdown_table

    launcher = launcher_from_options(backend, flare_env, flare_workspace, kit)
    _, shards_root = check_evaluation(federation, shards, launcher)
    configure_prefect_env()
    results = flows().evaluate(federation, None if shards_root is None else str(shards_root), model_version,
                               launcher.model_dump(mode="json"), eval_noise_multiplier)
    typer.echo(markdown_table(pd.DataFrame(comparison_rows(results))))
    if len(results) == 1:
        typer.echo("")
        typer.echo(markdown_table(pd.DataFrame(metrics_rows(results[0]["metrics"], wide)).round(3)))


def card_command(
    task: str = typer.Argument(..., help="The task (chest-xray, melanoma): its registered model fedauc-<task>."),
    version: str = typer.Option(None, "--version", help="A registered version (default: the champion)."),
    out: str = typer.Option(None, "--out", help="Write it to this file (.html: the page with its forest plot; "
                                                "otherwise Markdown) instead of printing it."),
) -> None:
    """A registered version's model card (pipelines/model_card.py): intended use, training federation, algorithm,
    performance pooled, per site and per subgroup with intervals, operating points, limitations, provenance."""
    from pathlib import Path

    from common.errors import ConfigError, FedaucError
    from pipelines import model_card, tracking
    from pipelines.cli.application import fail

    tracking.configure()
    try:
        chosen = version or model_card.champion_version(task)
        if chosen is None:
            raise ConfigError(f"fedauc-{task} has no champion", fix="train one first, or pass --version")
        markdown, page, _ = model_card.render(task, chosen)
    except FedaucError as err:
        fail(err)
    if out is None:
        typer.echo(markdown)
        return
    Path(out).write_text(page if out.lower().endswith((".html", ".htm")) else markdown)
    typer.echo(f"model card of fedauc-{task} version {chosen}: {out}")
