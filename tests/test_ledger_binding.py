"""Which data a site's privacy ledger guards (docs/privacy.md section 2; issue 53 item 9): a ledger is bound to its
site's data root and label table, so another federation's site of the same name is not held to it, moved data is
refused until the operator says so (and keeps its spend), and a missing or altered binding refuses.

Through the commands (`fedauc preprocess`, a real Prefect run; `fedauc sites ledger`) and real trainings."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

import federated
from federated.privacy.binding import binding_path
from federated.privacy.ledger import Ledger, ledger_path
from federated.privacy.policy import PrivacyRefused

BUDGET = {"epsilon": 40.0, "delta": 1e-5}
DP = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}
runner = CliRunner()


@pytest.fixture(scope="module")
def clinics(tmp_path_factory):
    """Two unrelated datasets (real DICOMs), each to be declared as a site named ``north``: their data folders."""
    from preprocessing.synth import generate_site

    root = tmp_path_factory.mktemp("clinics")
    for seed, name in ((3, "first"), (4, "second")):
        generate_site("siim-isic-2020", root / name, n=60, seed=seed, profile="vienna", image_format="dicom",
                      workers=0, progress=False, prevalence=0.3)
    return root


def _site(folder, data, budget=None):
    """A federation's folder with its site ``north`` on ``data``: the YAML's path."""
    folder.mkdir(parents=True, exist_ok=True)
    site = {"name": "north", "format": "siim-isic-2020", "root": str(data), "task": "melanoma", "image_size": 32,
            "min_image_size": 16, "split": {"seed": 0, "valid": 0.2, "test": 0.2},
            "options": {"image_format": "dicom"}}
    path = folder / "north.yaml"
    path.write_text(yaml.safe_dump({**site, **({"privacy": budget} if budget else {})}))
    return path


def _fedauc(*args):
    from pipelines.cli import app

    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def _preprocess(site_yaml):
    return _fedauc("preprocess", site_yaml, "--out", site_yaml.parent / "shards", "--workers", "0")


def _train(shard_dir, dp=None):
    return federated.train({"algorithm": "fedavg", "sites": [{"kind": "shard", "path": str(shard_dir)}],
                            "network": "linear", "rounds": 1, "local_steps": 2, "batch_size": 8, "lr": 0.1,
                            "progress": False, "loader_workers": 0, "eval_every": 0, "dp": dp})


def test_another_federations_site_of_the_same_name_is_told_apart_by_its_binding(clinics, tmp_path):
    first = _site(tmp_path / "federation-a", clinics / "first", BUDGET)
    code, out = _preprocess(first)
    assert code == 0, out
    ledger = ledger_path(first.parent / "shards" / "north")
    assert f"site 'north': privacy ledger {ledger} (binding " in out
    assert ledger.exists() and binding_path(ledger).exists()
    assert {oct(p.stat().st_mode & 0o777) for p in (ledger, binding_path(ledger))} == {"0o600"}

    # The case: an unrelated federation's `north`, another folder, no budget.
    second = _site(tmp_path / "federation-b", clinics / "second")
    code, out = _preprocess(second)
    assert code == 1 and not (second.parent / "shards" / "north").exists()
    refusal = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(refusal) == 1 and str(tmp_path) not in refusal[0]  # no path of the hospital's: it reaches Prefect
    assert len(refusal) == 1 and f"is not what its privacy ledger {ledger.name} guards" in refusal[0]
    assert f"fedauc sites ledger {second.name} --moved" in refusal[0] and "--new-dataset" in refusal[0]
    assert _fedauc("sites", "ledger", second)[0] == 1

    code, out = _fedauc("sites", "ledger", second, "--new-dataset")
    assert code == 0 and "a new privacy ledger" in out, out
    code, out = _preprocess(second)
    assert code == 0, out
    other = ledger_path(second.parent / "shards" / "north")
    assert other != ledger and f"site 'north': privacy ledger {other} (binding " in out
    assert _train(second.parent / "shards" / "north").privacy == {}  # trained without DP: no budget of its own
    # The first `north` is still held to its own budget, by its own ledger, kept as it was.
    with pytest.raises(PrivacyRefused, match=r"has a privacy budget .* and the job trains without DP"):
        _train(first.parent / "shards" / "north")
    assert Ledger.load(ledger).budget.epsilon == BUDGET["epsilon"]


def test_moved_data_is_refused_until_the_operator_says_so_and_keeps_its_spend(clinics, tmp_path):
    data = tmp_path / "disk1" / "data"
    shutil.copytree(clinics / "first", data)
    site = _site(tmp_path / "federation", data, BUDGET)
    assert _preprocess(site)[0] == 0
    shards = site.parent / "shards" / "north"
    spent = _train(shards, DP).privacy["north"]["epsilon_spent"]
    old = ledger_path(shards)

    moved = tmp_path / "disk2" / "data"
    shutil.move(data, moved)
    _site(tmp_path / "federation", moved, BUDGET)
    code, out = _preprocess(site)
    assert code == 1 and "is not what its privacy ledger" in out and ledger_path(shards) == old

    code, out = _fedauc("sites", "ledger", site, "--moved")
    assert code == 0 and "(its budget and spend kept)" in out, out
    assert not old.exists()
    with pytest.raises(PrivacyRefused, match="is not what its privacy ledger"):  # shards still bound to the old place
        _train(shards, DP)
    code, out = _preprocess(site)
    assert code == 0 and "shards unchanged, nothing to do" in out, out  # the same files: re-bound, not decoded
    assert ledger_path(shards) != old and len(Ledger.load(ledger_path(shards)).entries) == 1
    again = _train(shards, DP).privacy["north"]
    assert again["epsilon_spent"] > spent  # composed with the spend before the move, not a fresh ledger at 0
    history = json.loads(binding_path(ledger_path(shards)).read_text())["history"]
    assert [h["how"] for h in history] == ["moved"] and history[0]["id"] in old.name


@pytest.mark.parametrize("damage", ["missing", "altered", "corrupt"])
def test_a_ledger_whose_binding_is_missing_or_altered_refuses_every_job(clinics, tmp_path, damage):
    site = _site(tmp_path / "federation", clinics / "first", BUDGET)
    assert _preprocess(site)[0] == 0
    shards = site.parent / "shards" / "north"
    ledger = ledger_path(shards)
    _train(shards, DP)
    binding = binding_path(ledger)
    if damage == "missing":
        binding.unlink()
    elif damage == "altered":
        body = json.loads(binding.read_text())
        binding.write_text(json.dumps({**body, "labels_sha256": "0" * 64}))
    else:
        binding.write_text("{not json")
    for job in (lambda: _train(shards, DP), lambda: _train(shards)):
        with pytest.raises(PrivacyRefused, match=r"^site 'north' refuses every job: its privacy ledger .* has no "
                                                 r"readable record of the data it guards") as err:
            job()
        assert "\n" not in str(err.value)
    code, out = _preprocess(site)
    assert code == 1 and "has no readable record of the data it guards" in out
    assert len(Ledger.load(ledger).entries) == 1  # refused before anything was charged
