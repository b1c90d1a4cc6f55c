"""The hospital's commands: ``fedauc predict`` (a registered model on files, folders or a site's dataset) and
``fedauc thresholds`` (operating points read again on the hospital's own validation split). The logic is in
pipelines/hospital/."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import typer

MODEL = typer.Option(None, "--model", help="A registered model, models:/<name>/<version> or models:/<name>@<alias> "
                     "(default: the champion of --task, or of the site's task).")
TASK = typer.Option(None, "--task", help="Whose champion to use when --model is not given: chest-xray or melanoma.")


def predict_command(
    inputs: list[str] = typer.Argument(..., help="Image files, folders (every file under them) or site YAMLs."),
    out: Path = typer.Option(..., "--out", help="The table to write: *.csv or *.parquet (one row per image)."),
    model: str = MODEL,
    task: str = TASK,
    split: str = typer.Option(None, "--split", help="With a site YAML: only this split (train, valid or test)."),
    operating_point: str = typer.Option("youden", "--operating-point", help="sens90, sens95 or youden."),
    thresholds: Path = typer.Option(None, "--thresholds", help="The hospital's own operating points (a file "
                                    "`fedauc thresholds` wrote; default: the site's file beside its shards, when "
                                    "a site YAML is given and has one)."),
    shards: str = typer.Option(None, "--shards", help="Where the site's shards are (default: $FEDAUC_SHARDS, else "
                               "shards/); its thresholds/ folder holds the hospital's operating points."),
    batch_size: int = typer.Option(64, "--batch-size", min=1),
    workers: int = typer.Option(1, "--workers", min=0, help="Decoding processes (0: in this one, no time limit)."),
) -> None:
    """Score images with a registered model: per image each disease's probability and its decision at the
    operating point; refused files get a row with the reason."""
    from tqdm.auto import tqdm

    from pipelines import tracking
    from pipelines.hospital import table
    from pipelines.model_package import loading
    from pipelines.model_package.thresholds import hospital_file
    from pipelines.onboarding import shards_root
    from preprocessing.sites import load_site

    tracking.configure()
    sites = [load_site(p) for p in inputs if p.endswith((".yaml", ".yml")) and Path(p).is_file()]
    for site in sites:  # before the model is fetched: a site that only scores its PACS has no dataset to score
        site.require_dataset("predict on its dataset")
    task = task or (sites[0].task if sites else None)
    with loading.scratch_folder() as folder:
        scorer = loading.load_registered(model, task, Path(folder))
        own = thresholds
        if own is None and sites:
            own = hospital_file(shards_root(shards), sites[0].name, scorer.name, scorer.version)
        chosen = loading.choose_points(scorer, operating_point, own)
        scorer = loading.with_hospital_refit(scorer, own)
        typer.echo(f"model {scorer.name} version {scorer.version}; operating point {operating_point}: {chosen.source}")
        total = sum(1 for _ in table.input_items(inputs, split))
        set_aside: list[dict] = []
        with tqdm(total=total, desc="predict", unit="image") as bar:
            counts = table.predict_to_table(scorer, table.input_items(inputs, split, set_aside), out, chosen,
                                            batch_size, workers, bar.update, set_aside)
    typer.echo(f"{sum(counts.values())} rows written to {out}: "
               + ", ".join(f"{n} {key}" for key, n in sorted(counts.items())))


def thresholds_command(
    site: Path = typer.Argument(..., help="The hospital's site YAML."),
    model: str = MODEL,
    shards: str = typer.Option(None, "--shards", help="Where the site's shards are (default: $FEDAUC_SHARDS, else shards/)."),
    out: Path = typer.Option(None, "--out", help="Where to write them (default: <shards>/thresholds/<site>/<model>-v<version>.json)."),
) -> None:
    """Read the operating points, the out-of-distribution threshold and the calibration map again on this
    hospital's own validation split (its scores stay here); predict and the PACS job then use them for this site."""
    from pipelines import tracking
    from pipelines.hospital import table
    from pipelines.model_package import loading
    from pipelines.model_package import thresholds as op
    from pipelines.onboarding import shards_root
    from preprocessing.sites import load_site

    tracking.configure()
    config = load_site(site)
    root = shards_root(shards)
    with loading.scratch_folder() as folder:
        scorer = loading.load_registered(model, config.task, Path(folder))
        points = table.recalibrate(scorer, config, root / config.name)
    path = op.write(points, out or op.hospital_file(root, config.name, scorer.name, scorer.version))
    typer.echo(f"operating points of {scorer.name} v{scorer.version} on {points.source} written to {path}")
    for disease, by_point in points.points.items():
        typer.echo(f"  {disease}: " + "; ".join(f"{name} >= {p.threshold:.3f} (sens {p.sensitivity:.2f}, "
                                                f"spec {p.specificity:.2f})" for name, p in by_point.items()))
    for disease, reason in points.undefined.items():
        typer.echo(f"  {disease}: none ({reason})")
    if points.ood is not None:
        test = "" if points.ood.test_false_refusal is None else f", its test split {points.ood.test_false_refusal:.1%}"
        typer.echo(f"  out of distribution above {points.ood.threshold:.2f} (registered: "
                   f"{scorer.contract.ood.threshold:.2f}; read as {points.ood.source.split(': ', 1)[-1]}): refuses "
                   f"{points.ood.valid_false_refusal:.1%} of this site's validation split{test}")
    if points.calibration is not None:
        typer.echo(f"  calibration map refitted for {', '.join(points.calibration.diseases) or 'no disease'}")


def pacs_command(
    site: Path = typer.Argument(..., help="The hospital's site YAML (its pacs: block, or FEDAUC_PACS_URL)."),
    model: str = MODEL,
    shards: str = typer.Option(None, "--shards", help="Where the site's shards are (its validation split is the "
                               "drift reference; the job's state and the hospital's operating points live there)."),
    operating_point: str = typer.Option("youden", "--operating-point", help="sens90, sens95 or youden."),
    since: datetime = typer.Option(None, "--since", formats=["%Y-%m-%d"], help="Look at studies dated from this "
                                   "day (YYYY-MM-DD) on, this run (default: pacs.lookback_days before the last run, "
                                   "before today on the first)."),
    allow_synthetic_model: bool = typer.Option(False, "--allow-synthetic-model", help="Write the decisions of a "
                                               "model trained on synthetic images (or one that does not say) into "
                                               "the PACS: a demo's or a test's PACS only."),
) -> None:
    """Score the PACS's new studies (DICOMweb) and store one DICOM SR per study back; once a day, the day's
    aggregate counts and histograms go to the centre's MLflow (what the scheduled deployment runs). Exits 1
    when a study could not be retrieved whole (named here, retried on later runs), after scoring the rest."""
    from pipelines import tracking
    from pipelines.hospital import job
    from pipelines.onboarding import shards_root

    tracking.configure()
    job.run(site, shards_root(shards), model, operating_point, echo=typer.echo,
            local=lambda line: typer.echo(line, err=True), since=since.date() if since else None,
            allow_synthetic_model=allow_synthetic_model)
