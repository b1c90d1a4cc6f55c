"""A registered version's model card (Mitchell et al., "Model Cards for Model Reporting", 2019; the CLAIM 2024
checklist): what a hospital's reviewer reads before the champion writes into its PACS.

Every figure is read back from MLflow: the version (its contract: diseases, network, provenance, operating
points, code version; its tags: the score the champion rule compares), its training run (algorithm and settings,
each site's QC summary and privacy spend) and its latest evaluation run (pooled, per-site and per-subgroup AUC
with intervals, ``federated/subgroups.py``). ``write_card`` logs it as ``model_card/v<N>.md``, ``.html`` (the forest
plot inline) and ``forest_v<N>.png`` on the training run, and rewrites the version's description to name the card,
the evaluation and whether the version is the champion; it runs when a version is registered, when it is
evaluated and whenever the alias may have moved. ``fedauc card`` prints it.
"""

from __future__ import annotations

import io
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from federated.schema import (
    COLLAPSED_TAG,
    EVALUATION_ROLE,
    MODEL_URI_TAG,
    ROLE_TAG,
    SCORE_TAG_PREFIX,
    SELECTION_METRIC_TAG,
    SUPPRESSED_ARTIFACT,
    MetricKey,
    registered_model_name,
)
from federated.subgroups import gap_pair
from pipelines import card_limits, descriptions
from pipelines.card_render import Blocks, to_html, to_markdown
from pipelines.model_package.contract import METADATA_KEY, ModelContract
from pipelines.registry import champion_version

CARD_FOLDER = "model_card"
FOREST_ARTIFACT = "forest_test_subgroups.png"  # on the evaluation run
INTENDED_USE = ("Triage support: per disease, the probability that a radiologist's read finds it, for the images "
                "the contract accepts (modality, view, body part). Not a diagnosis, not for other populations, "
                "devices or body parts than those below, never without a clinician's read.")


def card_paths(version: str) -> tuple[str, str, str]:
    """Where a version's card lies among its training run's artifacts: Markdown, HTML, forest plot."""
    return (f"{CARD_FOLDER}/v{version}.md", f"{CARD_FOLDER}/v{version}.html", f"{CARD_FOLDER}/forest_v{version}.png")


@dataclass
class Sources:
    """What a card is built from, read from MLflow."""

    task: str
    version: str
    contract: ModelContract | None
    tags: dict[str, str]  # the version's
    training: object | None  # the training run (mlflow Run), None where it is gone
    evaluation: object | None  # the latest evaluation run of the version
    suppressed: dict[str, str]  # the evaluation's suppression record
    champion: str | None
    versions: list  # every version of the registered model (the champion's margin)


def gather(task: str, version: str) -> Sources:
    client = MlflowClient()
    name = registered_model_name(task)
    try:
        mv = client.get_model_version(name, version)
    except MlflowException:
        from common.errors import ConfigError

        raise ConfigError(f"model {name} has no version {version} at {mlflow.get_tracking_uri()}",
                          fix="list the registered versions with `fedauc ui` and pass one of them") from None
    raw = (mlflow.models.get_model_info(f"models:/{name}/{version}").metadata or {}).get(METADATA_KEY, {})
    contract = ModelContract.model_validate(raw) if raw else None
    training = _run(client, mv.run_id)
    evaluation = None
    if training is not None:
        found = client.search_runs([training.info.experiment_id],
                                   f"tags.{ROLE_TAG} = '{EVALUATION_ROLE}' and tags.{MODEL_URI_TAG} = "
                                   f"'models:/{name}/{version}'", order_by=["attributes.start_time DESC"],
                                   max_results=1)
        evaluation = found[0] if found else None
    suppressed = {}
    if evaluation is not None:
        try:
            suppressed = mlflow.artifacts.load_dict(f"runs:/{evaluation.info.run_id}/{SUPPRESSED_ARTIFACT}")
        except (MlflowException, OSError):
            suppressed = {}
    return Sources(task, str(version), contract, dict(mv.tags), training, evaluation, suppressed, champion_version(task),
                   client.search_model_versions(f"name = '{name}'"))


def _run(client: MlflowClient, run_id: str | None):
    try:
        return client.get_run(run_id) if run_id else None
    except MlflowException:
        return None


def _interval(metrics: dict, base: str, disease: str) -> tuple[float, float, float] | None:
    auc = metrics.get(f"{base}/auc/{disease}")
    if auc is None or math.isnan(auc):
        return None
    return auc, metrics.get(f"{base}/auc_ci95_low/{disease}", math.nan), metrics.get(f"{base}/auc_ci95_high/{disease}",
                                                                                      math.nan)


def fmt(values: tuple[float, float, float] | None) -> str:
    """``0.812 [0.771, 0.853]``: how a card writes an AUC and its interval (what its test parses back)."""
    if values is None:
        return "n/a"
    auc, low, high = values
    return f"{auc:.3f} [{low:.3f}, {high:.3f}]"


def groups_of(metrics: dict[str, float], split: str = "test") -> dict[str, list[str]]:
    """``{attribute: [group, ...]}`` of the subgroup metrics an evaluation recorded, in key order."""
    out: dict[str, list[str]] = {}
    for key in metrics:
        if key.startswith(f"{split}/subgroup/") and "/auc/" in key:
            group = MetricKey.parse(key).site
            attribute = group.split(".", 1)[0]
            if group not in out.setdefault(attribute, []):
                out[attribute].append(group)
    return {a: sorted(g) for a, g in out.items()}


def compose(src: Sources) -> tuple[Blocks, list]:
    """The card's blocks and the forest plot's rows."""
    name = registered_model_name(src.task)
    contract, training = src.contract, src.training
    params = training.data.params if training else {}
    diseases = list(contract.diseases) if contract else []
    metrics = src.evaluation.data.metrics if src.evaluation else {}
    b = Blocks()
    b.heading(f"Model card: {name} version {src.version}", 1)
    b.paragraph(champion_statement(src))
    b.heading("Intended use")
    b.paragraph(INTENDED_USE)
    if contract:
        b.bullets([f"Task {contract.task}; diseases (outputs, in order): {', '.join(diseases)}.",
                   f"Accepts modalities {', '.join(contract.allowed_modalities) or 'any'}; views "
                   f"{', '.join(contract.views) or 'any'}; body parts {', '.join(contract.body_parts or []) or 'the task default'}."])
    b.heading("Training federation")
    b.bullets(card_limits.federation_lines(src, params))
    b.heading("Algorithm")
    b.paragraph(f"**{params.get('algorithm', '?')}**, {params.get('rounds', '?')} rounds of {params.get('I', '?')} "
                f"local steps, learning rate {params.get('lr', '?')}, batch size {params.get('batch_size', '?')}, "
                f"network {contract.network if contract else params.get('network', '?')}"
                f"{', input ' + 'x'.join(map(str, contract.input_shape)) if contract else ''}.")
    b.heading("Performance")
    rows = []
    if src.evaluation is None:
        b.paragraph("Not evaluated since it was registered (`fedauc evaluate --model-version "
                    f"{src.version}`): the pooled figures below are its training's own.")
        metrics = training.data.metrics if training else {}
    else:
        b.paragraph(f"From evaluation run `{src.evaluation.info.run_name}` ({src.evaluation.info.run_id}), "
                    f"sites {src.evaluation.data.params.get('sites', '?').replace(',', ', ')}: test split, AUC with "
                    "its 95 % interval (DeLong from the sites' score histograms, widened by the binning bound).")
    b.table(["scope", *diseases], [["pooled test", *(fmt(_interval(metrics, "test/pooled", d)) for d in diseases)],
                                   ["pooled validation", *(fmt(_interval(metrics, "valid/pooled", d)) for d in diseases)]])
    groups = groups_of(metrics)
    for attribute in ("site", "sex", "age", "view", "manufacturer"):
        members = groups.get(attribute, [])
        if not members:
            continue
        b.heading(f"By {attribute}", 3)
        table = []
        for group in members:
            base = f"test/subgroup/{group}"
            values = {d: _interval(metrics, base, d) for d in diseases}
            table.append([group.split(".", 1)[1], *(fmt(values[d]) if values[d] else _why(src, base, d) for d in diseases),
                          ", ".join(f"{int(metrics.get(f'{base}/n_pos/{d}', 0))}/{int(metrics.get(f'{base}/n_neg/{d}', 0))}"
                                    for d in diseases)])
            rows.append((group, {d: v for d, v in values.items() if v}))
        b.table([attribute, *diseases, "positives/negatives"], table)
    if groups:
        b.heading("Gap between the best and the worst subgroup", 3)
        b.paragraph("Per attribute and disease, best minus worst AUC among the subgroups reported (unknown left "
                    "out), with the 95 % interval of that difference; chosen after looking, so read it as a "
                    "screen, not a test.")
        b.table(["attribute", *diseases], [[a, *(_gap(metrics, a, d) for d in diseases)] for a in groups if a != "site"]
                + ([["site", *(_gap(metrics, "site", d) for d in diseases)]] if "site" in groups else []))
    elif src.evaluation is not None:
        b.paragraph("No subgroup figures: the evaluation predates them, or was noised (subgroups withheld).")
    b.heading("Operating points")
    points = descriptions.operating_point_lines(contract.operating_points) if contract else ["Unknown."]
    b.paragraph(points[0])
    b.bullets([line.removeprefix("- ") for line in points[1:]])
    card_limits.calibration_and_ood(b, contract, metrics)
    b.heading("Limitations")
    b.bullets(card_limits.limitations(src, metrics, diseases, groups))
    b.heading("Provenance")
    b.bullets([f"Code version {contract.code_version if contract else '?'}.",
               f"Training run `{training.info.run_name}` ({training.info.run_id})." if training else
               "Training run: gone from the store.",
               f"Card built from version {src.version}'s tags and contract, that run, and "
               f"{'evaluation run ' + src.evaluation.info.run_id if src.evaluation else 'no evaluation'}."])
    return b, rows


def _why(src: Sources, base: str, disease: str) -> str:
    return "too small" if f"{base}/auc/{disease}" in src.suppressed else "n/a"


def _gap(metrics: dict, attribute: str, disease: str) -> str:
    gap = _interval(metrics, f"test/subgroup_gap/{attribute}", disease)
    if gap is None:
        return "n/a"
    aucs = {g: metrics[f"test/subgroup/{g}/auc/{disease}"] for g in groups_of(metrics).get(attribute, [])
            if not math.isnan(metrics.get(f"test/subgroup/{g}/auc_ci95_low/{disease}", math.nan))}
    best, worst = gap_pair(aucs) or ("?", "?")
    return f"{fmt(gap)} ({best.split('.', 1)[1]} vs {worst.split('.', 1)[1]})"


def champion_statement(src: Sources) -> str:
    """Whether the version is the champion and, if so, why: the rule and its margin over each rival scored on
    the same sites."""
    if src.champion != src.version:
        return (f"**Not the champion** (the champion is version {src.champion})." if src.champion else
                "**Not the champion**: no version holds the alias.")
    margins = []
    own_tags = {k: v for k, v in src.tags.items() if k.startswith(SCORE_TAG_PREFIX)}
    for key, value in own_tags.items():
        rivals = [(float(v.tags[key]), str(v.version)) for v in src.versions
                  if str(v.version) != src.version and key in v.tags and COLLAPSED_TAG not in v.tags]
        if rivals:
            best, rival = max(rivals)
            margins.append(f"{float(value):.3f} against version {rival}'s {best:.3f} (margin {float(value) - best:+.3f}) "
                           f"on evaluation {key.removeprefix(SCORE_TAG_PREFIX)}")
    why = ("; ".join(margins) if margins else
           f"no rival was scored on its sites (pooled validation macro AUC {src.tags.get(SELECTION_METRIC_TAG, '?')})")
    return f"**The champion.** {descriptions.CHAMPION_RULE} Pooled validation macro AUC {why}."


def forest_png(rows: list, diseases: list[str], metrics: dict, title: str) -> bytes:
    import matplotlib.pyplot as plt

    from pipelines import plots

    pooled = {d: metrics.get(f"test/pooled/auc/{d}", math.nan) for d in diseases}
    figure = plots.forest_figure(rows, diseases, pooled, title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def render(task: str, version: str) -> tuple[str, str, bytes | None]:
    """The card as (Markdown, HTML, forest plot PNG or None when there is nothing to plot)."""
    return _render(gather(task, version), task, version)


def _render(src: Sources, task: str, version: str) -> tuple[str, str, bytes | None]:
    blocks, rows = compose(src)
    png = None
    if rows:
        diseases = list(src.contract.diseases) if src.contract else []
        png = forest_png(rows, diseases, src.evaluation.data.metrics, f"{registered_model_name(task)} v{version}: "
                         "test AUC by site and subgroup")
        blocks.figure(card_paths(version)[2].rsplit("/", 1)[1], png, "AUC by site and subgroup, 95 % intervals")
    title = f"{registered_model_name(task)} v{version} model card"
    return to_markdown(blocks), to_html(blocks, title), png


def write_card(task: str, version: str) -> str | None:
    """Log the card on the version's training run and link it from the version's description; the training
    run's id (None where the run is gone: the description alone is rewritten)."""
    client = MlflowClient()
    src = gather(task, version)
    markdown, page, png = _render(src, task, version)
    training = src.training
    links = []
    if training is not None:
        md_path, html_path, png_path = card_paths(version)
        client.log_text(training.info.run_id, markdown, md_path)
        client.log_text(training.info.run_id, page, html_path)
        if png is not None:
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / Path(png_path).name).write_bytes(png)
                client.log_artifact(training.info.run_id, str(Path(tmp) / Path(png_path).name), CARD_FOLDER)
                (Path(tmp) / FOREST_ARTIFACT).write_bytes(png)  # beside the evaluation's ROC, which it is drawn from
                client.log_artifact(src.evaluation.info.run_id, str(Path(tmp) / FOREST_ARTIFACT))
        experiment = training.info.experiment_id
        links.append(f"[model card](#/experiments/{experiment}/runs/{training.info.run_id}/artifactPath/{html_path})")
        if src.evaluation is not None:
            links.append(f"[latest evaluation `{src.evaluation.info.run_name}`](#/experiments/{experiment}/runs/"
                         f"{src.evaluation.info.run_id})")
    base = (descriptions.version_description(src.contract, training.data.params.get("algorithm", "?") if training else "?",
                                             float(src.tags.get(SELECTION_METRIC_TAG, "nan")))
            if src.contract else "")
    status = champion_statement(src).split(" Pooled validation")[0] if src.champion == version else champion_statement(src)
    client.update_model_version(registered_model_name(task), version,
                                description="\n\n".join(p for p in (status, base, " · ".join(links)) if p))
    return training.info.run_id if training else None



def alias_moved(task: str, versions: list[str | None]) -> None:
    """After the champion alias may have moved: rewrite, for each of ``versions`` (the one just registered or
    evaluated, the champion before and after), its card, its version's description and its training run's
    description, so that only the champion says it is one."""
    champion = champion_version(task)
    for version in dict.fromkeys(v for v in versions if v is not None):
        run_id = write_card(task, version)
        if run_id is not None:
            descriptions.describe_training(run_id, version, version == champion, champion)

