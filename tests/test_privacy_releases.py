"""Everything per site that leaves a site under DP, enumerated from real DP trainings, against the allow-list of
docs/privacy.md section 5: a new field fails here until the doc lists it with its accounting, and a field the doc
says is withheld must arrive withheld (NaN or absent).

Enumerated: every tensor a site hands the transport (the engine's gathers and means, by the engine function that
sends them; the round's per-site row by column), the site report, and what a tracked DP training records in a
real SQLite MLflow store: each site's run (metrics, params, tags, artifacts) and, on the training's run, every
key or artifact that names a site; and a budgeted site's PACS scoring record for a day, recorded as `fedauc pacs`
records it. Not here: Prefect artifacts (a training records none per site)."""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

import pytest
import torch

from federated import SyntheticSite, TrainConfig
from federated.backends import InProcessTransport
from federated.engine import Engine
from preprocessing.sites import SharingPolicy

DOC = Path(__file__).resolve().parents[1] / "docs/privacy.md"
ROUND_ROW = ["index", "bytes_sent", "bytes_received", "loss_mean", "loss_first"]  # then norms, then timings
TIMINGS = ["compute_seconds", "wait_seconds", "compute_cpu_seconds", "process_cpu_seconds"]


def allow_list() -> dict[str, str]:
    """Section 5's table: field pattern (fnmatch) -> "withheld" or "released"."""
    section = DOC.read_text().split("\n## 5. ", 1)[1].split("\n## 6. ", 1)[0]
    rows = dict(re.findall(r"^\| `([^`]+)` \| (withheld|released) \|", section, re.M))
    assert len(rows) > 10, "docs/privacy.md section 5 lost its allow-list table"
    return rows


def unlisted(fields, listed: dict[str, str]) -> list[str]:
    return sorted(f for f in fields if not any(fnmatch.fnmatchcase(f, p) for p in listed))


def status(field: str, listed: dict[str, str]) -> str:
    return next(s for p, s in listed.items() if fnmatch.fnmatchcase(field, p))


class RecordingTransport(InProcessTransport):
    """The in-process transport, keeping what every site hands it, named by the engine function that sends it."""

    def __init__(self, num_sites: int):
        super().__init__(num_sites)
        self.sent: list[tuple[str, list[str], list]] = []  # (sender, names, per site: its tensors)

    def mean_(self, per_site, weights, robust=None, names=()):
        self.sent.append((sys._getframe(1).f_code.co_name, list(names), [[t.clone() for t in ts] for ts in per_site]))
        super().mean_(per_site, weights, robust, names=names)

    def gather(self, per_site):
        self.sent.append((sys._getframe(1).f_code.co_name + ".gather", [], [[t.clone()] for t in per_site]))
        return super().gather(per_site)


def engine_fields(transport: RecordingTransport, norm_groups: list[str]) -> dict[str, list[torch.Tensor]]:
    """field -> every value a site sent under it; an engine function not named here fails the test."""
    named = {"federation_context": ["label_counts.positives", "label_counts.known", "label_counts.records"],
             "__init__": ["has_evaluation_split"], "global_model": None, "evaluate": ["evaluation.histograms"],
             "evaluate.gather": ["evaluation.report"],
             }
    row = ROUND_ROW + [f"update_norm.{g}" for g in norm_groups] + TIMINGS
    fields: dict[str, list[torch.Tensor]] = {}
    for sender, names, per_site in transport.sent:
        for tensors in per_site:
            if sender == "_site_rows.gather":  # the round's per-site row, by column
                (t,) = tensors
                assert t.shape[-1] == len(row), f"the round's row has {t.shape[-1]} columns, {len(row)} are named here"
                pairs = [(name, t[..., i]) for i, name in enumerate(row)]
            elif sender in ("communicate", "stage_boundary", "communicate.gather"):
                prefix = "stage" if sender == "stage_boundary" else "declared"
                pairs = [(f"{prefix}.{n}", t) for n, t in zip(names or ["gathered"] * len(tensors), tensors)]
            elif names and all(n.startswith("ood.") for n in names):  # federated/ood_fit.py names what it sends
                pairs = list(zip(names, tensors))
            elif sender in named:
                pairs = [(n or sender, t) for n, t in zip(named[sender] or [sender] * len(tensors), tensors)]
            else:
                pytest.fail(f"the engine's {sender} sends per-site tensors this test does not name")
            for name, t in pairs:
                fields.setdefault(name, []).append(t)
    return fields


OOD_FIELDS = ("feature_sums", "component_sums", "sites_over_rate", "distance_histograms")


def test_without_dp_every_out_of_distribution_statistic_a_site_sends_is_in_the_table():
    """The refusal model's sums, its mixture's per-component sums, the flags and the distance histograms, as the
    engine sends them (federated/ood_fit.py) where no DP withholds them: each named in section 5's table."""
    listed = allow_list()
    sites = [SyntheticSite(n_train=300, n_valid=40, n_test=40, shape=(6,), num_classes=2, pos_rate=0.3, shift=2.0 * k)
             for k in range(2)]
    cfg = TrainConfig(algorithm="fedavg", sites=sites, network="linear", rounds=2, local_steps=2, batch_size=16,
                      lr=0.1, progress=False, loader_workers=0, eval_every=1)
    transport = RecordingTransport(2)
    engine = Engine(cfg, transport=transport)
    result = engine.run()
    fields = engine_fields(transport, list(engine.health.groups))
    assert {f"ood.{field}" for field in OOD_FIELDS} <= set(fields), sorted(f for f in fields if f.startswith("ood."))
    assert result.ood is not None and not unlisted(fields, listed), unlisted(fields, listed)


def test_every_tensor_a_dp_site_sends_is_listed_and_the_withheld_ones_are_nan():
    listed = allow_list()
    sites = [SyntheticSite(n_train=64, n_valid=24, n_test=24, shape=(6,), num_classes=2, pos_rate=0.3, shift=0.3 * k)
             for k in range(2)]
    cfg = TrainConfig(algorithm="codasca", params={"T0": 4}, sites=sites, network="linear", rounds=4, local_steps=2,
                      batch_size=16, lr=0.1, progress=False, loader_workers=0, eval_every=2,
                      dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0, "eval_noise_multiplier": 2.0})
    transport = RecordingTransport(2)
    engine = Engine(cfg, transport=transport)
    engine.run()
    fields = engine_fields(transport, list(engine.health.groups))
    assert {"evaluation.histograms", "compute_seconds", "stage.mean.a"} <= set(fields)
    assert any(name.startswith("declared.model.") for name in fields)
    assert not any(name.startswith("ood.") for name in fields), "the OOD statistics are withheld under DP: not computed"
    assert {status(f"ood.{field}", listed) for field in OOD_FIELDS} == {"withheld"}
    assert not unlisted(fields, listed), f"not in docs/privacy.md section 5: {unlisted(fields, listed)}"
    for name, values in fields.items():
        if status(name, listed) == "withheld":
            assert all(torch.isnan(v).all() for v in values), f"{name} leaves a DP site unwithheld"


def mlflow_fields(client, run_id: str, names: list[str]) -> set[str]:
    """The training's MLflow records about single sites: each site run's metrics, params, tags and artifacts, and
    the keys and artifacts of the training's run that name a site (the site's name written as <site>)."""
    def artifacts(rid, path=None):
        for item in client.list_artifacts(rid, path):
            yield from artifacts(rid, item.path) if item.is_dir else [item.path]

    def generic(text):
        for name in names:
            text = text.replace(name, "<site>")
        return text

    parent = client.get_run(run_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    assert len(children) == len(names)
    fields = set()
    for run, where in [(c, "site_run") for c in children] + [(parent, "training_run")]:
        records = {"metric": run.data.metrics, "param": run.data.params, "tag": run.data.tags,
                   "artifact": dict.fromkeys(artifacts(run.info.run_id))}
        for kind, keys in records.items():
            for key in keys:
                if where == "site_run" or generic(key) != key:
                    fields.add(f"mlflow.{where}.{kind}:{generic(key)}")
    return fields


@pytest.mark.slow
def test_a_tracked_dp_training_records_only_listed_fields_per_site(tmp_path, budgets, monkeypatch):
    """A real DP training recorded in a real SQLite store, at budgeted sites, one of them consenting to share its QC
    grid in a config built in code (its YAML would be refused): the grid stays home, no timing or loss is logged."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from federated import launch
    from pipelines import runs
    from preprocessing.federation import Federation

    mlflow.set_tracking_uri(None)  # first: where an earlier test set one, this unsets MLFLOW_TRACKING_URI too
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    federation, shards, _ = budgets([50.0, 50.0, 50.0])
    consenting = federation.sites[0].model_copy(update={"sharing": SharingPolicy(qc_grid=True)})
    federation = Federation(federation.path, federation.spec, [consenting, *federation.sites[1:]])
    reports = []

    def recorded_report(*args, **kwargs):
        reports.append(site_report(*args, **kwargs))
        return reports[-1]

    site_report = launch.site_report
    monkeypatch.setattr(launch, "site_report", recorded_report)
    settings = dict(algorithm="codasca", params={"T0": 4}, network="small_resnet_gn", network_kwargs={"widths": [4, 8]},
                    rounds=2, local_steps=2, batch_size=16, lr=0.5, eval_every=1, progress=False, loader_workers=0,
                    device="cpu", dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0, "eval_noise_multiplier": 2.0})
    run = runs.train_tracked(federation, shards, settings, run_name="dp-releases")
    listed = allow_list()
    names = [site.name for site in federation.sites]
    assert len(reports) == len(names) and all(r["qc_grid"] is None for r in reports)
    report_fields = {f"site_report.{k}" for r in reports for k in r} | {f"site_report.qc.{k}" for r in reports
                                                                         for k in r["qc"]}
    fields = report_fields | mlflow_fields(MlflowClient(), run.run_id, names)
    assert "mlflow.site_run.metric:privacy/epsilon_spent" in fields
    parent = MlflowClient().get_run(run.run_id).data.metrics  # the round's seconds name no site, but are withheld
    assert "round_seconds" not in parent and "slowest_site_held_up_seconds" not in parent
    assert not unlisted(fields, listed), f"not in docs/privacy.md section 5: {unlisted(fields, listed)}"
    withheld = [f for f in fields if status(f, listed) == "withheld" and not f.startswith("site_report.qc_grid")]
    assert not withheld, f"recorded although section 5 says withheld: {withheld}"


def test_a_budgeted_sites_day_of_pacs_scoring_records_only_listed_fields(tmp_path, monkeypatch):
    """The day a budgeted hospital's PACS job sends (pipelines/hospital/job.py: ``drift.release`` with its histograms
    withheld, then ``drift.record``), recorded in a real SQLite store and enumerated like a training's records."""
    import json

    import mlflow
    import numpy as np
    from mlflow.tracking import MlflowClient

    from federated.schema import SCORING_ROLE
    from pipelines.hospital import drift

    mlflow.set_tracking_uri(None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    rng = np.random.default_rng(0)
    rows = [{"status": "scored", "p_A": float(p)} for p in rng.random(40)]
    rows += [{"status": "refused", "reason": "wrong_body_part"}] * 12 + [{"status": "refused", "reason": "excluded_view"}]
    tally = drift.tally(rows, rng.random((200, 1)), ["A"])
    assert tally["edges"] and sum(tally["histograms"]["A"]) == 40  # what a site without a budget could send
    day = drift.release(tally, SharingPolicy(min_count=10), withhold_histograms=True)
    drift.record("chest-xray", "vienna", "fedauc-chest-xray", "3", day, day="2026-03-02")
    client = MlflowClient()
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                f"tags.fedauc_role = '{SCORING_ROLE}'")
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    stored = json.loads(Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=
                                                                 "scoring_aggregates.json", dst_path=str(tmp_path))).read_text())
    fields = ({f"pacs.tag:{k}" for k in run.data.tags} | {f"pacs.metric:{k}" for k in run.data.metrics}
              | {f"pacs.artifact:{a}" for a in artifacts} | {f"pacs.json:{k}" for k in stored}
              | {f"pacs.json:refused.{k}" for k in stored["refused"]})
    listed = allow_list()
    assert {"pacs.metric:scored", "pacs.json:edges"} <= fields
    assert not unlisted(fields, listed), f"not in docs/privacy.md section 5: {unlisted(fields, listed)}"
    for field in fields:
        if status(field, listed) == "withheld":
            assert field.startswith("pacs.json:") and stored[field.removeprefix("pacs.json:")] == {}, field
    # One image: under min_count, "<10" in what left and no metric (common.small_counts).
    assert stored["refused"]["excluded_view"] == "<10" and "refused/excluded_view" not in run.data.metrics
