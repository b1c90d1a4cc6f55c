"""The ``fedauc`` command line. Thin: every command parses arguments and calls into a package."""

from __future__ import annotations

import logging
import os
from enum import Enum

import typer
from typer.core import TyperGroup

from preprocessing.errors import FedaucError


class _UserErrorsAsMessages(TyperGroup):
    """A FedaucError (a problem the user fixes: a data file, a YAML, a missing shard) ends any command with
    one message, its fix and exit code 1; ``fedauc --debug ...`` (or FEDAUC_DEBUG=1) shows the traceback.
    Anything else is a bug and keeps its traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except FedaucError as err:
            if _debug():
                raise
            typer.echo(f"error: {err}", err=True)
            typer.echo("(`fedauc --debug ...` shows the traceback)", err=True)
            raise typer.Exit(code=1) from None


_options_given = {"debug": False}  # set by the app callback on every invocation


def _debug() -> bool:
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

sites_app = typer.Typer(help="Declare, validate and report on hospital sites.", no_args_is_help=True)
app.add_typer(sites_app, name="sites")
federation_app = typer.Typer(help="The hospitals that train together.", no_args_is_help=True)
app.add_typer(federation_app, name="federation")


@sites_app.command("validate")
def sites_validate(site_yaml: str = typer.Argument(..., help="The site's YAML, e.g. sites/x.yaml.")) -> None:
    """Check SITE_YAML and its data root; print every problem (exit code 1 when there is one)."""
    from preprocessing.sites import validate_site

    problems = validate_site(site_yaml)
    for problem in problems:
        typer.echo(str(problem), err=True)
    if problems:
        raise typer.Exit(code=1)
    typer.echo(f"{site_yaml}: ok")


@sites_app.command("report")
def sites_report(
    site_yaml: str = typer.Argument(..., help="The site's YAML, e.g. sites/x.yaml."),
    labels_only: bool = typer.Option(False, "--labels-only", help="Read the metadata only, never the images."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
) -> None:
    """Labels per split and disease (positives / negatives / missing, prevalence), patients, studies, views."""
    import json

    from rich.console import Console

    from preprocessing.label_report import label_report, render_label_report, require_usable_rows
    from preprocessing.scan import scan_site
    from preprocessing.sites import load_site

    if not labels_only:
        typer.echo("image statistics come with the shards (`fedauc preprocess`, qc/report.md); "
                   "pass --labels-only for the metadata report", err=True)
        raise typer.Exit(code=2)
    config = load_site(site_yaml)
    report = label_report(scan_site(config))
    require_usable_rows(report, config.name)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        render_label_report(report, Console(), title=f"{config.name} ({config.format})")


@sites_app.command("new")
def sites_new(
    name: str = typer.Argument(..., help="The hospital's short name (letters, digits, - _ .), e.g. oslo."),
    fmt: str = typer.Option(..., "--format", help="chexpert, mimic-cxr-jpg, nih-cxr14, padchest, vindr-cxr, "
                            "siim-isic-2020, generic-csv or generic-dicom."),
    root: str = typer.Option(None, "--root", help="The data folder at this hospital (default: a placeholder)."),
    task: str = typer.Option(None, "--task", help="chest-xray or melanoma (default: the format's first)."),
    option: list[str] = typer.Option([], "--option", "-o", help="A format option NAME=VALUE (JSON value), "
                                     "e.g. -o labels_csv=labels.csv."),
    out: str = typer.Option(None, "--out", help="Where to write it (default: sites/<name>.yaml)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file."),
) -> None:
    """Write a commented site YAML for a new hospital; then edit what it marks EDIT-ME and validate it."""
    from pipelines.onboarding import EDIT, parse_assignments, site_template, write_site_template
    from preprocessing.sites import validate_site

    text = site_template(name, fmt, root or EDIT, task, parse_assignments(option, "--option"))
    path = write_site_template(out or f"sites/{name}.yaml", text, overwrite=force)
    typer.echo(f"wrote {path}")
    problems = validate_site(path)
    if problems:
        typer.echo(f"to do before `fedauc sites validate {path}` passes:", err=True)
        for problem in problems:
            typer.echo(f"  {problem}", err=True)


@federation_app.command("add")
def federation_add(
    federation_yaml: str = typer.Argument(..., help="The federation's YAML (created when it does not exist)."),
    site_yaml: str = typer.Argument(..., help="The site YAML to add."),
    name: str = typer.Option(None, "--name", help="A new federation's name (default: the file's name)."),
) -> None:
    """Add a site to a federation; the file is changed only if the federation still loads."""
    from pipelines.onboarding import add_site

    federation = add_site(federation_yaml, site_yaml, name)
    typer.echo(f"{federation_yaml}: federation {federation.name} ({federation.task}): "
               f"{', '.join(site.name for site in federation.sites)}")


@app.command()
def inspect(
    file: str = typer.Argument(..., help="A DICOM, PNG or JPEG file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of lines."),
) -> None:
    """Decode FILE the way preprocessing does and print what it found (exit code 1 when it cannot)."""
    import json

    from preprocessing.decode import inspect_file

    summary = inspect_file(file)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            typer.echo(f"{key:>16}: {value}")
    if summary["error"] is not None:
        raise typer.Exit(code=1)


@app.command()
def synth(
    out: str = typer.Option(None, "--out", help="Output folder (with --federation: OUT/<site>; default: the sites' roots)."),
    fmt: str = typer.Option(None, "--format", help="chexpert, mimic-cxr-jpg, nih-cxr14, padchest, vindr-cxr or siim-isic-2020."),
    n: int = typer.Option(200, "--n", min=1, help="Images to write (--format)."),
    seed: int = typer.Option(0, "--seed"),
    federation: str = typer.Option(None, "--federation", help="A federation YAML: generate every site's synth: entry."),
    scale: float = typer.Option(1.0, "--scale", min=0.001, help="Multiply every site's size (--federation)."),
    profile: str = typer.Option(None, "--profile", help="Acquisition profile (default: the format's own)."),
    image_format: str = typer.Option(None, "--image-format", help="siim-isic-2020: dicom (default) or jpeg."),
    corrupt: float = typer.Option(0.0, "--corrupt", min=0.0, max=0.99, help="Fraction of image files to damage."),
    workers: int = typer.Option(None, "--workers", min=0, help="Rendering processes (default: CPU count, up to 4)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out (--format)."),
) -> None:
    """Write synthetic hospitals in the real dataset layouts (phantom images, real public metadata)."""
    from preprocessing.synth import generate_federation, generate_site

    if (fmt is None) == (federation is None):
        typer.echo("give exactly one of --format (with --out) or --federation", err=True)
        raise typer.Exit(code=2)
    if fmt is not None:
        if out is None:
            typer.echo("--format needs --out", err=True)
            raise typer.Exit(code=2)
        results = {fmt: generate_site(fmt, out, n, seed, profile=profile, corrupt=corrupt, workers=workers,
                                      overwrite=overwrite, image_format=image_format)}
    else:
        results = generate_federation(federation, out, scale=scale, seed=seed, workers=workers)
    for name, result in results.items():
        source = "real public metadata" if result.real_metadata else "fallback label model"
        typer.echo(f"{name}: {result.images} images ({result.format}, {source}) in {result.root} [{result.seconds:.1f} s]")
        for row in result.corrupted.itertuples():
            typer.echo(f"  damaged {row.image_path} ({row.damage}): expect {row.expected_reason}")


@app.command()
def preprocess(
    site_yaml: str = typer.Argument(..., help="The site's YAML, e.g. sites/x.yaml."),
    out: str = typer.Option(None, "--out", help="Shards go to OUT/<site>/ (default: $FEDAUC_SHARDS, else shards/)."),
    workers: int = typer.Option(2, "--workers", min=0, help="Decoding processes (0: in this process)."),
) -> None:
    """Scan, split, decode, resize and write a site's shards and QC report (the Prefect flow preprocess_site)."""
    from pipelines.checks import check_site
    from pipelines.onboarding import shards_root
    from pipelines.prefect_env import configure_prefect_env
    from preprocessing.locks import check_site_free
    from preprocessing.sites import load_site

    out = shards_root(out)
    # Problems found before the flow starts are reported as such, not as a failed Prefect task run.
    check_site(site_yaml)
    check_site_free(out / load_site(site_yaml).name)
    configure_prefect_env()
    from pipelines.preprocess_flow import preprocess_site

    _quiet_prefect_user_errors()

    summary = preprocess_site(site_yaml, str(out), workers)
    state = "unchanged, nothing to do" if summary["reused"] else "written"
    typer.echo(f"{summary['site']}: shards {state} in {summary['site_dir']}")
    typer.echo(f"  counts per split: {summary['counts']}")
    typer.echo(
        f"  input rows {summary['input_rows']} = kept {summary['kept']} + quarantined {summary['quarantined']}"
    )
    typer.echo(f"  QC report: {summary['report_md']}")
    for warning in summary["warnings"]:
        typer.echo(f"  warning: {warning}", err=True)


def _quiet_prefect_user_errors() -> None:
    if _debug():
        return
    for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_DropUserErrorTracebacks())


def _flows():
    """The Prefect flows, imported after the embedded-Prefect environment defaults are set."""
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    from pipelines import flows

    _quiet_prefect_user_errors()
    return flows


@app.command()
def demo(
    scale: float = typer.Option(1.0, "--scale", min=0.01, help="Multiply every demo hospital's size."),
    rounds: int = typer.Option(None, "--rounds", min=1, help="Override the demo's communication rounds."),
) -> None:
    """The main job on the embedded default: synthetic hospitals -> shards -> FedAvg and AUC methods on both
    tasks -> MLflow -> comparison tables with 95 % intervals, and the seconds each stage took."""
    from pipelines.prefect_env import boot_ephemeral_server, configure_prefect_env

    configure_prefect_env()
    booting = boot_ephemeral_server()  # while the flows, torch and MLflow are imported
    _flows()
    from pipelines.demo import demo as demo_flow
    from pipelines.schedule import profile_markdown
    from pipelines.tracking import configure

    if booting is not None:
        booting.join()
    result = demo_flow(scale=scale, rounds=rounds)
    typer.echo(result["tables"])
    typer.echo(f"Where the time went:\n\n{profile_markdown(result['profile'])}")
    typer.echo(f"MLflow runs and the registered champions: {configure()}  (browse them with `fedauc ui`)")
    typer.echo("Shards and QC reports: demo_data/shards/<site>/qc/report.md")


class TrainBackend(str, Enum):
    inprocess = "inprocess"
    flare = "flare"


class FlareEnv(str, Enum):  # federated/flare/job.py FLARE_ENVS
    sim = "sim"
    poc = "poc"
    prod = "prod"


@app.command("train")
def train_command(
    federation: str = typer.Option(..., "--federation", help="A federation YAML, e.g. sites/demo/chest.yaml."),
    algorithm: str = typer.Option(..., "--algorithm", help="A registered algorithm, e.g. codasca."),
    shards: str = typer.Option(None, "--shards", help="Where `fedauc preprocess` wrote the shards "
                               "(default: $FEDAUC_SHARDS, else the federation's shards:, else shards/); "
                               "not read with --flare-env prod (the hospitals read their own)."),
    rounds: int = typer.Option(20, "--rounds", min=1),
    local_steps: int = typer.Option(8, "--local-steps", "-I", min=1, help="Local steps between communications."),
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Per site."),
    lr: float = typer.Option(0.1, "--lr"),
    network: str = typer.Option("small_resnet", "--network", help="small_resnet, resnet18 or densenet121."),
    param: list[str] = typer.Option([], "--param", "-p", help="Algorithm hyperparameter NAME=VALUE (JSON value)."),
    seed: int = typer.Option(0, "--seed"),
    eval_every: int = typer.Option(5, "--eval-every", min=0),
    run_name: str = typer.Option(None, "--run-name"),
    checkpoint_dir: str = typer.Option(None, "--checkpoint-dir",
                                       help="Checkpoint after every round here (default checkpoints/<run name>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last round checkpoint of this training."),
    backend: TrainBackend = typer.Option("inprocess", "--backend",
                                help="inprocess: every site in this process; flare: an NVIDIA FLARE job."),
    flare_env: FlareEnv = typer.Option("sim", "--flare-env",
                                  help="With --backend flare: sim = NVFlare's simulator, one process per site here; "
                                       "poc = a provisioned consortium (mutual TLS) started here for this job; "
                                       "prod = the running consortium the --kit admin kit reaches."),
    flare_workspace: str = typer.Option("flare_workspace", "--flare-workspace",
                                        help="With --backend flare: the NVFlare job's workspace (its logs stay here)."),
    kit: str = typer.Option(None, "--kit", help="With --flare-env prod: the admin's startup kit "
                            "(the admin@... folder of `fedauc consortium provision`)."),
    site_timeout: float = typer.Option(300.0, "--site-timeout", min=1.0,
                                       help="With --backend flare: seconds the sites wait for a silent site at a "
                                            "communication before the job fails naming it."),
) -> None:
    """Train one algorithm on one federation (the Prefect flow train_federated), logged to MLflow."""
    import json

    params = {}
    for item in param:
        name, sep, value = item.partition("=")
        if not sep:
            typer.echo(f"--param {item!r}: expected NAME=VALUE", err=True)
            raise typer.Exit(code=2)
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    run_name = run_name or f"{algorithm}-I{local_steps}"
    config = {"algorithm": algorithm, "params": params, "rounds": rounds, "local_steps": local_steps,
              "batch_size": batch_size, "lr": lr, "network": network, "seed": seed, "eval_every": eval_every,
              "checkpoint_dir": checkpoint_dir or f"checkpoints/{run_name}", "resume": resume}
    if backend is TrainBackend.flare:
        config["timeout_s"] = site_timeout
    from pipelines.checks import check_training

    flare = None
    if backend is TrainBackend.flare:
        from federated.flare.job import check_flare_env

        check_flare_env(flare_env.value, kit)
        flare = {"env": flare_env.value, "workspace": flare_workspace, "kit": kit}
    # A running consortium's sites read their own shards at the hospitals: none are needed here.
    _, shards_root = check_training(federation, shards, config, local_sites=flare is None or flare["env"] != "prod")
    summary = _flows().train_federated(federation, str(shards_root), config, run_name, flare)
    typer.echo(json.dumps(summary, indent=2))


@app.command("evaluate")
def evaluate_command(
    federation: str = typer.Option(..., "--federation", help="A federation YAML."),
    shards: str = typer.Option(None, "--shards", help="Default: $FEDAUC_SHARDS, else the federation's shards:, "
                               "else shards/."),
    model_uri: str = typer.Option(None, "--model-uri", help="Default: models:/fedauc-<task>@champion."),
) -> None:
    """A registered model on every site's test split and pooled (the Prefect flow evaluate)."""
    import pandas as pd

    from pipelines.checks import check_evaluation
    from pipelines.runs import metrics_rows
    from pipelines.tables import markdown_table

    _, shards_root = check_evaluation(federation, shards)
    metrics = _flows().evaluate(federation, str(shards_root), model_uri)
    typer.echo(markdown_table(pd.DataFrame(metrics_rows(metrics))))


@app.command("compare")
def compare_command(
    experiment: str = typer.Option("chest-xray", "--experiment", help="chest-xray or melanoma."),
    sort_by: str = typer.Option("AUC macro", "--sort-by", help="A column of the table."),
    show_all: bool = typer.Option(False, "--all", help="Also list failed, killed and running trainings."),
    federation: str = typer.Option(None, "--federation", help="Only this federation's trainings (its name)."),
    csv_path: str = typer.Option(None, "--csv", help="Also write the table to this CSV file."),
    html_path: str = typer.Option(None, "--html", help="Also write the table to this HTML file."),
) -> None:
    """The experiment's trainings as a table: federation, sites, status, algorithm, I, per-disease pooled test
    AUC [95 % interval] / pAUC, MB sent, minutes. Unfinished runs are hidden unless --all."""
    from rich.console import Console

    from pipelines.tables import fold_intervals, rich_table, write_table
    from pipelines.tracking import compare_runs, configure

    configure()
    try:
        frame = compare_runs(experiment, sort_by, include_unfinished=show_all)
    except ValueError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(code=1) from None
    hidden = frame.attrs["hidden"]
    if federation is not None and not frame.empty:
        frame = frame[frame["federation"] == federation].reset_index(drop=True)
    title = f"{experiment}{f' / {federation}' if federation else ''}: pooled test metrics, best first"
    Console(width=240).print(rich_table(fold_intervals(frame), title, keep_whole=("run", "federation", "sites")))
    if hidden:
        typer.echo(f"{hidden} unfinished training(s) hidden (failed, killed or running); --all lists them")
    for path in filter(None, (csv_path, html_path)):
        write_table(frame, path, title)
        typer.echo(f"wrote {path}")


@app.command()
def ui(
    mlflow_port: int = typer.Option(5000, "--mlflow-port"),
    prefect_port: int = typer.Option(4200, "--prefect-port"),
) -> None:
    """Start the MLflow UI and the Prefect UI on localhost, print their URLs, stop both on Ctrl-C."""
    from pipelines.prefect_env import configure_prefect_env
    from pipelines.servers import serve_uis

    configure_prefect_env()
    serve_uis(mlflow_port, prefect_port, echo=typer.echo)


consortium_app = typer.Typer(help="An NVIDIA FLARE consortium: provision its kits, start a hospital's client.",
                             no_args_is_help=True)
app.add_typer(consortium_app, name="consortium")


def _fail(err: Exception) -> None:
    typer.echo(str(err), err=True)
    raise typer.Exit(code=1) from None


@consortium_app.command("provision")
def consortium_provision(
    federation: str = typer.Argument(..., help="The federation YAML: one client kit per hospital it lists."),
    out: str = typer.Option(..., "--out", help="Folder for project.yml, the root CA state and the kits."),
    server_host: str = typer.Option("localhost", "--server-host", help="The name the hospitals dial (the server's FQDN)."),
    port: int = typer.Option(8002, "--port", min=1, max=65535, help="The server's one port (mutual TLS)."),
    admin: str = typer.Option("admin@fedauc.org", "--admin", help="The project admin who submits trainings."),
) -> None:
    """Write the consortium's project file and startup kits (server, one per hospital, one admin) and say
    what to send to whom."""
    from pathlib import Path

    from federated.flare.provision import project, provision
    from preprocessing.errors import FedaucError
    from preprocessing.federation import load_federation

    try:
        kits = provision(project(load_federation(federation), server_host, port, admin), Path(out))
    except FedaucError as err:
        _fail(err)
    typer.echo(kits.summary(server_host, port))


@consortium_app.command("start-site")
def consortium_start_site(
    kit: str = typer.Argument(..., help="This hospital's startup kit (from `fedauc consortium provision`)."),
    site_yaml: str = typer.Option(..., "--site-yaml", help="This hospital's site YAML (its name must be the kit's)."),
    shards: str = typer.Option(..., "--shards", help="Where `fedauc preprocess` wrote this site's shards (OUT of --out)."),
) -> None:
    """Check the kit, its certificate, the server and the shards, then run this hospital's NVFlare client
    in the foreground until it stops."""
    from federated.flare.consortium import check_certificate, prepare_site, run_site
    from preprocessing.errors import FedaucError

    try:
        client = prepare_site(kit, site_yaml, shards)
    except FedaucError as err:
        _fail(err)
    typer.echo(f"site {client.name}: certificate valid until {check_certificate(client):%Y-%m-%d}; "
               f"dialling {client.server_host}:{client.server_port}")
    raise typer.Exit(code=run_site(client))


@app.command()
def deploy(
    prefect_file: str = typer.Option("infra/prefect.yaml", "--prefect-file", help="The Prefect project file."),
) -> None:
    """Register every deployment of PREFECT_FILE with the Prefect server at PREFECT_API_URL, creating the work
    pools they name first; all or nothing (what this command created is removed again on failure)."""
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    from pipelines.deploy import deploy as deploy_all

    _quiet_prefect_user_errors()
    result = deploy_all(prefect_file, echo=typer.echo)
    typer.echo(f"registered {len(result.deployments)} deployments: {', '.join(result.deployments)}")


if __name__ == "__main__":
    app()
