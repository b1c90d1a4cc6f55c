"""``fedauc train`` and ``fedauc compare``: train one algorithm on a federation (in this process or as an NVIDIA
FLARE job) and tabulate the trainings (``fedauc evaluate``: pipelines/cli/evaluation.py)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

import typer

from common.errors import ConfigError
from federated.flare.centre.environments import FLARE_ENVS
from federated.settings import DEFAULT_LAUNCHER, LAUNCHER_KINDS, RULES
from pipelines.cli.application import flows

if TYPE_CHECKING:
    from federated.launch import Launcher

# The command line's choices, derived from the one definition of each (federated/settings.py LAUNCHER_KINDS and
# RULES, federated/flare/centre/environments.py FLARE_ENVS), which load no torch: `fedauc --help` stays quick.
TrainBackend = Enum("TrainBackend", {kind: kind for kind in LAUNCHER_KINDS}, type=str)
Aggregation = Enum("Aggregation", {rule: rule for rule in RULES}, type=str)
FlareEnv = Enum("FlareEnv", {env: env for env in FLARE_ENVS}, type=str)


def launcher_from_options(backend: TrainBackend, flare_env: FlareEnv | None, flare_workspace: str | None,
                          kit: str | None) -> Launcher:
    """The launcher the options name, checked (a wrong combination is one line with its fix): each launcher
    takes the options it declares (``federated.launch._Launcher.options``) and refuses the others'."""
    from federated.launch import LAUNCHERS

    given = {"--flare-env": flare_env and flare_env.value, "--flare-workspace": flare_workspace, "--kit": kit}
    chosen = LAUNCHERS[backend.value].from_options(given)
    chosen.check()
    return chosen


def bound(setting: str) -> str:
    """The bound the training's settings hold ``setting`` to (a TrainSettings field, ``dp.`` a DPConfig one), as
    --help shows it: pydantic checks it, once, and names the option of a value outside it."""
    from federated.privacy.policy import DPConfig
    from federated.settings import TrainSettings

    model = DPConfig if setting.startswith("dp.") else TrainSettings
    marks = [f"{sign} {getattr(limit, attribute)}" for limit in model.model_fields[setting.removeprefix("dp.")].metadata
             for attribute, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
             if getattr(limit, attribute, None) is not None]
    return f"({', '.join(marks)})"  # not [...]: --help reads that as rich markup


# Where a FLARE job runs, shared by `fedauc train` and `fedauc evaluate` so that both say it alike.
FLARE_ENV = typer.Option(None, "--flare-env", show_default=False,
                         help="With --backend flare: sim = NVFlare's simulator, one process per site here (the "
                              "default); poc = a provisioned consortium (mutual TLS) started here for this job; "
                              "prod = the running consortium the --kit admin kit reaches.")
FLARE_WORKSPACE = typer.Option(None, "--flare-workspace", show_default=False,
                               help="With --backend flare: the NVFlare job's workspace (its logs stay here; "
                                    "default flare_workspace).")
ADMIN_KIT = typer.Option(None, "--kit", help="With --flare-env prod: the admin's startup kit "
                         "(the admin@... folder of `fedauc consortium provision`).")


def train_command(
    federation: str = typer.Option(..., "--federation", help="A federation YAML, e.g. sites/demo/chest.yaml."),
    algorithm: str = typer.Option(..., "--algorithm", help="A registered algorithm, e.g. codasca."),
    shards: str = typer.Option(None, "--shards", help="Where `fedauc preprocess` wrote the shards "
                               "(default: $FEDAUC_SHARDS, else the federation's shards:, else shards/); "
                               "not read with --flare-env prod (the hospitals read their own)."),
    rounds: int = typer.Option(20, "--rounds", help=bound("rounds")),
    local_steps: int = typer.Option(8, "--local-steps", "-I", help=f"Local steps between communications. {bound('local_steps')}"),
    batch_size: int = typer.Option(32, "--batch-size", help=f"Per site. {bound('batch_size')}"),
    lr: float = typer.Option(0.1, "--lr", help=bound("lr")),
    network: str = typer.Option("small_resnet", "--network", help="small_resnet, resnet18 or densenet121; under "
                                "--dp a GroupNorm one: small_resnet_gn or densenet121_gn."),
    disease: list[str] = typer.Option([], "--disease", help="A disease to learn, as the task spells it (repeat the "
                                      "option for each); default: the federation's diseases:, else all of the task's."),
    param: list[str] = typer.Option([], "--param", "-p", help="Algorithm hyperparameter NAME=VALUE (JSON value)."),
    seed: int = typer.Option(0, "--seed"),
    eval_every: int = typer.Option(5, "--eval-every", help=bound("eval_every")),
    run_name: str = typer.Option(None, "--run-name"),
    checkpoint_dir: str = typer.Option(None, "--checkpoint-dir",
                                       help="Checkpoint after every round here (default checkpoints/<run name> "
                                            "beside the MLflow store; with --flare-env prod, at each hospital)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last round checkpoint of this training."),
    backend: TrainBackend = typer.Option(DEFAULT_LAUNCHER, "--backend",
                                         help="inprocess: every site in this process; torchrun: one process per "
                                              "site here (torch.distributed); flare: an NVIDIA FLARE job."),
    flare_env: FlareEnv = FLARE_ENV,
    flare_workspace: str = FLARE_WORKSPACE,
    kit: str = ADMIN_KIT,
    site_timeout: float = typer.Option(300.0, "--site-timeout",
                                       help="With --backend torchrun or flare: seconds the sites wait for a silent site at a "
                                            "communication before the job fails naming it. " + bound("timeout_s")),
    secure_aggregation: bool = typer.Option(
        False, "--secure-aggregation",
        help="Pairwise-masked secure aggregation: the server (or this process) receives every mean and sum as "
             "masked ring elements and decodes only the sum over sites (docs/algorithms.md section 13)."),
    secagg_plus: bool = typer.Option(
        False, "--secagg-plus",
        help="With --secure-aggregation: SecAgg+, each site masks with O(log K) neighbours instead of all K - 1, "
             "safe while under a third of the sites collude with the server (docs/algorithms.md section 13)."),
    aggregation: Aggregation = typer.Option(
        "mean", "--aggregation",
        help="How a round's model updates combine: mean (weighted), or the coordinate-wise median or trimmed mean "
             "over sites, which outvotes one broken site (federated/aggregation.py: when it helps, its cost); "
             "not with --secure-aggregation."),
    dp: bool = typer.Option(False, "--dp", help="Differential privacy at every site (docs/privacy.md): Poisson "
                            "sampling, per-sample clipping and Gaussian noise at each local step, charged to each "
                            "site's privacy budget; needs --noise-multiplier or --target-epsilon."),
    noise_multiplier: float = typer.Option(None, "--noise-multiplier",
                                           help="With --dp: sigma; the noise's std is sigma x --max-grad-norm. "
                                           + bound("dp.noise_multiplier")),
    max_grad_norm: float = typer.Option(1.0, "--max-grad-norm",
                                        help="With --dp: C, the L2 bound of one record's gradient. "
                                        + bound("dp.max_grad_norm")),
    target_epsilon: float = typer.Option(None, "--target-epsilon",
                                         help="With --dp: each site picks the sigma that spends this epsilon there. "
                                         + bound("dp.target_epsilon")),
    eval_noise_multiplier: float = typer.Option(
        None, "--eval-noise-multiplier",
        help="With --dp: evaluate during training and check the champion, each site releasing its score "
             "histograms with this noise multiplier (counted in its ledger) and no per-site metric; without it a "
             f"DP training evaluates nothing. {bound('dp.eval_noise_multiplier')}"),
) -> None:
    """Train one algorithm on one federation (the Prefect flow train_federated), logged to MLflow."""
    import json

    from pipelines.checks import check_training
    from pipelines.prefect_env import configure_prefect_env
    from pipelines.tracking import run_outputs_dir

    run_name = run_name or f"{algorithm}-I{local_steps}"
    launcher = launcher_from_options(backend, flare_env, flare_workspace, kit)
    settings = {
        "algorithm": algorithm, "params": parse_params(param), "rounds": rounds, "local_steps": local_steps,
        "batch_size": batch_size, "lr": lr, "network": network, "seed": seed, "eval_every": eval_every,
        "checkpoint_dir": checkpoint_dir or launcher.checkpoint_dir(run_name, run_outputs_dir()), "resume": resume,
        "secure_aggregation": secure_aggregation, "secure_neighbours": "secagg+" if secagg_plus else "all",
        "robust_aggregation": aggregation.value, **({"diseases": disease} if disease else {}),
        **dp_settings(dp, noise_multiplier=noise_multiplier, target_epsilon=target_epsilon,
                      max_grad_norm=max_grad_norm, eval_noise_multiplier=eval_noise_multiplier),
        **({"timeout_s": site_timeout} if launcher.waits_for_sites else {})}
    _, shards_root = check_training(federation, shards, settings, launcher, OPTION_OF_SETTING)
    configure_prefect_env()
    summary = flows().train_federated(federation, str(shards_root), settings, run_name,
                                      launcher.model_dump(mode="json"))
    typer.echo(json.dumps(summary, indent=2))


# The option that gives each of the training's settings (federated.TrainSettings, a field by its dotted path): a
# bad value is named as it was typed.
OPTION_OF_SETTING = {
    "algorithm": "--algorithm", "diseases": "--disease", "params": "--param", "rounds": "--rounds", "local_steps": "--local-steps",
    "batch_size": "--batch-size", "lr": "--lr", "network": "--network", "seed": "--seed", "eval_every": "--eval-every",
    "checkpoint_dir": "--checkpoint-dir", "resume": "--resume", "secure_aggregation": "--secure-aggregation",
    "secure_neighbours": "--secagg-plus", "robust_aggregation": "--aggregation", "timeout_s": "--site-timeout",
    "dp": "--dp", "dp.noise_multiplier": "--noise-multiplier", "dp.target_epsilon": "--target-epsilon",
    "dp.max_grad_norm": "--max-grad-norm", "dp.eval_noise_multiplier": "--eval-noise-multiplier"}


def parse_params(items: list[str]) -> dict:
    """``--param NAME=VALUE`` options as hyperparameters (a VALUE that is not JSON is a string)."""
    import json

    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            typer.echo(f"--param {item!r}: expected NAME=VALUE", err=True)
            raise typer.Exit(code=2)
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    return params


def dp_settings(dp: bool, **options: float | None) -> dict:
    """``--dp`` and its options as the training's ``dp`` setting; without ``--dp`` there is none, and an option
    only DP reads is refused rather than ignored."""
    if dp:
        return {"dp": options}
    given = [OPTION_OF_SETTING[f"dp.{name}"] for name in ("noise_multiplier", "target_epsilon", "eval_noise_multiplier")
             if options[name] is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: {'needs' if len(given) == 1 else 'need'} --dp",
                          fix=f"add --dp to train under differential privacy, or leave out {' and '.join(given)}")
    return {}


COMPARE_SUMMARY = ("run", "federation", "status", "algorithm", "I", "AUC macro", "pAUC0.3 macro", "MB sent",
                   "minutes")


def compare_command(
    experiment: str = typer.Option("chest-xray", "--experiment", help="chest-xray or melanoma."),
    sort_by: str = typer.Option("AUC macro", "--sort-by", help="A column of the table."),
    show_all: bool = typer.Option(False, "--all", help="Also list failed, killed and running trainings."),
    federation: str = typer.Option(None, "--federation", help="Only this federation's trainings (its name)."),
    csv_path: str = typer.Option(None, "--csv", help="Also write the table to this CSV file."),
    html_path: str = typer.Option(None, "--html", help="Also write the table to this HTML file."),
    wide: bool = typer.Option(False, "--wide", help="Every column (sites, per-disease AUC / pAUC), not the "
                              "100-column summary."),
) -> None:
    """The experiment's trainings as a table: run, federation, status, algorithm, I, pooled test macro AUC
    [95 % interval] and pAUC, MB sent, minutes (--wide: sites and per disease too; --csv / --html: all).
    Unfinished runs are hidden unless --all."""
    from rich.console import Console

    from pipelines.compare import read_trainings, training_rows
    from pipelines.store_uri import tracking_uri
    from pipelines.tables import fold_interval_rows, rich_table, write_table

    try:  # an MLflow server is read over HTTP without importing MLflow (pipelines/compare.py), nor pandas here
        columns, rows, hidden = training_rows(read_trainings(experiment, tracking_uri()), sort_by, show_all)
    except ValueError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=1) from None
    if federation is not None:
        rows = [row for row in rows if row["federation"] == federation]
    title = f"{experiment}{f' / {federation}' if federation else ''}: pooled test metrics, best first"
    shown, cells = fold_interval_rows(columns, rows)
    if not wide:  # readable in a 100-column terminal; the rest in --wide, --csv, --html and MLflow
        shown = [c for c in COMPARE_SUMMARY if c in shown]
    Console(width=240 if wide else 100).print(
        rich_table(shown, cells, title, keep_whole=("run", "federation", "sites") if wide else ()))
    if hidden:
        typer.echo(f"{hidden} unfinished training(s) hidden (failed, killed or running); --all lists them")
    for path in filter(None, (csv_path, html_path)):
        import pandas as pd

        write_table(pd.DataFrame(rows, columns=columns), path, title)
        typer.echo(f"wrote {path}")
