"""The champion compared on equal terms (pipelines/champion.py), with real trainings in a real MLflow store.

A model trained on three clinics is champion; a fourth clinic joins and a model is trained on the four. Before
the alias may move, the three-site champion is re-evaluated on the four sites' validation splits (an
evaluation run of purpose champion-check, on the new federation's fingerprint), both scores are recorded, and
the alias goes to the better of the two on that one evaluation, never by comparing the three-site model's own
number with the four-site model's. A third training on the same four sites needs no re-evaluation.
"""

from __future__ import annotations

import math

import mlflow
import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from federated import schema
from pipelines import registry
from pipelines.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()
MODEL = "fedauc-melanoma"


@pytest.fixture(scope="module")
def four_sites(evaluable_melanoma, tmp_path_factory):
    """The three clinics plus 'graz' (its own shards), as a federation YAML beside the three-site one."""
    from preprocessing.scan import scan_site
    from preprocessing.shards import shard_site
    from preprocessing.sites import load_site
    from preprocessing.synth import generate_site

    root, _ = evaluable_melanoma
    here = tmp_path_factory.mktemp("four")
    shards = here / "shards"
    shards.mkdir()
    for name in ("vienna", "barcelona", "new-york"):
        (shards / name).symlink_to(root / "shards" / name)
    generate_site("siim-isic-2020", here / "data" / "graz", n=240, seed=5, profile="vienna", image_format="jpeg",
                  workers=0, progress=False, prevalence=0.3)
    site = {"name": "graz", "format": "siim-isic-2020", "root": str(here / "data" / "graz"), "task": "melanoma",
            "image_size": 32, "min_image_size": 16, "split": {"seed": 0, "valid": 0.2, "test": 0.25},
            "options": {"image_format": "jpeg"}}
    (here / "graz.yaml").write_text(yaml.safe_dump(site))
    config = load_site(here / "graz.yaml")
    shard_site(config, scan_site(config), shards, workers=0, progress=False)
    entries = [{"config": str(root / f"{name}.yaml")} for name in ("vienna", "barcelona", "new-york")]
    federation = here / "melanoma4.yaml"
    federation.write_text(yaml.safe_dump({"name": "tiny-melanoma-4", "task": "melanoma",
                                          "sites": [*entries, {"config": "graz.yaml"}]}))
    return federation, shards


def _train(federation, shards, run_name: str, lr: float) -> dict:
    result = runner.invoke(app, ["train", "--federation", str(federation), "--shards", str(shards),
                                 "--algorithm", "codasca", "-p", "T0=4", "--rounds", "1", "--local-steps", "2",
                                 "--batch-size", "16", "--lr", str(lr), "--eval-every", "1", "--run-name", run_name,
                                 "--checkpoint-dir", str(shards.parent / "ckpt" / run_name)])
    assert result.exit_code == 0, result.output
    client = MlflowClient()
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                f"tags.fedauc_role = 'federated-training' and attributes.run_name = '{run_name}'")
    return run


def _checks(client: MlflowClient) -> list:
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.fedauc_role = 'evaluation' and tags.purpose = 'champion-check'")


def _champion(client: MlflowClient) -> str:
    return str(client.get_model_version_by_alias(MODEL, schema.CHAMPION_ALIAS).version)


def test_a_three_site_champion_is_re_evaluated_on_four_sites_before_the_comparison(evaluable_melanoma, four_sites,
                                                                                   tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    root, three = evaluable_melanoma
    four, four_shards = four_sites
    try:
        first = _train(three, root / "shards", "three-sites", lr=0.5)
        client = MlflowClient()
        assert _champion(client) == "1" and _checks(client) == []
        second = _train(four, four_shards, "four-sites", lr=0.05)
        e3, e4 = (client.get_model_version(MODEL, v).tags[schema.SELECTION_EVALUATION_TAG] for v in ("1", "2"))
        assert e3 != e4  # a site joined: another evaluation

        # The champion was scored on the four sites' validation splits, at the centre's request, and recorded.
        (check,) = _checks(client)
        assert check.data.tags["model_version"] == "1" and check.data.params["evaluation"] == e4
        assert check.data.params["sites"] == "vienna,barcelona,new-york,graz"
        assert check.data.params["shard_hash.graz"] == second.data.params["shard_hash.graz"]
        on_four = {"1": check.data.metrics["valid/pooled/auc_macro"],
                   "2": second.data.metrics["valid/pooled/auc_macro"]}
        assert second.data.tags["champion_check.version"] == "1"
        assert second.data.metrics["champion_check/valid/pooled/auc_macro"] == on_four["1"]
        for version, score in on_four.items():
            assert float(client.get_model_version(MODEL, version).tags[schema.SCORE_TAG_PREFIX + e4]) == score
        assert not math.isnan(on_four["1"]) and not math.isnan(on_four["2"]) and on_four["1"] != on_four["2"]
        better = "2" if on_four["2"] > on_four["1"] else "1"
        assert _champion(client) == better

        # The three-site model's own number plays no part: set it so that comparing the federations' own numbers
        # (the old rule, still what promote_best does without an evaluation) would choose the other model.
        other = "1" if better == "2" else "2"
        own_three = 1.0 if other == "1" else 0.0
        client.set_model_version_tag(MODEL, "1", schema.SELECTION_METRIC_TAG, repr(own_three))
        client.set_registered_model_alias(MODEL, schema.CHAMPION_ALIAS, "1")
        registry.promote_best(client, MODEL, "2", e4)
        assert _champion(client) == better
        client.set_registered_model_alias(MODEL, schema.CHAMPION_ALIAS, "1")
        registry.promote_best(client, MODEL, "2")
        assert _champion(client) == other
        client.set_registered_model_alias(MODEL, schema.CHAMPION_ALIAS, better)

        # The same four sites again: the champion already has a score there, nothing is re-evaluated.
        third = _train(four, four_shards, "four-sites-again", lr=0.05)
        assert len(_checks(client)) == 1 and "champion_check.version" not in third.data.tags
        assert first.data.params["backend"] == "inprocess"
    finally:
        mlflow.set_tracking_uri(None)
