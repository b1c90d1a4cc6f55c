"""A site's budget fails closed and changes only as events (docs/privacy.md section 2): the budget travels with the
shards, a site that declares one and lost its ledger refuses every job, the same records preprocessed elsewhere
carry their spend, and an edit of the site YAML can lower the budget (at once) but not raise it."""

from __future__ import annotations

import json

import pytest
import yaml

import federated
from federated.dp.evaluation import admit_evaluation
from federated.privacy.budget import declared_budget, set_budget
from federated.privacy.ledger import Ledger, ledger_path
from federated.privacy.policy import PrivacyRefused, SiteBudget

BUDGET = {"epsilon": 40.0, "delta": 1e-5}
DP = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}


@pytest.fixture(scope="module")
def site_yaml(tmp_path_factory):
    """A small clinic (real DICOMs, its site YAML declaring a budget): the YAML's path."""
    from preprocessing.synth import generate_site

    root = tmp_path_factory.mktemp("clinic")
    generate_site("siim-isic-2020", root / "data", n=80, seed=3, profile="vienna", image_format="dicom", workers=0,
                  progress=False, prevalence=0.3)
    site = {"name": "vienna", "format": "siim-isic-2020", "root": "data", "task": "melanoma", "image_size": 32,
            "min_image_size": 16, "split": {"seed": 0, "valid": 0.2, "test": 0.2},
            "options": {"image_format": "dicom"}, "privacy": BUDGET}
    path = root / "vienna.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def _preprocess(site_yaml, out, raise_budget=False):
    """What ``fedauc preprocess`` does at the site (pipelines/preprocess_flow.py): the shards, then the budget."""
    from preprocessing.scan import scan_site
    from preprocessing.shards import shard_site
    from preprocessing.sites import load_site

    config = load_site(site_yaml)
    before = declared_budget(out / config.name)
    summary = shard_site(config, scan_site(config), out, workers=0, progress=False)
    return summary.site_dir, set_budget(config.name, summary.site_dir, config.privacy, raise_budget, site_yaml,
                                        before)[1]


def _train(shard_dir, dp=DP):
    return federated.train({"algorithm": "fedavg", "sites": [{"kind": "shard", "path": str(shard_dir)}],
                            "network": "linear", "rounds": 1, "local_steps": 2, "batch_size": 8, "lr": 0.1,
                            "progress": False, "loader_workers": 0, "eval_every": 0, "dp": dp})


def test_the_budget_travels_with_the_shards_and_a_lost_ledger_refuses_every_job(site_yaml, tmp_path):
    shard_dir, line = _preprocess(site_yaml, tmp_path / "shards")
    assert declared_budget(shard_dir) == SiteBudget(**BUDGET)
    assert json.loads((shard_dir / "shard.json").read_text())["privacy"] == {**BUDGET, "accountant": "rdp"}
    assert line == "site 'vienna': privacy budget none -> (epsilon 40, delta 1e-05) (fedauc preprocess; epsilon " \
                   "spent then 0)"
    ledger_path(shard_dir).unlink()
    for dp in (None, DP):
        with pytest.raises(PrivacyRefused) as err:
            _train(shard_dir, dp)
        assert str(err.value) == ("site 'vienna' refuses every job: its shards declare a privacy budget (epsilon 40, "
                                  "delta 1e-05) and its privacy ledger is missing; restore it from the site's backup "
                                  "(a ledger is never recreated empty)")
    with pytest.raises(PrivacyRefused, match=r"^site 'vienna' refuses every job"):
        admit_evaluation("vienna", shard_dir, ["v1"], 2.0)
    with pytest.raises(PrivacyRefused, match=r"and its privacy ledger is missing; restore it from the site's backup "
                                             "before preprocessing again"):
        _preprocess(site_yaml, tmp_path / "shards")  # preprocessing again starts no fresh ledger at 0
    assert not ledger_path(shard_dir).exists()
    ledger_path(shard_dir).write_text("{not json")
    ledger_path(shard_dir).chmod(0o600)
    with pytest.raises(PrivacyRefused, match="the privacy ledger is unreadable") as err:
        _train(shard_dir)
    assert "\n" not in str(err.value)


def test_the_same_records_preprocessed_elsewhere_carry_their_spend(site_yaml, tmp_path):
    first, _ = _preprocess(site_yaml, tmp_path / "here")
    spent = _train(first).privacy["vienna"]["epsilon_spent"]
    second, line = _preprocess(site_yaml, tmp_path / "elsewhere")
    assert line is None  # the same budget: no event
    again = _train(second).privacy["vienna"]
    assert again["epsilon_spent"] > spent  # composed with the first training, not a fresh ledger at 0
    assert len(Ledger.load(ledger_path(second)).entries) == 2


def test_a_budget_is_lowered_by_an_edit_and_raised_only_by_the_hospitals_flag(site_yaml, tmp_path, capfd):
    shard_dir, _ = _preprocess(site_yaml, tmp_path / "shards")
    spent = _train(shard_dir).privacy["vienna"]["epsilon_spent"]
    original = site_yaml.read_text()
    try:
        # Lowered in the YAML, not preprocessed again: the next job is held to it.
        site_yaml.write_text(yaml.safe_dump({**yaml.safe_load(original), "privacy": {**BUDGET, "epsilon": spent}}))
        with pytest.raises(PrivacyRefused, match=rf"over the site's budget of {spent:g} "):
            _train(shard_dir)
        assert "the stricter, (epsilon " in capfd.readouterr().err
        _, line = _preprocess(site_yaml, tmp_path / "shards")
        assert line.startswith("site 'vienna': privacy budget (epsilon 40, delta 1e-05) -> (epsilon ")
        # Raised in the YAML: the ledger keeps the lower one until the hospital runs the flag.
        site_yaml.write_text(yaml.safe_dump({**yaml.safe_load(original), "privacy": {**BUDGET, "epsilon": 90.0}}))
        _, line = _preprocess(site_yaml, tmp_path / "shards")
        assert "is looser than its ledger's" in line and "fedauc preprocess --raise-budget" in line
        with pytest.raises(PrivacyRefused, match=rf"over the site's budget of {spent:g} "):
            _train(shard_dir)
        _, line = _preprocess(site_yaml, tmp_path / "shards", raise_budget=True)
        assert line.endswith("-> (epsilon 90, delta 1e-05) (raised by fedauc preprocess --raise-budget; epsilon spent "
                             f"then {spent:.3g})")
        _train(shard_dir)
        # Removing the budget is raising it: without the flag the ledger keeps it.
        site_yaml.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(original).items() if k != "privacy"}))
        _, line = _preprocess(site_yaml, tmp_path / "shards")
        assert "looser than its ledger's" in line
        with pytest.raises(PrivacyRefused, match="and the job trains without DP"):
            _train(shard_dir, None)
    finally:
        site_yaml.write_text(original)
    events = Ledger.load(ledger_path(shard_dir)).events
    assert [(e.previous and e.previous["epsilon"], e.budget and e.budget["epsilon"]) for e in events] == \
        [(None, 40.0), (40.0, pytest.approx(spent)), (pytest.approx(spent), 90.0)]
    assert all(e.when > 0 for e in events) and events[2].spent == pytest.approx(spent)


def test_the_last_budget_change_reaches_mlflow_and_consortium_status(site_yaml, tmp_path):
    from mlflow.tracking import MlflowClient

    from federated.flare.centre.operate import SiteStatus
    from pipelines.runs import log_privacy

    shard_dir, line = _preprocess(site_yaml, tmp_path / "shards")
    reported = _train(shard_dir).privacy["vienna"]
    assert reported["budget_epsilon"] == 40.0
    assert reported["budget_change"].endswith(f" UTC: {line}")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.create_run(client.create_experiment("budget"))
    log_privacy(client, ["vienna"], [run.info.run_id], {"vienna": reported})
    data = client.get_run(run.info.run_id).data
    assert data.tags["privacy.budget_change"] == reported["budget_change"]
    assert data.metrics["privacy/budget_epsilon"] == 40.0
    status = SiteStatus("vienna", None, 0.0, epsilon_spent=reported["epsilon_spent"],
                        epsilon_remaining=reported["epsilon_remaining"], budget_change=reported["budget_change"])
    assert status.budget().endswith(f"left; last change: {reported['budget_change']}")
