"""A registered version's model card (pipelines/model_card.py), from two real tiny trainings and an evaluation in a
real SQLite MLflow store: its numbers are the MLflow metrics they come from, it is linked from the version's
description, only the champion's card and training description say it is the champion, and `fedauc card` prints or
writes it."""

from __future__ import annotations

import re

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from federated import schema
from pipelines import evaluations, model_card, runs
from pipelines.cli import app
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow
SETTINGS = dict(algorithm="codasca", params={"T0": 4}, network="small_resnet_gn", network_kwargs={"widths": [4, 8]},
                rounds=1, local_steps=2, batch_size=16, eval_every=1, progress=False, loader_workers=0, device="cpu")


@pytest.fixture(scope="module")
def store(evaluable_melanoma, tmp_path_factory):
    """Two trainings (versions 1 and 2) and an evaluation of the champion, in the module's own store."""
    root, federation_yaml = evaluable_melanoma
    uri = f"sqlite:///{tmp_path_factory.mktemp('card') / 'mlruns.db'}"
    mlflow.set_tracking_uri(uri)
    federation = load_federation(federation_yaml)
    trainings = [runs.train_tracked(federation, root / "shards", {**SETTINGS, "lr": lr, "seed": seed},
                                    run_name=f"card-{seed}") for seed, lr in ((0, 0.5), (1, 2.0))]
    (evaluated,) = evaluations.evaluate_registered(federation, root / "shards")
    yield uri, federation, trainings, evaluated, root / "shards"
    mlflow.set_tracking_uri(None)


def _cells(markdown: str, heading: str) -> dict[str, list[str]]:
    """The table under ``heading``: first cell -> the others."""
    lines = markdown.split(heading + "\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i, line in enumerate(lines[start:]) if not line.startswith("|")), len(lines) - start)
    return {row.split(" | ")[0].strip("| "): [c.strip(" |") for c in row.split(" | ")[1:]]
            for row in lines[start + 2 : start + end]}


def test_the_cards_numbers_are_the_mlflow_metrics_they_come_from(store):
    uri, federation, _, evaluated, _ = store
    mlflow.set_tracking_uri(uri)
    version = evaluated["model_version"]
    markdown, page, png = model_card.render("melanoma", version)
    metrics = MlflowClient().get_run(evaluated["run_id"]).data.metrics

    def shown(base: str) -> str:
        return model_card.fmt((metrics[f"{base}/auc/Melanoma"], metrics[f"{base}/auc_ci95_low/Melanoma"],
                               metrics[f"{base}/auc_ci95_high/Melanoma"]))

    assert _cells(markdown, "## Performance")["pooled test"][0] == shown("test/pooled")
    sites = _cells(markdown, "### By site")
    assert set(sites) == {site.name for site in federation.sites}
    for site, cells in sites.items():
        assert cells[0] == shown(f"test/subgroup/site.{site}")
        assert cells[1] == (f"{int(metrics[f'test/subgroup/site.{site}/n_pos/Melanoma'])}/"
                            f"{int(metrics[f'test/subgroup/site.{site}/n_neg/Melanoma'])}")
    sexes = _cells(markdown, "### By sex")
    for sex, cells in sexes.items():
        key = f"test/subgroup/sex.{sex}/auc/Melanoma"
        assert cells[0] == (shown(f"test/subgroup/sex.{sex}") if key in metrics else "too small")
    gap = _cells(markdown, "### Gap between the best and the worst subgroup")["site"][0]
    assert gap.startswith(model_card.fmt((metrics["test/subgroup_gap/site/auc/Melanoma"],
                                          metrics["test/subgroup_gap/site/auc_ci95_low/Melanoma"],
                                          metrics["test/subgroup_gap/site/auc_ci95_high/Melanoma"])))
    assert "## Limitations" in markdown and "synthetic images" in markdown.lower()
    for site in federation.sites:  # its QC summary as the site sent it
        qc = mlflow.artifacts.load_dict(f"runs:/{evaluated_training(store)}/qc/{site.name}/summary.json")
        images = ", ".join(f"{split} {n}" for split, n in qc["kept_per_split"].items())
        assert f"- `{site.name}`: images {images}; Melanoma positives train " in markdown
    assert "### By view" not in markdown  # a skin photograph has no projection
    # Calibration and refusal as the registered contract states them, read as figures, not a dump of its fields.
    contract = model_card.gather("melanoma", version).contract
    fitted = contract.calibration.diseases.get("Melanoma")
    if fitted is not None:
        calibrated = _cells(markdown, "## Calibration and out-of-distribution policy")["Melanoma"]
        assert calibrated[0] == f"{fitted.slope:.3f}, {fitted.intercept:.3f}"
        assert calibrated[2].startswith(f"{fitted.test_before.value:.3f} [") and "-> " in calibrated[2]
    else:
        assert f"Melanoma: no calibration map ({contract.calibration.undefined['Melanoma']})" in markdown
    assert f"farther than {contract.ood.threshold:.2f} is refused" in markdown and "{'" not in markdown
    assert png.startswith(b"\x89PNG") and "data:image/png;base64," in page and "<table>" in page
    assert evaluated["run_id"] in markdown


def test_the_version_page_links_its_card_and_evaluation_and_only_the_champion_says_so(store):
    uri, _, trainings, evaluated, _ = store
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    champion = str(client.get_model_version_by_alias("fedauc-melanoma", schema.CHAMPION_ALIAS).version)
    assert model_card.FOREST_ARTIFACT in [a.path for a in client.list_artifacts(evaluated["run_id"])]
    for training in trainings:
        description = client.get_model_version("fedauc-melanoma", training.model_version).description
        link = re.search(r"\(#/experiments/(\d+)/runs/(\w+)/artifactPath/(model_card/v\d+\.html)\)", description)
        assert link and link.group(2) == training.run_id
        artifacts = [a.path for a in client.list_artifacts(training.run_id, "model_card")]
        assert link.group(3) in artifacts and f"model_card/v{training.model_version}.md" in artifacts
        run_description = client.get_run(training.run_id).data.tags[schema.DESCRIPTION_TAG]
        if training.model_version == champion:
            assert description.startswith("**The champion.**") and "version " + champion + ": the champion" in run_description
            assert f"/runs/{evaluated['run_id']})" in description
            card, _, _ = model_card.render("melanoma", champion)
            assert "**The champion.** " + model_card.descriptions.CHAMPION_RULE in card
            assert re.search(r"margin [+-]\d\.\d{3}", card)  # both versions were scored on these sites
        else:
            assert description.startswith(f"**Not the champion** (the champion is version {champion})")
            assert f"not the champion (version {champion} is)" in run_description


def test_fedauc_card_prints_it_or_writes_it(store, tmp_path, monkeypatch):
    uri, *_ = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    result = CliRunner().invoke(app, ["card", "melanoma"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# Model card: fedauc-melanoma version")
    out = tmp_path / "card.html"
    result = CliRunner().invoke(app, ["card", "melanoma", "--version", "1", "--out", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("<!DOCTYPE html>")
    result = CliRunner().invoke(app, ["card", "melanoma", "--version", "9"])
    assert result.exit_code == 1 and "has no version 9" in result.output and "Traceback" not in result.output


def test_prune_keeps_the_latest_evaluation_of_every_past_and_present_champion(store, monkeypatch):
    """Issue 55's case: the store's runs dated 200 days back, `fedauc prune --older-than-days 30` deleted the
    champions' evaluations, the only record of their per-site AUC. Now each version that is or was champion keeps
    its latest evaluation (its card still shows its sites); every other evaluation goes. Last in this module: it
    prunes the module's store."""
    import sqlite3

    from mlflow.entities import ViewType

    from pipelines import retention

    uri, federation, _, _, shards = store
    mlflow.set_tracking_uri(uri)
    for _ in range(2):  # two more evaluations of both versions: the older ones are detail
        evaluations.evaluate_registered(federation, shards, ["1", "2"])
    client = MlflowClient()
    versions = client.search_model_versions("name = 'fedauc-melanoma'")
    champions = {str(v.version) for v in versions if v.tags.get(schema.WAS_CHAMPION_TAG) == "true"}
    assert "1" in champions  # the first version took the alias at its registration
    experiment = [e.experiment_id for e in client.search_experiments()]
    query = f"tags.{schema.ROLE_TAG} = '{schema.EVALUATION_ROLE}'"
    before = client.search_runs(experiment, query, order_by=["attributes.start_time DESC"])
    latest = {}
    for run in before:
        latest.setdefault(run.data.tags[schema.MODEL_VERSION_TAG], run.info.run_id)
    with sqlite3.connect(uri.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE runs SET start_time = start_time - ?, end_time = end_time - ?", (200 * 86_400_000,) * 2)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    lines = retention.prune_centre(uri, older_than_days=30)
    assert f"the latest evaluation of each of its {len(champions)} champion(s)" in lines[0]
    after = {r.info.run_id for r in client.search_runs(experiment, query, run_view_type=ViewType.ACTIVE_ONLY)}
    assert after == {latest[v] for v in champions}
    assert len(before) > len(after)
    for version in champions:  # the card's evidence is still there
        card, _, _ = model_card.render("melanoma", version)
        assert latest[version] in card and "### By site" in card



def evaluated_training(store) -> str:
    """The training run of the version the module's evaluation scored."""
    *_, evaluated, _ = store
    mv = MlflowClient().get_model_version("fedauc-melanoma", evaluated["model_version"])
    return mv.run_id
