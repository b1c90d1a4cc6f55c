"""Subgroup performance from score histograms (federated/subgroups.py): what an evaluation job's sites send per
subgroup cell, and what the centre pools from it, against scikit-learn on the pooled per-image scores."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from test_privacy_releases import allow_list, status, unlisted

from common.small_counts import ON_WIRE
from federated.data import load_shard
from federated.evaluation import combine_sites
from federated.launch import InProcess
from federated.network import build_named
from federated.predict import predict_scores
from federated.scoring import ModelToScore
from federated.subgroups import CELL, split_groups
from preprocessing.federation import load_federation

SHAPE = (3, 32, 32)
BINS = 1000


def _scored(root, federation_yaml, min_count):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    federation = load_federation(federation_yaml)
    spec = ModelToScore(label="1", network="linear", input_shape=SHAPE, num_classes=1)
    state = build_named("linear", {}, SHAPE, 1).state_dict()
    per_site, _, _ = InProcess().score([spec], [state], federation, root / "shards", BINS, min_count)
    names = [site.name for site in federation.sites]
    model = spec.build(state)
    truth = {}  # site -> (labels, scores, groups) of its test split, recomputed here from its shards
    for name in names:
        part = load_shard(root / "shards" / name).splits["test"]
        scores = predict_scores(model, part.images, torch.device("cpu"))
        truth[name] = part.labels[:, 0], scores[:, 0], split_groups(root / "shards" / name, "test", min_count)
    return per_site, names, truth


def test_subgroup_auc_equals_scikit_learns_on_the_pooled_scores_within_the_binning_bound(evaluable_melanoma):
    root, federation_yaml = evaluable_melanoma
    per_site, names, truth = _scored(root, federation_yaml, min_count=1)
    metrics = combine_sites([s[0] for s in per_site], names, ["Melanoma"], 1).metrics
    checked = 0
    for group in ("sex.F", "sex.M", "age.40-59", "age.60-79"):
        labels = np.concatenate([truth[n][0][truth[n][2][group]] for n in names])
        scores = np.concatenate([truth[n][1][truth[n][2][group]] for n in names])
        present = ~np.isnan(labels)
        if len(set(labels[present])) < 2:
            continue
        exact = roc_auc_score(labels[present], scores[present])
        key = f"test/subgroup/{group}/auc/Melanoma"
        assert abs(metrics[key] - exact) <= metrics[f"test/subgroup/{group}/auc_bound/Melanoma"] + 1e-12, group
        assert metrics[f"test/subgroup/{group}/n_pos/Melanoma"] == (labels[present] == 1).sum()
        low, high = metrics[f"test/subgroup/{group}/auc_ci95_low/Melanoma"], metrics[f"test/subgroup/{group}/auc_ci95_high/Melanoma"]
        assert low < metrics[key] < high
        checked += 1
    assert checked >= 3
    for name in names:  # the site subgroup: the site's own split
        labels, scores, _ = truth[name]
        present = ~np.isnan(labels)
        exact = roc_auc_score(labels[present], scores[present])
        assert abs(metrics[f"test/subgroup/site.{name}/auc/Melanoma"] - exact) <= (
            metrics[f"test/subgroup/site.{name}/auc_bound/Melanoma"] + 1e-12)
    gap = metrics["test/subgroup_gap/sex/auc/Melanoma"]
    assert gap == pytest.approx(abs(metrics["test/subgroup/sex.F/auc/Melanoma"] - metrics["test/subgroup/sex.M/auc/Melanoma"]))
    assert metrics["test/subgroup_gap/sex/auc_ci95_low/Melanoma"] < gap < metrics["test/subgroup_gap/sex/auc_ci95_high/Melanoma"]


def test_a_cell_below_the_threshold_never_leaves_its_site(evaluable_melanoma):
    """At the default threshold some sex and age cells of these 60-image test splits are small: what leaves for
    them is the flag and "<10" counts, histograms all zero; the pooled subgroup sums only the released cells."""
    root, federation_yaml = evaluable_melanoma
    per_site, names, truth = _scored(root, federation_yaml, min_count=10)
    small = released = 0
    for name, (summary,) in zip(names, per_site):
        labels, _, groups = truth[name]
        for group, mask in groups.items():
            report, histograms = summary[f"test{CELL}{group}"]
            n_pos, n_neg = int((labels[mask] == 1).sum()), int((labels[mask] == 0).sum())
            if min(n_pos, n_neg) < 10:
                small += 1
                assert report[0, 2] == 1.0 and not histograms.any(), (name, group)
                assert {report[0, 0], report[0, 1]} & {ON_WIRE}
            else:
                released += 1
                assert report[0, :2].tolist() == [n_pos, n_neg] and histograms.sum() == n_pos + n_neg
            assert np.isnan(report[0, 3:]).all()  # no per-cell metric leaves
    assert small and released
    pooled = combine_sites([s[0] for s in per_site], names, ["Melanoma"], 10)
    for group in ("sex.F", "sex.M"):
        expected = sum(int((truth[n][0][truth[n][2][group]] == 1).sum()) for n in names
                       if min(int((truth[n][0][truth[n][2][group]] == v).sum()) for v in (0, 1)) >= 10)
        key = f"test/subgroup/{group}/n_pos/Melanoma"
        assert pooled.metrics.get(key, 0.0) == expected
    assert any("too small to report" in why or "left out" in why for why in pooled.suppressed.values())


def test_a_noised_evaluation_withholds_the_cells(evaluable_melanoma):
    root, federation_yaml = evaluable_melanoma
    federation = load_federation(federation_yaml)
    spec = ModelToScore(label="1", network="linear", input_shape=SHAPE, num_classes=1)
    per_site, _, _ = InProcess().score([spec], [build_named("linear", {}, SHAPE, 1).state_dict()], federation,
                                       root / "shards", 32, 10, eval_noise_multiplier=5.0)
    assert all(set(summary) == {"valid", "test"} for (summary,) in per_site)
    # The allow-list (docs/privacy.md section 5) says so for every cell an exact job sends.
    exact, _, _ = InProcess().score([spec], [build_named("linear", {}, SHAPE, 1).state_dict()], federation,
                                    root / "shards", 32, 10)
    cells = {f"evaluation.cell.{key.split(CELL)[1]}" for (summary,) in exact for key in summary if CELL in key}
    listed = allow_list()
    assert cells and not unlisted(cells, listed) and {status(c, listed) for c in cells} == {"withheld"}


def test_only_a_known_vendor_leaves_the_site_never_the_tags_free_text():
    from federated.subgroups import OTHER, vendor

    assert [vendor(m) for m in ("SIEMENS", "GE MEDICAL SYSTEMS", "GE Healthcare", "FUJIFILM Corporation",
                                "Philips Medical Systems", "KONICA MINOLTA")] == [
        "Siemens", "GE", "GE", "Fujifilm", "Philips", "Konica Minolta"]
    assert {vendor(m) for m in ("St Mary's Radiology Room 3", "Dr. Garcia's CR", "GENERIC", "")} == {OTHER}
