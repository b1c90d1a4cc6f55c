"""Multi-label metrics per disease and macro, per site and pooled, under the names the package docstring lists."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from models.metrics.binary import MetricResult, partial_roc_auc, roc_auc, two_way_partial_auc


def _macro(values: Sequence[MetricResult], what: str) -> MetricResult:
    defined = [v for v in values if v.defined]
    if not defined:
        return MetricResult.undefined(f"{what}: no defined value to average")
    return MetricResult(float(np.mean(defined)))


def _beta_name(beta: float) -> str:
    return f"{beta:g}"


def metric_names(betas: Sequence[float] = (0.3, 0.5), two_way: Sequence[tuple[float, float]] = ()) -> list[str]:
    """The metric names :func:`evaluate_multilabel` reports, in order."""
    names = ["auc"]
    for beta in betas:
        names += [f"pauc_fpr{_beta_name(beta)}_mcclish", f"pauc_fpr{_beta_name(beta)}_raw"]
    names += [f"tpauc_tpr{_beta_name(a)}_fpr{_beta_name(b)}" for a, b in two_way]
    return names


def _as_matrix(y_true, y_score, diseases: Sequence[str], mask) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y_true, dtype=np.float64)
    s = np.asarray(y_score, dtype=np.float64)
    if y.ndim == 1:
        y, s = y[:, None], s.reshape(-1, 1)
    if y.ndim != 2 or s.shape != y.shape:
        raise ValueError(f"y_true and y_score must have the same (N, C) shape, got {y.shape} and {s.shape}")
    if y.shape[1] != len(diseases):
        raise ValueError(f"{y.shape[1]} label columns but {len(diseases)} disease names {list(diseases)}")
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != y.shape:
            raise ValueError(f"mask must have shape {y.shape}, got {m.shape}")
        y = np.where(m.astype(bool), y, np.nan)
    return y, s


def evaluate_multilabel(y_true, y_score, diseases: Sequence[str], betas: Sequence[float] = (0.3, 0.5),
                        mask=None, two_way: Sequence[tuple[float, float]] = ()) -> dict[str, MetricResult]:
    """Per-disease AUC and partial AUCs and their macro means over the defined diseases.

    ``y_true`` (N, C) with 1, 0 or NaN (missing); ``mask`` (N, C) True = label present, an alternative
    way to mark missing labels. ``two_way`` lists (min_tpr, max_fpr) pairs for two-way partial AUC.
    Keys ``<metric>/<disease>`` and ``<metric>_macro`` with metric names from :func:`metric_names`.
    """
    y, s = _as_matrix(y_true, y_score, diseases, mask)
    metrics: dict[str, Callable[[np.ndarray, np.ndarray], MetricResult]] = {"auc": roc_auc}
    for beta in betas:
        metrics[f"pauc_fpr{_beta_name(beta)}_mcclish"] = lambda t, p, b=beta: partial_roc_auc(t, p, b, True)
        metrics[f"pauc_fpr{_beta_name(beta)}_raw"] = lambda t, p, b=beta: partial_roc_auc(t, p, b, False)
    for min_tpr, max_fpr in two_way:
        metrics[f"tpauc_tpr{_beta_name(min_tpr)}_fpr{_beta_name(max_fpr)}"] = (
            lambda t, p, a=min_tpr, b=max_fpr: two_way_partial_auc(t, p, a, b))
    out: dict[str, MetricResult] = {}
    for name, fn in metrics.items():
        per_disease = []
        for c, disease in enumerate(diseases):
            value = fn(y[:, c], s[:, c])
            if not value.defined:
                value = MetricResult.undefined(f"{disease}: {value.reason}")
            out[f"{name}/{disease}"] = value
            per_disease.append(value)
        out[f"{name}_macro"] = _macro(per_disease, f"{name}_macro")
    return out


def per_site_and_pooled(y_true_by_site: Mapping[str, object], y_score_by_site: Mapping[str, object],
                        diseases: Sequence[str], betas: Sequence[float] = (0.3, 0.5),
                        mask_by_site: Mapping[str, object] | None = None,
                        two_way: Sequence[tuple[float, float]] = ()) -> dict[str, MetricResult]:
    """Metrics per site, pooled over all sites' samples, and macro-averaged over sites.

    Keys: ``site/<site>/<key>`` (each site's :func:`evaluate_multilabel`), ``pooled/<key>`` (one
    evaluation of every site's samples concatenated: a ranking across hospitals, never the average of
    site AUCs), and ``macro_over_sites/<key>`` (mean over the sites where ``<key>`` is defined).
    """
    if set(y_true_by_site) != set(y_score_by_site):
        raise ValueError(f"labels and scores name different sites: {sorted(y_true_by_site)} vs {sorted(y_score_by_site)}")
    if not y_true_by_site:
        raise ValueError("per_site_and_pooled needs at least one site")
    out: dict[str, MetricResult] = {}
    per_site: dict[str, dict[str, MetricResult]] = {}
    ys, ss = [], []
    for site in y_true_by_site:
        mask = None if mask_by_site is None else mask_by_site.get(site)
        y, s = _as_matrix(y_true_by_site[site], y_score_by_site[site], diseases, mask)
        ys.append(y)
        ss.append(s)
        per_site[site] = evaluate_multilabel(y, s, diseases, betas, two_way=two_way)
        out.update({f"site/{site}/{k}": v for k, v in per_site[site].items()})
    pooled = evaluate_multilabel(np.concatenate(ys), np.concatenate(ss), diseases, betas, two_way=two_way)
    out.update({f"pooled/{k}": v for k, v in pooled.items()})
    for key in pooled:
        out[f"macro_over_sites/{key}"] = _macro([m[key] for m in per_site.values()], f"macro_over_sites/{key}")
    return out
