"""AUC and partial-AUC metrics per disease, per site and pooled (docs/algorithms.md section 2).

Pure numpy functions with scikit-learn's argument order ``(y_true, y_score)``. A metric that is not
defined (a class absent, every label missing) returns a :class:`MetricResult` equal to NaN that carries
the reason; nothing raises and nothing is silently 0.5. A ``MetricResult`` is a ``float``, so the
dicts returned here go straight to MLflow's ``log_metrics`` or JSON, and ``result.reason`` explains a NaN.

Names in the dict helpers: ``auc``, ``pauc_fpr{beta}_mcclish`` (identical to scikit-learn's
``roc_auc_score(max_fpr=beta)``), ``pauc_fpr{beta}_raw`` (area under the ROC for FPR <= beta divided by
beta, in [0, 1]) and ``tpauc_tpr{alpha}_fpr{beta}`` (two-way), each as ``<name>/<disease>`` and the
macro mean over defined diseases as ``<name>_macro``.

Pooled over sites without per-image scores: :func:`score_histograms` (fixed equal-width bins of
[0, 1]) and :func:`histogram_auc`, :func:`histogram_partial_auc`, :func:`histogram_two_way_partial_auc`,
each returning a :class:`Bounded` value with the guaranteed bound on its distance to the exact metric,
and :func:`histogram_auc_interval`, a confidence interval for the AUC from the same histograms
(:func:`histogram_auc_difference`: of two disjoint groups' AUCs).

Modules: ``binary`` (one disease), ``multilabel`` (per disease, site and pooled), ``histograms`` (pooled
without per-image scores), ``bootstrap`` (percentile intervals). Import the names from here.
"""

from models.metrics.binary import MetricResult, metric_reasons, partial_roc_auc, roc_auc, two_way_partial_auc
from models.metrics.bootstrap import ConfidenceInterval, bootstrap_ci
from models.metrics.histograms import (
    Bounded,
    HistogramInterval,
    histogram_auc,
    histogram_auc_difference,
    histogram_auc_interval,
    histogram_partial_auc,
    histogram_roc,
    histogram_two_way_partial_auc,
    score_histograms,
)
from models.metrics.multilabel import evaluate_multilabel, metric_names, per_site_and_pooled

__all__ = [
    "Bounded", "ConfidenceInterval", "HistogramInterval", "MetricResult", "bootstrap_ci", "evaluate_multilabel",
    "histogram_auc", "histogram_auc_difference", "histogram_auc_interval", "histogram_partial_auc", "histogram_roc",
    "histogram_two_way_partial_auc", "metric_names", "metric_reasons", "partial_roc_auc", "per_site_and_pooled",
    "roc_auc", "score_histograms", "two_way_partial_auc",
]
