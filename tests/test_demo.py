"""The demo's design, checked without running it: what it trains and how many positives its tests hold."""

from __future__ import annotations

from federated.algorithms.fedavg import FedAvg
from federated.registry import get_algorithm
from pipelines.demo import CHEST, DEMO_TRAININGS, MELANOMA
from preprocessing.federation import load_federation
from preprocessing.scan import scan_site
from preprocessing.synth import generate_federation


def test_both_tasks_train_fedavg_beside_an_auc_method():
    assert len({(name, yaml) for name, yaml, *_ in DEMO_TRAININGS}) == len(DEMO_TRAININGS)  # one run name each
    for federation in (CHEST, MELANOMA):
        algorithms = [get_algorithm(algorithm) for _, yaml, algorithm, _, _ in DEMO_TRAININGS if yaml == federation]
        assert get_algorithm("fedavg") in algorithms, federation.name
        # FedAvg and its relatives (FedProx, local SGD with momentum) minimise cross-entropy; the rest an AUC loss.
        assert any(not issubclass(algorithm, FedAvg) for algorithm in algorithms), federation.name


def test_the_pooled_melanoma_test_holds_at_least_40_positives(tmp_path):
    # The labels and patients alone (no image): the splits are drawn by patient from these, as the demo's
    # preprocessing draws them.
    generated = generate_federation(MELANOMA, tmp_path, images=False, progress=False)
    positives = {"train": 0, "valid": 0, "test": 0}
    for site in load_federation(MELANOMA).sites:
        records = scan_site(site.model_copy(update={"root": generated[site.name].root})).records
        for split in positives:
            positives[split] += int(records.loc[records["split"] == split, "Melanoma"].sum())
    assert positives["test"] >= 40, positives
    assert positives["valid"] >= 10, positives  # the champion is picked on the pooled validation AUC
