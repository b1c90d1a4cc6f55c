"""Site-local evaluation of the global model: each site scores its own valid/test split, and only
fixed-size aggregates leave it.

Per split, in three separate steps (the NVIDIA FLARE transport runs the same two functions):

1. ``site_summary(labels, scores, bins, min_count)`` at the site, from its own data only, returns two
   fixed-size arrays: ``report`` (C, 3 + M): per disease its positive and negative counts, a
   suppression flag and its own M metrics (``METRICS``: AUC, one-way pAUC at FPR <= 0.3 and 0.5,
   McClish and raw, two-way pAUC at TPR >= 0.5, FPR <= 0.5); and ``histograms`` (C, 2, B): the counts
   of its positives' and negatives' scores in B equal-width bins of [0, 1] (``TrainConfig.eval_bins``).
   Small-count suppression happens here: for a disease with fewer than ``min_count`` positives or
   negatives the site's metrics are NaN and flagged, and each count below ``min_count`` is sent as
   ``common.small_counts.ON_WIRE`` (the one small-count rule; a float array cannot carry ``"<10"``).
2. The transport exchanges them: ``report`` gathered (K rows; 8 (3 + M) C bytes per site), ``histograms``
   summed over sites (8 * 2 * B * C bytes per site). Both are counted in the round's bytes.
3. ``combine(reports, histograms, ...)`` anywhere: the flat float metrics and the suppression record.

Keys of the float dict (``evaluate`` prefixes ``<split>/``): ``site/<k>/<metric>/<disease>``,
``site/<k>/<metric>_macro`` (over the site's reported diseases), ``site/<k>/n_pos/<disease>`` and
``site/<k>/n_neg/<disease>``; ``pooled/<metric>/<disease>`` and ``pooled/<metric>_macro`` from the
summed histograms, ``pooled/<metric>_bound/<disease>`` (the guaranteed ``|histogram value - exact
pooled value|``, models.metrics.histogram_auc and friends), ``pooled/auc_ci95_low/<disease>``,
``pooled/auc_ci95_high/<disease>`` and their ``_macro`` (95 % intervals from the summed histograms,
``pooled_auc_intervals``); ``macro_over_sites/<metric>/<disease>`` and
``macro_over_sites/<metric>_macro`` (mean over the sites whose value is reported). NaN = undefined.
A suppressed site metric or count is absent from the float dict; the suppression record (a flat
``{key: str}`` with the same key shape) says ``"suppressed: fewer than 10 positives"`` (or negatives)
for each absent metric and ``"<10"`` for each absent count (``common.small_counts``: the one encoding).
The pooled figures still use the suppressed site's histogram; macro over sites leaves a suppressed site out.

With the default B = 1000 the pooled AUC is within ``pooled/auc_bound/<disease>`` of the exact pooled
AUC: half the fraction of positive-negative pairs whose scores share a bin of width 0.001.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from common.small_counts import from_wire, is_small, is_suppressed, to_wire
from federated import subgroups
from federated.algorithms.base import FederationContext, Site
from federated.ood import OodModel
from federated.predict import predict_scores
from federated.state import model_tensors, nbytes
from models.metrics import (
    Bounded,
    evaluate_multilabel,
    histogram_auc,
    histogram_auc_interval,
    histogram_partial_auc,
    histogram_two_way_partial_auc,
    metric_names,
    score_histograms,
)

BETAS = (0.3, 0.5)
TWO_WAY = ((0.5, 0.5),)
METRICS = tuple(metric_names(BETAS, TWO_WAY))
_N_POS, _N_NEG, _SUPPRESSED, _FIRST_METRIC = 0, 1, 2, 3
SPLITS = ("valid", "test")  # the splits an evaluation scores, in this order


def _batch_norms(model: nn.Module) -> list[nn.modules.batchnorm._NormBase]:
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.running_var is not None]


def global_model(sites: list[Site], transport, weights: list[float], bn_stats: str = "mean") -> nn.Module:
    """The global network (what is registered and served), in eval mode: the weighted mean of the site
    models' parameters.

    BatchNorm running statistics: with ``bn_stats="mean"`` they were averaged every round like the
    parameters, so the mean changes nothing. With ``bn_stats="local"`` every site keeps its own; the global model then carries the statistics of the sites'
    pooled feature distribution, not a plain mean of the site variances:
    ``running_mean = sum_k w_k mu_k`` and ``running_var = sum_k w_k (var_k + mu_k^2) - running_mean^2``
    (law of total variance; a mean of the variances drops the spread between the sites' means).
    """
    # One network copied (the first site's); the other sites of this process lend copies of their tensors:
    # a deepcopy of a network per site cost 60 ms of Python each, 4 s an evaluation at 64 sites in-process.
    model = copy.deepcopy(sites[0].model)
    own = model_tensors(model)
    names = [n for n, t in own.items() if t.is_floating_point()]
    wanted = set(names)
    per_site = [own, *({n: t.detach().clone() for n, t in model_tensors(s.model).items() if n in wanted}
                       for s in sites[1:])]
    pooled_bn = bn_stats == "local"
    if pooled_bn:
        for tensors in per_site:
            for name in (n for n in names if n.endswith(".running_var")):
                tensors[name].add_(tensors[name.removesuffix("running_var") + "running_mean"].square())  # E[x^2]
    transport.mean_([[tensors[n] for n in names] for tensors in per_site], weights)
    if pooled_bn:
        for bn in _batch_norms(model):
            bn.running_var.sub_(bn.running_mean.square()).clamp_min_(0.0)
    return model.eval()


def site_model(model: nn.Module, site: Site, bn_stats: str) -> nn.Module:
    """The model a site evaluates: the global one, with the site's own BatchNorm statistics when they are
    kept local (``bn_stats="local"``: the model the site trains and would serve)."""
    if bn_stats != "local":
        return model
    own = copy.deepcopy(model)
    for mine, theirs in zip(_batch_norms(own), _batch_norms(site.model)):
        mine.running_mean.copy_(theirs.running_mean)
        mine.running_var.copy_(theirs.running_var)
    return own


# --- 1. at the site -------------------------------------------------------------------------------
def site_summary(labels: np.ndarray, scores: np.ndarray, bins: int, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(report (C, 3 + M), histograms (C, 2, bins))`` of one site's split, float64, from its labels (N, C;
    NaN = missing) and scores (N, C) alone. See the module docstring for the layout and suppression."""
    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    C = labels.shape[1]
    diseases = [str(c) for c in range(C)]
    exact = evaluate_multilabel(labels, scores, diseases, BETAS, two_way=TWO_WAY)
    report = np.full((C, _FIRST_METRIC + len(METRICS)), np.nan)
    histograms = np.zeros((C, 2, bins))
    for c in range(C):
        histograms[c, 0], histograms[c, 1] = score_histograms(labels[:, c], scores[:, c], bins)
        counts = histograms[c].sum(axis=1)
        suppressed = bool(is_small(counts, min_count).any())
        report[c, _N_POS : _N_NEG + 1] = to_wire(counts, min_count)
        report[c, _SUPPRESSED] = float(suppressed)
        if not suppressed:
            report[c, _FIRST_METRIC:] = [float(exact[f"{m}/{c}"]) for m in METRICS]
    return report, histograms


def absent_summary(num_classes: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """What a site without the split sends: NaN report rows (no counts) and empty histograms."""
    return np.full((num_classes, _FIRST_METRIC + len(METRICS)), np.nan), np.zeros((num_classes, 2, bins))


def split_summary(model: nn.Module, part, num_classes: int, bins: int, min_count: int, device: torch.device,
                  amp: bool = False, channels_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The one site-local evaluation step, whoever asks (training's evaluation rounds, an evaluation of
    registered models in-process or at the hospitals): score this site's split ``part`` (a
    ``federated.data.SplitData``, None when the site has no such split) with ``model`` in eval mode and
    summarise it (``site_summary``)."""
    if part is None or len(part) == 0:
        return absent_summary(num_classes, bins)
    scores = predict_scores(model, part.images, device, amp=amp, channels_last=channels_last)
    return site_summary(part.labels, scores, bins, min_count)


# --- 3. anywhere ----------------------------------------------------------------------------------
def pooled_from_histograms(histograms: np.ndarray, diseases: list[str]) -> dict[str, Bounded]:
    """``{"<metric>/<disease>": Bounded}`` from the histograms (C, 2, B) summed over sites."""
    out = {}
    for c, disease in enumerate(diseases):
        hp, hn = histograms[c]
        values = {"auc": histogram_auc(hp, hn)}
        for beta in BETAS:
            values[f"pauc_fpr{beta:g}_mcclish"] = histogram_partial_auc(hp, hn, beta, True)
            values[f"pauc_fpr{beta:g}_raw"] = histogram_partial_auc(hp, hn, beta, False)
        for min_tpr, max_fpr in TWO_WAY:
            values[f"tpauc_tpr{min_tpr:g}_fpr{max_fpr:g}"] = histogram_two_way_partial_auc(hp, hn, min_tpr, max_fpr)
        out.update({f"{m}/{disease}": values[m] for m in METRICS})
    return out


def _mean(values: list[float]) -> float:
    defined = [v for v in values if not np.isnan(v)]
    return float(np.mean(defined)) if defined else float("nan")


def combine(reports: np.ndarray, histograms: np.ndarray, site_ids: list[int], diseases: list[str],
            min_count: int) -> tuple[dict[str, float], dict[str, str]]:
    """The flat float metrics and the suppression record from the gathered ``reports`` (K, C, 3 + M) of
    sites ``site_ids`` and the summed ``histograms`` (C, 2, B). Keys without the split prefix."""
    metrics: dict[str, float] = {}
    suppressed: dict[str, str] = {}
    per_site: dict[str, list[float]] = {}
    for k, report in zip(site_ids, reports):
        if np.isnan(report[:, _N_POS]).all():
            continue  # the site has no such split
        for m_i, m in enumerate(METRICS):
            reported = []
            for c, disease in enumerate(diseases):
                key = f"{m}/{disease}"
                if report[c, _SUPPRESSED]:
                    few = [name for name, i in (("positives", _N_POS), ("negatives", _N_NEG))
                           if is_suppressed(from_wire(report[c, i], min_count))]
                    suppressed[f"site/{k}/{key}"] = f"suppressed: fewer than {min_count} {' and '.join(few)}"
                    continue
                value = float(report[c, _FIRST_METRIC + m_i])
                metrics[f"site/{k}/{key}"] = value
                per_site.setdefault(key, []).append(value)
                reported.append(value)
            metrics[f"site/{k}/{m}_macro"] = _mean(reported)
        for c, disease in enumerate(diseases):
            for name, i in (("n_pos", _N_POS), ("n_neg", _N_NEG)):
                count = from_wire(report[c, i], min_count)
                if is_suppressed(count):
                    suppressed[f"site/{k}/{name}/{disease}"] = count
                else:
                    metrics[f"site/{k}/{name}/{disease}"] = float(count)
    pooled = pooled_from_histograms(histograms, diseases)
    for m in METRICS:
        for disease in diseases:
            key = f"{m}/{disease}"
            metrics[f"pooled/{key}"] = float(pooled[key].value)
            metrics[f"pooled/{m}_bound/{disease}"] = pooled[key].bound
            metrics[f"macro_over_sites/{key}"] = _mean(per_site.get(key, []))
        metrics[f"pooled/{m}_macro"] = _mean([float(pooled[f"{m}/{d}"].value) for d in diseases])
        metrics[f"macro_over_sites/{m}_macro"] = _mean([metrics[f"macro_over_sites/{m}/{d}"] for d in diseases])
    metrics.update(pooled_auc_intervals(histograms, diseases, metrics["pooled/auc_macro"]))
    return metrics, suppressed


def pooled_auc_intervals(histograms: np.ndarray, diseases: list[str], macro: float) -> dict[str, float]:
    """95 % intervals of the pooled AUC per disease (``models.metrics.histogram_auc_interval``, from the summed
    histograms) and of its macro mean ``macro``: ``pooled/auc_ci95_low/<disease>``, ``..._high/<disease>``,
    ``pooled/auc_ci95_low_macro``, ``pooled/auc_ci95_high_macro``.

    The diseases are scored on the same images, so their AUCs are correlated in ways the marginal histograms
    cannot tell; the standard deviation of a mean is at most the mean of the standard deviations whatever
    the correlation, so the macro interval's half-width is the mean of the diseases' (conservative)."""
    out, half_widths = {}, []
    for c, disease in enumerate(diseases):
        interval = histogram_auc_interval(*histograms[c])
        out[f"pooled/auc_ci95_low/{disease}"], out[f"pooled/auc_ci95_high/{disease}"] = interval.low, interval.high
        if not np.isnan(histogram_auc(*histograms[c]).value):
            half_widths.append(interval.half_width)
    half = float(np.mean(half_widths)) if half_widths else float("nan")  # NaN when any defined AUC has none
    out["pooled/auc_ci95_low_macro"] = max(0.0, macro - half) if not np.isnan(half) else float("nan")
    out["pooled/auc_ci95_high_macro"] = min(1.0, macro + half) if not np.isnan(half) else float("nan")
    return out


# --- 2. through the transport -----------------------------------------------------------------------
@dataclass
class Evaluation:
    metrics: dict[str, float]  # flat ``<split>/...`` floats (module docstring)
    suppressed: dict[str, str]  # ``<split>/site/<k>/...`` -> why it is absent from ``metrics``
    bytes_sent: list[int]  # per site of this process
    bytes_received: list[int]
    # The test split's histograms summed over sites (C, 2, B): the pooled test ROC is drawn from them, so
    # the centre needs no site's data for it. None when no site holds a test split.
    test_histograms: np.ndarray | None = None
    # The valid split's, likewise: the registered model's operating points are read from them
    # (pipelines/model_package/thresholds.py).
    valid_histograms: np.ndarray | None = None
    # After the last round, the out-of-distribution refusal's model (federated/ood.py); None otherwise.
    ood: OodModel | None = None


def evaluate(model: nn.Module, sites: list[Site], transport, fed: FederationContext, bn_stats: str, bins: int,
             min_count: int) -> Evaluation:
    """Evaluate ``model`` on every site's ``valid`` and ``test`` split: each site summarises its own split,
    the transport gathers the reports and sums the histograms, every process combines. A collective: every
    site takes part (with an empty summary when it has no such split)."""
    out = Evaluation({}, {}, [0] * len(sites), [0] * len(sites))
    C, K = fed.num_classes, transport.num_sites
    for split in SPLITS:
        reports, histograms = [], []
        for site in sites:
            report, hist = split_summary(site_model(model, site, bn_stats), site.data.splits.get(split), C, bins,
                                         min_count, fed.device, fed.amp, fed.channels_last)
            if site.privacy is not None:  # differential privacy: noised histograms only (federated/dp/site.py)
                report, hist = site.privacy.release_summary(report, hist)
            reports.append(torch.from_numpy(report).to(fed.device)[None])  # NCCL moves device tensors
            histograms.append(torch.from_numpy(hist).to(fed.device))
        gathered = transport.gather(reports)
        transport.mean_([[h] for h in histograms], [1.0] * len(sites))  # weights 1: the sum over sites
        for i in range(len(sites)):
            out.bytes_sent[i] += nbytes(reports[i]) + nbytes(histograms[i])
            out.bytes_received[i] += (K - 1) * nbytes(reports[i]) + nbytes(histograms[i])
        _add_split(out, split, gathered.cpu().numpy(), histograms[0].cpu().numpy(), list(range(K)),
                   list(fed.diseases), min_count)
    return out


def _add_split(out: Evaluation, split: str, reports: np.ndarray, histograms: np.ndarray, site_ids: list,
               diseases: list[str], min_count: int) -> None:
    """``combine`` one split's gathered reports (K, C, 3 + M) and summed histograms into ``out``, prefixed
    ``<split>/``; nothing when no site holds the split."""
    if np.isnan(reports[:, :, _N_POS]).all() and not histograms.any():  # DP sites send histograms only
        return
    metrics, suppressed = combine(reports, histograms, site_ids, diseases, min_count)
    out.metrics.update({f"{split}/{k}": v for k, v in metrics.items()})
    out.suppressed.update({f"{split}/{k}": v for k, v in suppressed.items()})
    if split == "test":
        out.test_histograms = histograms
    if split == "valid":
        out.valid_histograms = histograms


def combine_sites(summaries: list[dict[str, tuple[np.ndarray, np.ndarray]]], site_ids: list, diseases: list[str],
                  min_count: int) -> Evaluation:
    """Step 3 where the sites' summaries arrive as they are (an evaluation job's results rather than a
    training's collectives): ``summaries[k][split] = (report, histograms)`` of site ``site_ids[k]``, for
    every split of ``SPLITS``. The same metrics, keys and suppression record as ``evaluate``, and the subgroups'
    (``federated.subgroups``: from the cells the sites sent and each site's own summary); no bytes."""
    out = Evaluation({}, {}, [], [])
    for split in SPLITS:
        reports = np.stack([np.asarray(s[split][0], dtype=np.float64) for s in summaries])
        histograms = np.sum([np.asarray(s[split][1], dtype=np.float64) for s in summaries], axis=0)
        _add_split(out, split, reports, histograms, site_ids, diseases, min_count)
        if f"{split}/pooled/auc_macro" in out.metrics:
            metrics, suppressed = subgroups.pooled(summaries, [str(k) for k in site_ids], split, diseases, min_count)
            out.metrics.update({f"{split}/{k}": v for k, v in metrics.items()})
            out.suppressed.update({f"{split}/{k}": v for k, v in suppressed.items()})
    return out
