"""The run schema: what a training reports each round, how its metrics are keyed, and the names MLflow records
them under. One module, so the engine, the live feed from NVIDIA FLARE, the MLflow loggers, the champion and
the tables read one definition (pipelines/README.md says which module writes which record).

Metric keys (federated/evaluation.py writes them) are ``<split>/<scope>/<metric>`` with ``scope`` one of
``pooled``, ``macro_over_sites`` or ``site/<site>``, and ``<metric>`` e.g. ``auc_macro`` or ``auc/<disease>``:
:class:`MetricKey` parses and formats them, so no caller splits strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

# --- the round record ------------------------------------------------------------------------------------


class RoundRecord(TypedDict, total=False):
    """One round as the engine reports it to its callbacks (and FLARE's site 0 to the centre, as it ends)."""

    round: int
    iteration: int
    bytes_sent: list[int]  # per site, this round (evaluation exchange included)
    bytes_received: list[int]
    train_loss: float  # mean over sites of each site's mean local loss
    seconds: float
    lr: float
    site_losses: list[float]  # federated/health.py; NaN under differential privacy (the sites withhold them)
    update_norm: dict[str, list[float]]  # per group, per site
    update_norm_rel: dict[str, list[float]]
    outliers: list[dict]
    loss_reference: list[float]
    site_compute_s: list[float]  # per site: its local steps' seconds this round (federated/timing.py)
    site_wait_s: list[float]  # per site: the rest of its round up to the per-site gather
    site_compute_cpu_s: list[float]  # per site: its local steps' CPU seconds (their thread's)
    site_process_cpu_s: list[float]  # per site: its process's CPU seconds from the round's start to the gather
    slowest: dict  # {"site", "compute_s", "held_up_s"}: the site the round waited for, and how long
    metrics: dict[str, float]  # on evaluation rounds: keys as MetricKey
    suppressed: dict  # small-count suppression (federated/evaluation.py)


# What a record says of time, not of the computation: two runs of one training agree on everything else.
TIMING_KEYS = ("seconds", "site_compute_s", "site_wait_s", "site_compute_cpu_s", "site_process_cpu_s", "slowest")
# The MLflow metrics logged from them (pipelines/runs.py RoundLogger).
TIMING_METRICS = ("round_seconds", "slowest_site_held_up_seconds", "compute_seconds", "wait_seconds")


# --- metric keys -----------------------------------------------------------------------------------------

POOLED, MACRO_OVER_SITES, SITE = "pooled", "macro_over_sites", "site"
SUBGROUP, SUBGROUP_GAP = "subgroup", "subgroup_gap"  # an evaluation job's (federated/subgroups.py)
NAMED_SCOPES = (SITE, SUBGROUP, SUBGROUP_GAP)  # a scope followed by a name: the site, group or attribute
SELECTION_METRIC = "valid/pooled/auc_macro"  # what the champion is chosen by
HEADLINE_METRIC = "test/pooled/auc_macro"  # what a training's summary leads with
# The bounds of its 95 % interval (federated/evaluation.py pooled_auc_intervals), as a run's metrics.
HEADLINE_INTERVAL = ("test/pooled/auc_ci95_low_macro", "test/pooled/auc_ci95_high_macro")


@dataclass(frozen=True)
class MetricKey:
    split: str  # valid | test
    scope: str  # pooled | macro_over_sites | site | subgroup | subgroup_gap
    metric: str  # auc_macro, auc/<disease>, pauc_fpr0.3_mcclish/<disease>, ...
    # With scope "site": the site's name (or index in an engine's record); "subgroup": the group
    # (``<attribute>.<value>``, federated/subgroups.py); "subgroup_gap": the attribute.
    site: str | None = None

    @classmethod
    def parse(cls, key: str) -> MetricKey:
        split, scope, rest = key.split("/", 2)
        if scope in NAMED_SCOPES:
            site, metric = rest.split("/", 1)
            return cls(split, scope, metric, site)
        return cls(split, scope, rest)

    @property
    def scope_name(self) -> str:
        """``pooled``, ``macro_over_sites``, ``site/<site>``, ``subgroup/<group>`` or ``subgroup_gap/<attribute>``:
        a table's row label."""
        return f"{self.scope}/{self.site}" if self.scope in NAMED_SCOPES else self.scope

    def __str__(self) -> str:
        return f"{self.split}/{self.scope_name}/{self.metric}"


# Under differential privacy, on each site's run: what the training spent of the site's budget (federated/privacy),
# logged as ``privacy/<name>``; epsilon_remaining only where the site has a budget.
PRIVACY_PREFIX = "privacy/"
PRIVACY_METRICS = ("epsilon_job", "epsilon_spent", "epsilon_remaining", "delta", "budget_epsilon")
PRIVACY_BUDGET_CHANGE_TAG = "privacy.budget_change"  # the site ledger's last budget change, one line


# --- MLflow tags -----------------------------------------------------------------------------------------

ROLE_TAG = "fedauc_role"  # what a run is:
TRAINING_ROLE, SITE_ROLE, EVALUATION_ROLE, SCORING_ROLE = "federated-training", "site", "evaluation", "hospital-scoring"
FEDERATION_TAG, SITE_TAG, PURPOSE_TAG = "federation", "site", "purpose"
MODEL_URI_TAG, MODEL_VERSION_TAG = "model_uri", "model_version"
CHAMPION_ALIAS = "champion"
# The model-version tag with the pooled valid macro AUC its training measured; written when a version is registered.
SELECTION_METRIC_TAG = "pooled_valid_macro_auc"
# Set on a version whenever it takes the champion alias: the versions that are or were champion, whose latest
# evaluation (their model card's evidence) `fedauc prune` keeps for ever (pipelines/retention.py).
WAS_CHAMPION_TAG = "was_champion"
# A registered version whose scores were constant on a split (a training that ran to the end but learnt
# nothing): recorded, never champion.
COLLAPSED_TAG = "collapsed"
# What that was measured on: the fingerprint of the sites and their shards (pipelines.evaluations.fingerprint).
SELECTION_EVALUATION_TAG = "selection_evaluation"
# "pooled_valid_macro_auc.<fingerprint>": a version's pooled valid macro AUC on that evaluation, what the champion
# comparison reads: its training's own, or a champion's re-evaluation on another federation's sites.
SCORE_TAG_PREFIX = SELECTION_METRIC_TAG + "."
# The process that owns a run: host name, pid and the process's start time (a pid alone can be reused).
OWNER_HOST_TAG, OWNER_PID_TAG, OWNER_STARTED_TAG = "fedauc.owner.host", "fedauc.owner.pid", "fedauc.owner.started"
END_REASON_TAG = "fedauc.end_reason"
FAILURE_TAG = "failure_reason"  # why a training failed: its error (site, round, what, fix)
FAILED_SITE_TAG = "fedauc.failed_site"
CONTINUES_TAG = "fedauc.continues"  # a resumed training: the ids of the unfinished runs it continues
DESCRIPTION_TAG = "mlflow.note.content"  # the run's description in the MLflow UI


def registered_model_name(task: str) -> str:
    return f"fedauc-{task}"


# --- MLflow names the pipelines write (tests/test_docs.py: no MLflow name is written outside this module) -----
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own: a site's run under its training's
EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
CONFIG_ARTIFACT = "config.json"  # a training's whole TrainConfig as recorded
SUPPRESSED_ARTIFACT = "suppressed_metrics.json"  # why a metric is absent: suppressed at its site
UNDEFINED_ARTIFACT = "undefined_metrics.json"  # why a metric is NaN: undefined on the data
ROC_ARTIFACT = "roc_test_pooled.png"  # the pooled test ROC curves
# The reliability diagram before and after calibration, an artifact of the training run that registers the model.
RELIABILITY_ARTIFACT = "reliability_valid_pooled.png"
RELIABILITY_TEST_ARTIFACT = "reliability_test_pooled.png"  # an evaluation's: the registered map on the test split
# A training's params beside its TrainConfig's fields (pipelines/runs.py): the algorithm's parameters with their
# defaults resolved (``algo.<name>``), the federation, its task and sites, K and I, the code; and each site's
# shard hash (``shard_hash.<site>``), which an evaluation's run carries too.
ALGORITHM_PARAM_PREFIX, SHARD_HASH_PARAM_PREFIX = "algo.", "shard_hash."
FEDERATION_PARAM, TASK_PARAM, SITES_PARAM, K_PARAM, I_PARAM = "federation", "task", "sites", "K", "I"
CODE_VERSION_PARAM = "code_version"
# An evaluation's run (pipelines/evaluations.py): whether the version scored was the champion then, the
# evaluation's fingerprint, and for a noised one its noise multiplier and what it spent at each site
# (``privacy.<site>.<quantity>``).
CHAMPION_AT_EVALUATION_TAG = "champion_at_evaluation"
EVALUATION_PARAM, EVAL_NOISE_PARAM, EVAL_PRIVACY_PARAM_PREFIX = "evaluation", "eval_noise_multiplier", "privacy."
QC_FOLDER, QC_SUMMARY_JSON, QC_SUMMARY_MD = "qc", "summary.json", "summary.md"  # a site's QC summary as it sent it
# A champion's re-check at a training's end (pipelines/champion.py): the version it re-scored, why it was not
# (skipped), the evaluation noise it ran with, and its score (a metric, beside the new model's own).
CHAMPION_CHECK_VERSION_TAG, CHAMPION_CHECK_SKIPPED_TAG = "champion_check.version", "champion_check.skipped"
CHAMPION_CHECK_NOISE_TAG = "champion_check.eval_noise_multiplier"
CHAMPION_CHECK_METRIC, REGISTERED_MODEL_METRIC = f"champion_check/{SELECTION_METRIC}", f"registered_model/{SELECTION_METRIC}"
# A day of PACS scoring (pipelines/hospital/drift.py): what left the hospital, and a drift above the warning line.
SCORING_AGGREGATES_ARTIFACT = "scoring_aggregates.json"
DAY_TAG, MODEL_TAG = "day", "model"  # the day scored and the registered model (beside SITE_TAG, MODEL_VERSION_TAG)
# The day's released counts (images scored, refused per reason: ``refused/<reason>``) and each disease's
# population stability index (``psi/<disease>``).
SCORED_METRIC, REFUSED_METRIC_PREFIX, PSI_METRIC_PREFIX = "scored", "refused/", "psi/"
DRIFT_WARNING_TAG = "drift_warning"


def drift_figure_name(site: str) -> str:
    return f"drift_{site}.png"
