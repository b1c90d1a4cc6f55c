"""The demo: synthetic hospitals in the real formats, onboarded, preprocessed, trained, logged, compared.

``fedauc demo`` / ``make demo`` run the ``demo`` flow with these defaults, sized for a 2-core CPU: about 340
CPU seconds and 3-3.5 minutes for a fresh run on an idle one (docs/performance.md, "The demo": where they
go, per phase and stage). A second run reuses
the generated data and the shards (nothing changed, nothing redone) and the trained models (Prefect's cache).
It runs in this machine's fedauc folder (``pipelines.store_uri.fedauc_home``: $FEDAUC_HOME, else the checkout),
which holds its site files, data, shards and stores: ``FEDAUC_HOME=/tmp/try fedauc demo --scale 0.1 --rounds 2``
runs a small one apart from the checkout (tests/test_demo_end_to_end.py runs it so).

Both tasks train FedAvg (BCE) beside AUC methods. Each piece of work starts as soon as it can
(``run_schedule``), so that both cores stay busy: the chest federation's data (generate, onboard,
preprocess: its renderers and decoders use both cores), then its trainings, longest first, while the
melanoma federation's data is made beside them, then melanoma's trainings. The trainings run two at a time
in their own processes (Prefect's process pool), each on one thread: on two cores two one-thread trainings
beat one training on two threads, whose threads wait on each other at every operation, and by far when
other work shares the cores.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

from pipelines import compare, flows, run_names, tracking
from pipelines.schedule import Job, Stopwatch, run_schedule
from pipelines.site_params import name_here, sites_env
from pipelines.store_uri import PROJECT_DIR, fedauc_home
from pipelines.tables import fold_intervals, markdown_table
from preprocessing.federation import load_federation
from preprocessing.synth import generate_federation, generate_site

# The demo federations as the checkout defines them; a demo in another fedauc folder runs copies of them there
# (``in_home``), whose relative roots then point into that folder's demo_data/.
DEMO_SITES = PROJECT_DIR / "sites" / "demo"
CHEST = DEMO_SITES / "chest.yaml"
MELANOMA = DEMO_SITES / "melanoma.yaml"
PROCESSES = 2

# What every demo training shares (a federated.TrainConfig without sites and algorithm).
BASE_CONFIG = {
    "network": "small_resnet",
    "rounds": 25,
    "local_steps": 8,
    "batch_size": 32,
    "seed": 0,
    "eval_every": 5,
    "guarantee_positives": True,
    "progress": False,  # two trainings at once would overwrite each other's bar; each prints a line when done
}

# (run name, federation, algorithm, algorithm params, overrides of BASE_CONFIG), longest first so that the two
# training processes finish together. Learning rates: each algorithm's best pooled validation macro-AUC on its
# task's demo federation (docs/sweeps.md, "Demo learning rates"; the test splits played no part). Both tasks
# train the same three: the AUC-margin and the partial-AUC method beside BCE FedAvg. LocalSCGDAM is not among
# them: even with its first-order Jacobian a round cost twice the others' and made the demo miss its time
# target (docs/performance.md); docs/claims.md compares it. CODASCA runs the schedule its lrs were chosen
# under (one decay at T0 = 160 of 200 iterations, lr / 3, weight decay 1e-5, restarting from the stage mean;
# docs/sweeps.md), spelled out so that a change of the algorithm's defaults (docs/algorithms.md section 12)
# does not change the demo.
DEMO_SCHEDULE = {"T0": 160, "lr_decay": 3.0, "weight_decay": 1e-5, "stage_restart": True}
DEMO_TRAININGS = [
    ("fedxl2-I8", CHEST, "fedxl2", {}, {"lr": 0.3}),
    ("codasca-I8", CHEST, "codasca", DEMO_SCHEDULE, {"lr": 1.0}),
    ("fedavg-I8", CHEST, "fedavg", {}, {"lr": 0.3}),
    ("fedxl2-I8", MELANOMA, "fedxl2", {}, {"lr": 0.1}),
    ("codasca-I8", MELANOMA, "codasca", DEMO_SCHEDULE, {"lr": 0.3}),
    ("fedavg-I8", MELANOMA, "fedavg", {}, {"lr": 0.3}),
]
# New studies the demo's champions score at the end, as a hospital would (`fedauc predict`): a few phantom
# images per task in a format each federation holds, drawn with a seed no hospital was generated with.
NEW_STUDIES = {"chest-xray": ("vindr-cxr", "hanoi"), "melanoma": ("siim-isic-2020", "vienna")}
NEW_STUDIES_PER_TASK, NEW_STUDIES_SEED = 4, 1001
# The demo tables' columns besides the AUCs (macro and per disease, with their 95 % intervals).
SHOWN = ("run", "algorithm", "I", "rounds", "pAUC0.3 macro", "MB sent", "minutes")


def demo_data() -> Path:
    return fedauc_home() / "demo_data"


def in_home(federation_yaml: Path) -> Path:
    """``federation_yaml`` (one of the checkout's demo federations) in the fedauc folder, its site files copied
    there when that folder is not the checkout."""
    home = fedauc_home()
    if home == PROJECT_DIR.resolve():
        return federation_yaml
    target = home / federation_yaml.relative_to(PROJECT_DIR)
    target.parent.mkdir(parents=True, exist_ok=True)
    for source in DEMO_SITES.glob("*.yaml"):
        if not (target.parent / source.name).is_file() or (target.parent / source.name).read_bytes() != source.read_bytes():
            shutil.copyfile(source, target.parent / source.name)
    return target


def ensure_generated(federation_yaml: Path, scale: float, seed: int) -> bool:
    """Generate the federation's synthetic hospitals unless the same ones are already on disk.

    Regenerating would rewrite every image (new mtimes, new content hash, new shards), so a marker beside
    the data records what was generated. Returns True when it generated.
    """
    federation = load_federation(federation_yaml)
    wanted = {"spec": json.loads(federation.spec.model_dump_json()), "scale": scale, "seed": seed}
    marker = demo_data() / f".generated-{federation.name}.json"
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return False
    generate_federation(federation_yaml, scale=scale, seed=seed)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(wanted, indent=2))
    return True


@task(name="demo-data", task_run_name=run_names.federation_data, cache_policy=NO_CACHE)
def prepare_data(federation_yaml: str, shards: str, scale: float, seed: int) -> list[dict]:
    """Generate, onboard and preprocess one federation (beside the other federation's data and the first
    trainings); returns its stages' profile rows."""
    federation = load_federation(federation_yaml)
    watch = Stopwatch()
    with watch.stage(f"generate {federation.name}"):
        ensure_generated(Path(federation_yaml), scale, seed)
    with watch.stage(f"onboard {federation.name}"):
        for site in federation.sites:
            flows.onboard_site(name_here(site.source))  # found in $FEDAUC_SITES, which ``demo`` set
    with watch.stage(f"preprocess {federation.name}"):
        flows.preprocess_federation(federation_yaml, shards)
    return watch.rows


def _before_the_first_training() -> None:
    """Create the MLflow experiments (two first uses at once, in two processes, would both create one)."""
    for federation_yaml in (CHEST, MELANOMA):
        tracking.experiment_id(load_federation(federation_yaml).task)


def _one_thread() -> None:
    """Training-process initializer: one intra-op thread (see the module docstring)."""
    import torch

    torch.set_num_threads(1)


def demo_table(task: str) -> str:
    """The experiment's trainings, best first, as the README shows them: AUC cells carry their 95 % interval,
    the per-disease pAUC columns are left to ``fedauc compare``."""
    table = compare.compare_runs(task)
    bounds = [c for c in table.columns if c.endswith((" low", " high"))]
    shown = [c for c in table.columns if c in SHOWN or (c.startswith("AUC ") and c not in bounds)]
    return markdown_table(fold_intervals(table[shown + bounds]))


def score_new_studies(task_name: str) -> str:
    """A few new phantom studies of ``task_name`` scored with its champion the way a hospital does (the table
    `fedauc predict` writes, in demo_data/new-studies/), as a Markdown table of probabilities and decisions."""
    import pandas as pd

    from pipelines.hospital import table
    from pipelines.model_package import loading
    from pipelines.model_package.predict import Item

    folder = demo_data() / "new-studies" / task_name
    fmt, profile = NEW_STUDIES[task_name]
    if not folder.is_dir():
        generate_site(fmt, folder, n=NEW_STUDIES_PER_TASK, seed=NEW_STUDIES_SEED, profile=profile, workers=0,
                      progress=False)
    images = [path for path in sorted(folder.rglob("*")) if path.suffix in (".dcm", ".dicom")]
    out = demo_data() / "new-studies" / f"{task_name}-scores.csv"
    with loading.scratch_folder() as scratch:
        scorer = loading.load_registered(None, task_name, Path(scratch))
        chosen = loading.choose_points(scorer, "youden", None)
        table.predict_to_table(scorer, (Item(str(p), str(folder.resolve())) for p in images), out, chosen,
                               workers=0)
    table = pd.read_csv(out, keep_default_na=False)
    shown = pd.DataFrame({"image": table["source"].map(lambda s: Path(s).name[:12]), "status": table["status"]})
    for disease in scorer.contract.diseases:
        shown[disease] = [f"{_probability(calibrated, p)} {'+' if d == 'True' else '-'}" if status == "scored" else ""
                          for p, calibrated, d, status in zip(table[f"p_{disease}"], table[f"calibrated_{disease}"],
                                                              table[disease].astype(str), table["status"])]
    return (f"Model {scorer.name} v{scorer.version}: calibrated probabilities (raw scores in the p_ columns; a raw "
            "score, marked raw, where the contract has no calibration), decisions (+/-) at the Youden point, both "
            f"from the pooled validation histograms; all columns in {out.relative_to(fedauc_home())}.\n\n"
            + markdown_table(shown))


def _probability(calibrated, raw) -> str:
    """The calibrated probability where the contract has one, else the raw score, said to be one: an AUC-trained
    network's raw scores at a rare disease's prevalence sit near 0 (the melanoma champion's new studies: 0.00006
    to 0.002), which two decimals showed as 0.00 for every study, and they are not probabilities."""
    if str(calibrated) in ("", "nan"):
        return f"raw {float(raw):.3f}"
    return f"{float(calibrated):.3f}"


@flow(name="demo", flow_run_name="demo scale {scale}", task_runner=ProcessPoolTaskRunner(max_workers=PROCESSES, initializer=_one_thread))
def demo(scale: float = 1.0, seed: int = 0, rounds: int | None = None) -> dict[str, str | list[dict]]:
    """Generate, onboard, preprocess, train (FeDXL2, CODASCA and FedAvg on each task), evaluate the champions;
    returns ``{"tables": Markdown, "profile": rows}``, the comparison tables and where the time went
    (``profile_markdown`` shows it)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    watch = Stopwatch()
    watch.since_process_start("start-up (imports, Prefect server)")
    _one_thread()
    shards = str(demo_data() / "shards")
    chest, melanoma = in_home(CHEST), in_home(MELANOMA)
    # What the data thread and the training processes read is set here, before either starts, and nowhere below
    # (one thread writing the environment while another reads it, or a process pool copies it, is a race):
    # $FEDAUC_SITES, the folder of both federations' site YAMLs (``in_home`` keeps them beside the federations),
    # for onboarding; this flow's Prefect server for the training processes (without a ``PREFECT_API_URL`` each
    # would start an ephemeral server of its own on the same database: seconds of CPU each, and lock waits);
    # MLflow's store.
    os.environ.update(sites_env(chest))
    if not PREFECT_API_URL.value():
        os.environ["PREFECT_API_URL"] = SubprocessASGIServer().api_url
    tracking.configure()
    trainings = [(name, in_home(federation), *rest) for name, federation, *rest in DEMO_TRAININGS]
    jobs = [Job(chest), Job(melanoma)] + [Job(training[1], training) for training in trainings]
    with (watch.phase(f"data and {len(DEMO_TRAININGS)} trainings, overlapped"),
          ThreadPoolTaskRunner(max_workers=1) as data_thread):
        started: dict[Job, float] = {}

        def submit(job: Job):
            if job.training is None:
                started[job] = time.time()
                return data_thread.submit(prepare_data, {"federation_yaml": str(job.federation), "shards": shards,
                                                         "scale": scale, "seed": seed})
            if all(other.training is None for other in started):  # not before: the data need neither
                _before_the_first_training()
            started[job] = time.time()
            run_name, federation_yaml, algorithm, params, overrides = job.training
            config = {**BASE_CONFIG, **overrides, "algorithm": algorithm, "params": params}
            if rounds is not None:
                config["rounds"] = rounds
            return flows.train_task.submit(str(federation_yaml), shards, config, run_name)

        def finished(job: Job, result) -> None:
            if job.training is None:
                watch.rows.extend(result)
            else:
                flows.training_artifact(result, load_federation(job.training[1]).task)
                watch.add(job.name, started[job], time.time() - started[job])
            print(f"{job.name}: {time.time() - started[job]:.0f} s", flush=True)

        run_schedule(jobs, PROCESSES, submit, lambda futures: next(as_completed(futures)), finished)
    tables = []
    with watch.phase("evaluate both champions, compare"):
        for federation_yaml in (chest, melanoma):
            task_name = load_federation(federation_yaml).task
            flows.evaluate(str(federation_yaml), shards)
            tables.append(f"## {task_name}\n\n" + demo_table(task_name))
    with watch.phase("score new studies with the champions"):
        for federation_yaml in (chest, melanoma):
            task_name = load_federation(federation_yaml).task
            tables.append(f"## {task_name}: new studies scored by the champion\n\n" + score_new_studies(task_name))
    return {"tables": "\n".join(tables), "profile": watch.rows}
