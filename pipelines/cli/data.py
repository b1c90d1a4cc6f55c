"""``fedauc inspect``, ``fedauc synth`` and ``fedauc preprocess``: a hospital's images, synthetic hospitals and
the shards that training reads."""

from __future__ import annotations

import os

import typer

from pipelines.cli.application import quiet_prefect_user_errors


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


def preprocess(
    site_yaml: str = typer.Argument(..., help="The site's YAML, e.g. sites/x.yaml."),
    out: str = typer.Option(None, "--out", help="Shards go to OUT/<site>/ (default: $FEDAUC_SHARDS, else shards/)."),
    workers: int = typer.Option(2, "--workers", min=0, help="Decoding processes (0: in this process)."),
    raise_budget: bool = typer.Option(False, "--raise-budget",
                                      help="Raise (or remove) the site's privacy budget to what its YAML says; "
                                           "without it an edit can only lower the budget."),
) -> None:
    """Scan, split, decode, resize and write a site's shards and QC report (the Prefect flow preprocess_site).
    Exit code 3 when a quarantine reason took more than the site's max_quarantine_share of its rows (the shards
    and the report are written)."""
    import pandas as pd

    from pipelines.checks import check_site
    from pipelines.onboarding import shards_root
    from pipelines.prefect_env import configure_prefect_env
    from preprocessing.locks import check_site_free
    from preprocessing.losses import LOSS_EXIT_CODE, excess_losses
    from preprocessing.shard_format import QUARANTINE_FILE
    from preprocessing.sites import load_site

    out = shards_root(out)
    # Problems found before the flow starts are reported as such, not as a failed Prefect task run.
    check_site(site_yaml)
    site = load_site(site_yaml)
    site.require_dataset("preprocess")
    check_site_free(out / site.name)
    configure_prefect_env()
    from pipelines.onboarding import SHARDS_ENV
    from pipelines.preprocess_flow import preprocess_site
    from pipelines.site_params import name_here, sites_env

    quiet_prefect_user_errors()

    # The flow run carries names only (pipelines.site_params): where they point, this command's entry says.
    os.environ.update({**sites_env(site_yaml), SHARDS_ENV: str(out.resolve())})
    summary = preprocess_site(name_here(site_yaml), workers=workers, raise_budget=raise_budget)
    state = "unchanged, nothing to do" if summary["reused"] else "written"
    typer.echo(f"{summary['site']}: shards {state} in {out / summary['site_dir']}")
    typer.echo(f"  counts per split: {summary['counts']}")
    typer.echo(
        f"  input rows {summary['input_rows']} = kept {summary['kept']} + quarantined {summary['quarantined']}"
    )
    typer.echo(f"  QC report: {out / summary['report_md']}")
    for warning in summary["warnings"]:
        typer.echo(f"  warning: {warning}", err=True)
    if summary["quarantine_over_share"]:
        # Said here, at the site, from its own quarantine: the lines name columns, values and file patterns,
        # which the flow's result and logs (the consortium's Prefect server) must not carry.
        quarantine = pd.read_parquet(out / summary["site_dir"] / QUARANTINE_FILE,
                                     columns=["stage", "reason", "detail", "image_path"])
        for line in excess_losses(quarantine, summary["input_rows"], site.max_quarantine_share):
            typer.echo(f"{site_yaml}: {line}", err=True)
        typer.echo(f"  the shards and the QC report are written; exit code {LOSS_EXIT_CODE}: rows were lost", err=True)
        raise typer.Exit(code=LOSS_EXIT_CODE)
