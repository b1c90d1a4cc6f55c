"""Metrics (docs/algorithms.md section 2) against scikit-learn and against ROC areas computed by hand."""

import json
import math
import pickle

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from models.metrics import (
    MetricResult,
    bootstrap_ci,
    evaluate_multilabel,
    metric_names,
    metric_reasons,
    partial_roc_auc,
    per_site_and_pooled,
    roc_auc,
    two_way_partial_auc,
)


def random_case(seed, n=200, ties=False):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.25).astype(float)
    y[:2] = [0, 1]
    s = rng.normal(size=n) + 1.2 * y
    if ties:
        s = np.round(s, 1)  # many tied scores, across classes too
    return y, s


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
def test_auc_and_mcclish_pauc_equal_scikit_learn(seed, ties):
    y, s = random_case(seed, ties=ties)
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    for beta in (0.05, 0.3, 0.5, 1.0):
        assert partial_roc_auc(y, s, beta) == pytest.approx(roc_auc_score(y, s, max_fpr=beta), abs=1e-12)


@pytest.mark.parametrize("beta", [0.3, 0.5])
def test_mcclish_and_raw_pauc_are_told_apart_by_their_chance_level(beta):
    """McClish's value (scikit-learn's max_fpr) puts chance at 0.5; the raw area / beta puts it at beta / 2."""
    y = np.array([0, 1] * 50)
    chance = np.full(len(y), 0.5)  # one tied score: the ROC is the diagonal
    assert partial_roc_auc(y, chance, beta) == pytest.approx(0.5)
    assert roc_auc_score(y, chance, max_fpr=beta) == pytest.approx(0.5)
    assert partial_roc_auc(y, chance, beta, standardized=False) == pytest.approx(beta / 2)
    perfect = y.astype(float)
    assert partial_roc_auc(y, perfect, beta) == partial_roc_auc(y, perfect, beta, standardized=False) == 1.0


def test_roc_areas_computed_by_hand():
    # Scores 0.9 P, 0.8 N, 0.7 P, 0.6 N, 0.5 N, 0.4 P: ROC steps through
    # (0,0) (0,1/3) (1/3,1/3) (1/3,2/3) (2/3,2/3) (1,2/3) (1,1).
    y = [1, 0, 1, 0, 0, 1]
    s = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    assert roc_auc(y, s) == pytest.approx(5 / 9)  # correctly ordered pairs: 3 + 2 + 0 of 9
    # FPR <= 0.5: tpr 1/3 on [0, 1/3], 2/3 on [1/3, 0.5]: area 1/9 + 1/9 = 2/9
    assert partial_roc_auc(y, s, 0.5, standardized=False) == pytest.approx((2 / 9) / 0.5)
    assert partial_roc_auc(y, s, 0.5) == pytest.approx(0.5 * (1 + (2 / 9 - 0.125) / (0.5 - 0.125)))
    # a tie between the first positive and negative: the ROC moves diagonally from (0,0) to (1/3,1/3)
    tied = [0.9, 0.9, 0.7, 0.6, 0.5, 0.4]
    assert partial_roc_auc(y, tied, 1 / 3, standardized=False) == pytest.approx((1 / 18) / (1 / 3))
    assert roc_auc(y, tied) == pytest.approx(4.5 / 9)


def test_two_way_partial_auc_matches_area_in_region_and_pairs():
    # 4 positives, 5 negatives; TPR >= 0.5 keeps the 2 lowest positives, FPR <= 0.4 the 2 highest negatives.
    y = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0])
    s = np.array([0.95, 0.9, 0.6, 0.3, 0.8, 0.5, 0.4, 0.2, 0.1])
    # low positives {0.6, 0.3} vs high negatives {0.8, 0.5}: only 0.6 > 0.5 -> 1/4
    assert two_way_partial_auc(y, s, min_tpr=0.5, max_fpr=0.4) == pytest.approx(0.25)
    # the same as the ROC area over FPR <= 0.4 above TPR 0.5, divided by 0.5 * 0.4:
    # FPR in [0, 0.2]: TPR = 2/4 -> 0 above 0.5; FPR in [0.2, 0.4]: TPR = 3/4 -> 0.25 * 0.2 = 0.05
    assert pytest.approx(0.25) == 0.05 / (0.5 * 0.4)
    assert two_way_partial_auc(y, s, min_tpr=0.0, max_fpr=1.0) == pytest.approx(roc_auc(y, s))
    rng = np.random.default_rng(0)
    y2 = (rng.random(300) < 0.3).astype(float)
    s2 = rng.normal(size=300) + y2
    pos, neg = np.sort(s2[y2 == 1]), np.sort(s2[y2 == 0])[::-1]
    k_pos, k_neg = math.ceil(0.4 * pos.size), math.ceil(0.3 * neg.size)
    brute = np.mean([[float(p > n) for n in neg[:k_neg]] for p in pos[:k_pos]])
    assert two_way_partial_auc(y2, s2, 0.6, 0.3) == pytest.approx(brute)


def test_single_class_and_all_missing_give_nan_with_reason():
    for fn in (roc_auc, lambda y, s: partial_roc_auc(y, s, 0.3), lambda y, s: two_way_partial_auc(y, s, 0.5, 0.5)):
        r = fn([0, 0, 0], [0.1, 0.2, 0.3])
        assert math.isnan(r) and r.reason == "no positive among 3 labelled samples"
        assert fn([1, 1], [0.1, 0.2]).reason == "no negative among 2 labelled samples"
        assert fn([np.nan, np.nan], [0.1, 0.2]).reason == "no labelled sample"
    with pytest.raises(ValueError, match=r"y_true must be 0, 1 or NaN.*row 1"):
        roc_auc([0, 2, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="same length, got 3 and 2"):
        roc_auc([0, 1, 1], [0.1, 0.2])
    with pytest.raises(ValueError, match="max_fpr must lie in"):
        partial_roc_auc([0, 1], [0.1, 0.2], 0.0)


def test_metric_result_is_a_float_that_survives_json_and_pickle():
    r = roc_auc([0, 0], [0.1, 0.2])
    assert json.loads(json.dumps({"x": 0.75, "y": MetricResult(0.5)})) == {"x": 0.75, "y": 0.5}
    assert str(MetricResult(0.25)) == "0.25" and f"{MetricResult(0.25):.1f}" == "0.2"
    back = pickle.loads(pickle.dumps(r))
    assert math.isnan(back) and back.reason == r.reason and not back.defined


def test_evaluate_multilabel_keys_values_and_macro_skip_undefined():
    rng = np.random.default_rng(1)
    diseases = ["Cardiomegaly", "Edema", "Consolidation"]
    y = (rng.random((150, 3)) < 0.3).astype(float)
    s = rng.normal(size=(150, 3)) + y
    y[:, 1] = 0  # Edema has no positive
    y[:10, 2] = np.nan
    mask = np.ones_like(y, dtype=bool)
    mask[10:20, 0] = False
    out = evaluate_multilabel(y, s, diseases, betas=(0.3, 0.5), mask=mask, two_way=[(0.5, 0.5)])
    assert metric_names((0.3, 0.5), [(0.5, 0.5)]) == [
        "auc", "pauc_fpr0.3_mcclish", "pauc_fpr0.3_raw", "pauc_fpr0.5_mcclish", "pauc_fpr0.5_raw", "tpauc_tpr0.5_fpr0.5"]
    assert len(out) == 6 * 4
    keep0, keep2 = mask[:, 0], ~np.isnan(y[:, 2])
    assert out["auc/Cardiomegaly"] == pytest.approx(roc_auc_score(y[keep0, 0], s[keep0, 0]))
    assert out["auc/Consolidation"] == pytest.approx(roc_auc_score(y[keep2, 2], s[keep2, 2]))
    assert out["pauc_fpr0.3_mcclish/Consolidation"] == pytest.approx(roc_auc_score(y[keep2, 2], s[keep2, 2], max_fpr=0.3))
    assert math.isnan(out["auc/Edema"]) and out["auc/Edema"].reason == "Edema: no positive among 150 labelled samples"
    assert out["auc_macro"] == pytest.approx((out["auc/Cardiomegaly"] + out["auc/Consolidation"]) / 2)
    reasons = metric_reasons(out)
    assert set(reasons) == {f"{name}/Edema" for name in metric_names((0.3, 0.5), [(0.5, 0.5)])}
    all_undefined = evaluate_multilabel(np.zeros((5, 1)), np.zeros((5, 1)), ["Melanoma"], betas=())
    assert math.isnan(all_undefined["auc_macro"]) and "no defined value" in all_undefined["auc_macro"].reason
    with pytest.raises(ValueError, match="2 label columns but 3 disease names"):
        evaluate_multilabel(y[:, :2], s[:, :2], diseases)


def test_pooled_is_not_the_average_of_site_aucs():
    # Each site ranks its own samples perfectly but site B's scores are all higher: pooled AUC < 1.
    y_a, s_a = np.array([[0], [0], [1]]), np.array([[0.1], [0.2], [0.3]])
    y_b, s_b = np.array([[0], [1], [1]]), np.array([[0.7], [0.8], [0.9]])
    y_c, s_c = np.array([[0], [0]]), np.array([[0.5], [0.6]])  # site C has no positive
    out = per_site_and_pooled({"A": y_a, "B": y_b, "C": y_c}, {"A": s_a, "B": s_b, "C": s_c}, ["Melanoma"], betas=(0.5,))
    assert out["site/A/auc/Melanoma"] == 1.0 and out["site/B/auc/Melanoma"] == 1.0
    assert math.isnan(out["site/C/auc/Melanoma"])
    assert out["macro_over_sites/auc/Melanoma"] == 1.0
    y_all = np.concatenate([y_a, y_b, y_c])[:, 0]
    s_all = np.concatenate([s_a, s_b, s_c])[:, 0]
    assert out["pooled/auc/Melanoma"] == pytest.approx(roc_auc_score(y_all, s_all))
    assert out["pooled/auc/Melanoma"] < 1.0
    assert out["pooled/pauc_fpr0.5_mcclish_macro"] == pytest.approx(roc_auc_score(y_all, s_all, max_fpr=0.5))


def test_bootstrap_ci_covers_estimate_and_narrows_with_more_data():
    y, s = random_case(3, n=200)
    ci = bootstrap_ci(y, s, n_boot=300, seed=0)
    assert ci.estimate == pytest.approx(roc_auc_score(y, s))
    assert ci.low < ci.estimate < ci.high and ci.n_valid == 300
    y_big, s_big = random_case(3, n=3000)
    big = bootstrap_ci(y_big, s_big, n_boot=200, seed=0)
    assert big.high - big.low < 0.5 * (ci.high - ci.low)
    again = bootstrap_ci(y, s, n_boot=300, seed=0)
    assert (again.low, again.high) == (ci.low, ci.high)
    # multi-label: rows resampled, macro AUC
    ym = np.stack([y, 1 - y], axis=1)
    sm = np.stack([s, -s], axis=1)
    multi = bootstrap_ci(ym, sm, lambda t, p: evaluate_multilabel(t, p, ["a", "b"], betas=())["auc_macro"],
                         n_boot=50, stratify=False)
    assert multi.estimate == pytest.approx(roc_auc_score(y, s)) and multi.low <= multi.estimate <= multi.high
    undefined = bootstrap_ci(np.zeros(5), np.arange(5.0))
    assert math.isnan(undefined.low) and undefined.n_valid == 0 and undefined.estimate.reason
