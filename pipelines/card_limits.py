"""The model card's sections read from the data rather than the model: the training federation (sites, their
QC counts per split, synthetic data, privacy spent), calibration and out-of-distribution figures when a version
has them, and the limitations its evaluation shows. ``pipelines/model_card.py`` assembles the card."""

from __future__ import annotations

import math

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from federated.schema import PARENT_RUN_TAG, QC_FOLDER, QC_SUMMARY_JSON, ROLE_TAG, SITE_ROLE, SITE_TAG

# A disease with fewer pooled test positives than this is named a limitation (its AUC interval is wide).
FEW_POSITIVES = 30
# A site or subgroup whose 95 % interval is wider than this (high - low) on a disease is named a limitation.
WIDE_INTERVAL = 0.2
# Evaluation metric keys holding these words are calibration or refusal figures measured after registration.
CALIBRATION_WORDS = ("calibrat", "ece", "brier", "ood", "out_of_distribution", "refus")


def federation_lines(src, params: dict) -> list[str]:
    """Sites with their QC counts per split (as each sent them: small counts "<N"), synthetic data, each budgeted
    site's privacy spend."""
    training = src.training
    if training is None:
        return ["The training run is gone from the store: its federation is unknown."]
    provenance = src.contract.provenance if src.contract else None
    sites = [s for s in params.get("sites", "").split(",") if s]
    lines = [f"Federation {params.get('federation', '?')} of {len(sites)} site(s)."]
    spent = _privacy_spent(training)
    for site in sites:
        try:
            qc = mlflow.artifacts.load_dict(f"runs:/{training.info.run_id}/{QC_FOLDER}/{site}/{QC_SUMMARY_JSON}")
            counts = "images " + ", ".join(f"{split} {n}" for split, n in qc.get("kept_per_split", {}).items())
            positives: dict[str, list[str]] = {}
            for row in qc.get("labels", []):
                positives.setdefault(row["disease"], []).append(f"{row['split']} {row['positives']}")
            counts += "".join(f"; {disease} positives {', '.join(n)}" for disease, n in positives.items())
        except (MlflowException, OSError):
            counts = "no QC summary recorded"
        privacy = spent.get(site)
        lines.append(f"`{site}`: {counts}"
                     + (f"; epsilon spent {privacy:.3g} by this training" if privacy is not None else ""))
    if provenance is not None:
        lines.append(f"Synthetic images at {', '.join(provenance.synthetic_sites)}: a model trained on them must not "
                     "score patients." if provenance.synthetic else "No site's images were synthetic.")
    if not spent:
        lines.append("No differential privacy: no site spent a privacy budget on this training.")
    return lines


def _privacy_spent(training) -> dict[str, float]:
    runs = MlflowClient().search_runs([training.info.experiment_id],
                                      f"tags.`{PARENT_RUN_TAG}` = '{training.info.run_id}' and "
                                      f"tags.{ROLE_TAG} = '{SITE_ROLE}'")
    return {run.data.tags.get(SITE_TAG, "?"): run.data.metrics["privacy/epsilon_job"] for run in runs
            if "privacy/epsilon_job" in run.data.metrics}


def calibration_and_ood(blocks, contract, metrics: dict[str, float]) -> None:
    """The contract's calibration map with its errors and its out-of-distribution refusal with the rates it was read
    at (docs/algorithms.md sections 15 and 16), and any such figure an evaluation measured; each said absent
    when the version has none, so a reviewer knows the scores are not probabilities or that nothing is refused."""
    blocks.heading("Calibration and out-of-distribution policy")
    calibration = contract.calibration if contract else None
    if calibration is None:
        blocks.paragraph("No calibration map: the scores rank images, they are not probabilities of disease.")
    else:
        blocks.paragraph(f"Calibrated probabilities: {calibration.method}, fitted on the {calibration.source}; "
                         "predict, the pyfunc and the PACS job state them beside the raw score. Expected calibration "
                         "error (10 bins) with its 95 % bootstrap interval, raw score -> calibrated (validation: the "
                         "split the map was fitted on, in sample; test: out of sample).")
        blocks.table(["disease", "Platt slope, intercept", "validation ECE", "test ECE"],
                     [[disease, f"{fitted.slope:.3f}, {fitted.intercept:.3f}",
                       f"{_ece(fitted.valid_before)} -> {_ece(fitted.valid_after)}",
                       f"{_ece(fitted.test_before)} -> {_ece(fitted.test_after)}" if fitted.test_before else "no test split"]
                      for disease, fitted in calibration.diseases.items()])
        blocks.bullets([f"{disease}: no calibration map ({why})." for disease, why in calibration.undefined.items()])
    ood = contract.ood if contract else None
    if ood is None:
        blocks.paragraph("No out-of-distribution refusal: any image the contract's modality, view and body-part "
                         "checks let through is scored (a training under a privacy budget computes none).")
    else:
        test = "no test split" if ood.test_false_refusal is None else f"{ood.test_false_refusal:.1%}"
        blocks.paragraph(f"Out-of-distribution refusal: {ood.method}, fitted on {ood.train_images} training images "
                         f"({', '.join(f'{name} {d}' for name, d in ood.members.items())} values). An image farther than "
                         f"{ood.threshold:.2f} is refused "
                         "`out_of_distribution` with no score; the threshold was read at a false-refusal rate of "
                         f"{ood.target_false_refusal:.0%} and refuses {ood.valid_false_refusal:.1%} of the pooled "
                         f"validation images and {test} of the pooled test images.")
    measured = {k: v for k, v in metrics.items() if any(w in k.lower() for w in CALIBRATION_WORDS)}
    blocks.bullets([f"{key}: {value:.3f}" for key, value in sorted(measured.items())])


def _ece(error) -> str:
    return f"{error.value:.3f} [{error.low:.3f}, {error.high:.3f}]"


def limitations(src, metrics: dict[str, float], diseases: list[str], groups: dict[str, list[str]]) -> list[str]:
    """What the data says the model was not shown to do: synthetic training data, subgroups too small to report
    or left out at some sites, diseases with few positives, sites and subgroups with wide intervals."""
    out = []
    provenance = src.contract.provenance if src.contract else None
    if provenance is not None and provenance.synthetic:
        out.append("Trained on synthetic images: its performance on patients is unknown.")
    if src.evaluation is None:
        out.append("No evaluation of this version: no per-site or subgroup performance.")
    too_small: dict[str, list[str]] = {}  # disease -> its subgroups too small to report (or empty)
    for key, why in sorted(src.suppressed.items()):
        if key.startswith("test/subgroup/") and "too small" in why:
            group, disease = key.removeprefix("test/subgroup/").split("/auc/")
            too_small.setdefault(disease, []).append(group)
    for disease, names in too_small.items():
        out.append(f"{disease}: no figure for {', '.join(names)}: too few (or no) positives or negatives at every "
                   "site to report (the sites' small-count threshold).")
    for key, why in sorted(src.suppressed.items()):
        if key.startswith("test/subgroup/") and "/withheld_sites/" in key:
            group, disease = key.removeprefix("test/subgroup/").split("/withheld_sites/")
            out.append(f"Subgroup {group}, {disease}: {why}; its AUC is that of the other sites.")
    for key in sorted(src.suppressed):
        if key.startswith("test/site/") and "/auc/" in key:
            site, disease = key.removeprefix("test/site/").split("/auc/")
            out.append(f"Site {site}, {disease}: {src.suppressed[key]} (no per-site figure).")
    for disease in diseases:
        positives = sum(metrics.get(f"test/subgroup/{g}/n_pos/{disease}", 0.0) for g in groups.get("site", []))
        if groups.get("site") and positives < FEW_POSITIVES:
            out.append(f"{disease}: {int(positives)} test positives at the sites that report it (fewer than "
                       f"{FEW_POSITIVES}): its AUC is uncertain.")
    wide = 0
    for attribute, members in groups.items():
        for group in members:
            for disease in diseases:
                low = metrics.get(f"test/subgroup/{group}/auc_ci95_low/{disease}", math.nan)
                high = metrics.get(f"test/subgroup/{group}/auc_ci95_high/{disease}", math.nan)
                if high - low > WIDE_INTERVAL and attribute == "site":
                    out.append(f"Site {group.removeprefix('site.')}, {disease}: wide interval [{low:.3f}, {high:.3f}] "
                               f"(wider than {WIDE_INTERVAL}).")
                elif high - low > WIDE_INTERVAL:
                    wide += 1
    if wide:
        out.append(f"{wide} subgroup and disease cells have intervals wider than {WIDE_INTERVAL}: read their AUCs "
                   "as rough.")
    return out or ["None found in the data recorded (this does not show that the model holds elsewhere)."]
