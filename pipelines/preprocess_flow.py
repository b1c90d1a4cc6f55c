"""The Prefect flow ``preprocess_site``: scan -> write shards (decode, resize in parallel) -> QC report.

Thin by design: each task calls one package function (``preprocessing.scan``, ``preprocessing.shards``,
``preprocessing.qc``), which run and are tested without Prefect. Tasks do not use Prefect's cache: the
shard writer's content hash decides whether there is work, and covers more than the task inputs do.
Its parameters and result reach the consortium's Prefect server: the site's name, no path
(``pipelines.site_params``). Import this module after ``pipelines.prefect_env.configure_prefect_env()``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from federated.privacy.binding import check_binding, data_binding
from federated.privacy.budget import declared_budget, set_budget
from federated.privacy.ledger import check_delta
from pipelines import run_names
from pipelines.site_params import failures_stay_at_the_site, site_shards, site_yaml
from preprocessing.label_report import label_report, require_usable_rows
from preprocessing.losses import excess_reasons
from preprocessing.qc import (
    build_report,
    check_accounting,
    render_central_markdown,
    write_central_summary,
    write_report,
)
from preprocessing.qc_counts import central_summary
from preprocessing.scan import ScanResult, scan_site
from preprocessing.shard_format import QUARANTINE_FILE
from preprocessing.shards import ShardSummary, shard_site
from preprocessing.sites import SiteConfig, load_site


def artifact_key(text: str) -> str:
    """A Prefect artifact key from a site, file or run name (keys allow lower-case letters, digits and '-')."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


@task(name="scan", task_run_name=run_names.site_step("scan"), cache_policy=NO_CACHE)
@failures_stay_at_the_site("scan")
def scan(site_yaml: str) -> tuple[SiteConfig, ScanResult]:
    config = load_site(site_yaml)
    return config, scan_site(config)


@task(name="write-shards", task_run_name="write-shards {config.name}", cache_policy=NO_CACHE)
@failures_stay_at_the_site("write-shards")
def write_shards(config: SiteConfig, result: ScanResult, out_dir: str, workers: int, binding: str) -> ShardSummary:
    return shard_site(config, result, Path(out_dir), workers=workers, ledger_binding=binding)


@task(name="qc-report", task_run_name="qc-report {config.name}", cache_policy=NO_CACHE)
@failures_stay_at_the_site("qc-report")
def report(config: SiteConfig, summary: ShardSummary, ages: dict[str, int]) -> dict:
    qc = build_report(summary.site_dir, ages)
    json_path, md_path = write_report(summary.site_dir, qc)
    # The Prefect server is the consortium's: it gets the counts-only summary, the full report stays here.
    shared = central_summary(qc, config.sharing.min_count, config.sharing.qc_grid)
    write_central_summary(summary.site_dir, shared)
    create_markdown_artifact(
        key=f"qc-{artifact_key(summary.site)}",
        markdown=render_central_markdown(shared),
        description=f"QC summary of site {summary.site} (the full report stays at the site)",
    )
    check_accounting(qc)  # after writing, so a broken identity can be read in the report itself
    # Relative to the shards folder: the result reaches the centre.
    return {"report_json": str(json_path.relative_to(summary.site_dir.parent)),
            "report_md": str(md_path.relative_to(summary.site_dir.parent))}


def preprocess(config_path: str | Path, out_dir: str | Path, workers: int = 2, raise_budget: bool = False) -> dict:
    """The flow's work, run inside a flow: the site YAML ``config_path``'s shards into ``out_dir``; paths in
    what it returns are relative to ``out_dir``. ``raise_budget``: the hospital raises (or removes) its privacy
    budget (``fedauc preprocess --raise-budget``); an edit of the YAML alone only lowers it."""
    config, result = scan(str(config_path))
    labels = label_report(result, config.task)
    require_usable_rows(labels, config.name)
    # Which ledger guards these records (the site's for this root and label table), refused before any shard is
    # written where one of the site's name guards other data.
    binding = data_binding(config.root, result.metadata_files)
    ledger = check_binding(config.name, binding.id, str(config_path))
    declared_before = declared_budget(Path(out_dir) / config.name)  # before the shards are rewritten
    summary = write_shards(config, result, str(out_dir), workers, binding.id)
    if config.privacy is not None:
        check_delta(config.name, config.privacy.delta, summary.counts.get("train", 0))
    # The site's privacy budget goes into its ledger (wherever its shards are), a change as an event.
    _, budget_change = set_budget(config.name, summary.site_dir, config.privacy, raise_budget, config_path,
                                  declared_before, binding)
    print(f"site {config.name!r}: privacy ledger {ledger} (binding {binding.id}: this data root and label table)"
          if ledger.exists() else f"site {config.name!r}: no privacy budget, no ledger", flush=True)
    if budget_change is not None:
        print(budget_change, flush=True)
    paths = report(config, summary, result.ages)
    quarantine = pd.read_parquet(summary.site_dir / QUARANTINE_FILE, columns=["reason"])
    # The reasons' names only: the centre learns the counts per reason anyway (qc/central.json), never the
    # values or files behind them, which `fedauc preprocess` prints at the site.
    over_share = [reason for reason, _ in excess_reasons(quarantine, summary.input_rows, config.max_quarantine_share)]
    return {
        "site": summary.site,
        "site_dir": summary.site,
        "content_hash": summary.content_hash,
        "counts": summary.counts,
        "input_rows": summary.input_rows,
        "kept": summary.kept,
        "quarantined": summary.quarantined,
        "reused": summary.reused,
        "warnings": labels["warnings"],
        "budget_change": budget_change,
        "quarantine_over_share": over_share,
        **paths,
    }


@flow(name="preprocess_site", flow_run_name=run_names.of_flow(run_names.site_step("preprocess", "site")))
@failures_stay_at_the_site("preprocess")
def preprocess_site(site: str, shards: str | None = None, workers: int = 2, raise_budget: bool = False) -> dict:
    """Site ``site``'s shards (its name, or its YAML relative to the worker's folder) into ``shards``
    (relative to the worker's folder; default $FEDAUC_SHARDS, else shards/): both resolved here, at the site."""
    result = preprocess(site_yaml(site), site_shards(shards), workers, raise_budget)
    log_outcome(result)
    return result


def log_outcome(result: dict) -> None:
    """A site's preprocessing in the run's log, which reaches the centre's server: no counts (a small quarantine
    count could single a patient out), the reasons that took more than the site's share by name only."""
    logger = get_run_logger()
    logger.info("site %s: shards %s (content hash %s), QC report %s", result["site"],
                "reused, nothing changed" if result["reused"] else "written", result["content_hash"],
                result["report_md"])
    if result["quarantine_over_share"]:
        logger.warning("site %s lost rows: quarantine reason(s) %s over the site's max_quarantine_share; `fedauc "
                       "preprocess` at the site names the column, value or files behind them and the fix",
                       result["site"], ", ".join(result["quarantine_over_share"]))
