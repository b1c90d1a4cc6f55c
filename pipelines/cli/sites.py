"""``fedauc sites ...`` and ``fedauc federation ...``: declare, validate and report on hospital sites and the
federations they form."""

from __future__ import annotations

import typer

sites_app = typer.Typer(help="Declare, validate and report on hospital sites.", no_args_is_help=True)
federation_app = typer.Typer(help="The hospitals that train together.", no_args_is_help=True)


@sites_app.command("validate")
def sites_validate(site_yaml: str = typer.Argument(..., help="The site's YAML, e.g. sites/x.yaml.")) -> None:
    """Check SITE_YAML and its data root; print every problem (exit code 1 when there is one)."""
    from common.errors import ConfigError
    from pipelines.hospital.sink_registry import check_sinks
    from preprocessing.sites import load_site, validate_site

    problems = validate_site(site_yaml)
    pacs = None if problems else load_site(site_yaml).pacs
    if pacs is not None:
        try:  # the sink names are the hospital package's, which the data package's check cannot see
            check_sinks(pacs.sinks)
        except ConfigError as err:
            problems = [f"{site_yaml}: {err}"]
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
    """Labels per split and disease (positives / negatives / missing, prevalence), patients, studies, views,
    counted from the metadata before decoding; exit code 1 when a quarantine reason takes more than the site's
    max_quarantine_share of its rows."""
    import json

    from rich.console import Console

    from preprocessing.label_report import label_report, render_label_report, require_usable_rows
    from preprocessing.losses import excess_losses
    from preprocessing.scan import scan_site
    from preprocessing.sites import load_site, unmapped_label_values

    if not labels_only:
        typer.echo("image statistics come with the shards (`fedauc preprocess`, qc/report.md); "
                   "pass --labels-only for the metadata report", err=True)
        raise typer.Exit(code=2)
    config = load_site(site_yaml)
    scanned = scan_site(config)
    report = label_report(scanned, config.task, unmapped_label_values(config))
    require_usable_rows(report, config.name)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        render_label_report(report, Console(), title=f"{config.name} ({config.format})")
    losses = excess_losses(scanned.quarantine, scanned.input_rows, config.max_quarantine_share)
    for line in losses:
        typer.echo(f"{site_yaml}: {line}", err=True)
    if losses:
        raise typer.Exit(code=1)


@sites_app.command("ledger")
def sites_ledger(
    site_yaml: str = typer.Argument(..., help="The site's YAML, e.g. sites/x.yaml."),
    moved: bool = typer.Option(False, "--moved", help="The same records, moved or re-exported: the site's ledger, "
                               "with its budget and spend, now guards them."),
    new_dataset: bool = typer.Option(False, "--new-dataset", help="Other records under the site's name: a fresh "
                                     "ledger for them; the site's other ledgers stay for their own data."),
    source: str = typer.Option(None, "--from", help="With --moved: the binding id of the ledger that moved, where "
                               "the site has several."),
) -> None:
    """Which privacy ledger guards SITE_YAML's data (its root and label table); with --moved or --new-dataset, bind
    it as the operator says (docs/privacy.md section 2). Exit code 1 while the site's data has no usable ledger."""
    from federated.privacy.binding import check_binding, data_binding, rebind
    from preprocessing.scan import scan_site
    from preprocessing.sites import load_site

    if moved and new_dataset:
        raise typer.BadParameter("--moved or --new-dataset, not both")
    config = load_site(site_yaml)
    binding = data_binding(config.root, scan_site(config).metadata_files)
    if moved or new_dataset:
        typer.echo(rebind(config.name, binding, "moved" if moved else "new-dataset", source))
        return
    path = check_binding(config.name, binding.id, site_yaml)
    typer.echo(f"site {config.name!r}: privacy ledger {path} guards this data (binding {binding.id})"
               if path.exists() else f"site {config.name!r}: no ledger yet for this data (binding {binding.id})")


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
