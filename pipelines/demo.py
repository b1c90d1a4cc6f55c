"""The demo: synthetic hospitals in the real formats, onboarded, preprocessed, trained, logged, compared.

``fedauc demo`` / ``make demo`` run the ``demo`` flow with these defaults, sized for a 2-core CPU: about 340
CPU seconds and 3-3.5 minutes for a fresh run on an idle one (docs/performance.md, "The demo": where they
go, per phase and stage). A second run reuses
the generated data and the shards (nothing changed, nothing redone) and the trained models (Prefect's cache).

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
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import psutil
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

from pipelines import flows, tracking
from pipelines.tables import fold_intervals, markdown_table
from preprocessing.federation import load_federation
from preprocessing.synth import generate_federation

PROJECT_DIR = Path(__file__).resolve().parents[1]
CHEST = PROJECT_DIR / "sites" / "demo" / "chest.yaml"
MELANOMA = PROJECT_DIR / "sites" / "demo" / "melanoma.yaml"
DEMO_DATA = PROJECT_DIR / "demo_data"
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
# target (docs/performance.md); docs/claims.md compares it.
DEMO_TRAININGS = [
    ("fedxl2-I8", CHEST, "fedxl2", {}, {"lr": 0.3}),
    ("codasca-I8", CHEST, "codasca", {"T0": 160}, {"lr": 1.0}),
    ("fedavg-I8", CHEST, "fedavg", {}, {"lr": 0.3}),
    ("fedxl2-I8", MELANOMA, "fedxl2", {}, {"lr": 0.1}),
    ("codasca-I8", MELANOMA, "codasca", {"T0": 160}, {"lr": 0.3}),
    ("fedavg-I8", MELANOMA, "fedavg", {}, {"lr": 0.3}),
]
# The demo tables' columns besides the AUCs (macro and per disease, with their 95 % intervals).
SHOWN = ("run", "algorithm", "I", "rounds", "pAUC0.3 macro", "MB sent", "minutes")


def ensure_generated(federation_yaml: Path, scale: float, seed: int) -> bool:
    """Generate the federation's synthetic hospitals unless the same ones are already on disk.

    Regenerating would rewrite every image (new mtimes, new content hash, new shards), so a marker beside
    the data records what was generated. Returns True when it generated.
    """
    federation = load_federation(federation_yaml)
    wanted = {"spec": json.loads(federation.spec.model_dump_json()), "scale": scale, "seed": seed}
    marker = DEMO_DATA / f".generated-{federation.name}.json"
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return False
    generate_federation(federation_yaml, scale=scale, seed=seed)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(wanted, indent=2))
    return True


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its descendants: those still running (the training
    processes, Prefect's server) and those already waited for."""
    def used(process: psutil.Process) -> float:
        times = process.cpu_times()  # its own and its children's that it waited for
        return times.user + times.system + times.children_user + times.children_system

    me = psutil.Process()
    total = used(me)
    for child in me.children(recursive=True):
        with suppress(psutil.NoSuchProcess):
            total += used(child)
    return total


class Stopwatch:
    """Where the demo's time went: consecutive phases, whose wall seconds add up to the run's, with their CPU
    seconds (every process of the run) and, inside the overlapped phase, its stages with their wall seconds
    only (stages that overlap share the processes and the cores: no CPU figure is theirs alone). Each row
    says when it started and ended (seconds since the process started) and the machine's 1-minute load
    average when it ended. On a shared machine the wall seconds depend on the others' load; the CPU seconds
    much less so (CPU seconds / wall seconds: how many of the two cores a phase had)."""

    def __init__(self):
        self.origin = psutil.Process().create_time()
        self.rows: list[dict] = []

    def since_process_start(self, phase: str) -> None:
        """A phase that began when this process did (interpreter, imports, Prefect's server start-up)."""
        self.add(phase, self.origin, time.time() - self.origin, cpu_seconds(), phase=True)

    @contextmanager
    def phase(self, name: str):
        began, wall, cpu = time.time(), time.perf_counter(), cpu_seconds()
        yield
        self.add(name, began, time.perf_counter() - wall, cpu_seconds() - cpu, phase=True)

    @contextmanager
    def stage(self, name: str):
        began, wall = time.time(), time.perf_counter()
        yield
        self.add(name, began, time.perf_counter() - wall)

    def add(self, name: str, began: float, seconds: float, cpu: float | None = None, phase: bool = False) -> None:
        """``began``: epoch seconds (``time.time()``), comparable across the run's processes."""
        self.rows.append({"stage": f"**{name}**" if phase else name, "began": began, "seconds": seconds,
                          "CPU seconds": cpu, "load (1 min)": os.getloadavg()[0], "phase": phase})

    def markdown(self) -> str:
        # Each phase, then its stages (which start within it) in the order they started.
        frame = pd.DataFrame(sorted(self.rows, key=lambda row: (row["began"], not row["phase"])))
        frame.insert(1, "from s", frame.pop("began") - self.origin)
        frame.insert(2, "to s", frame["from s"] + frame["seconds"])
        phases = frame[frame.pop("phase")]
        total = {"stage": "**total**", "from s": 0.0, "to s": phases["to s"].max(), "seconds": phases["seconds"].sum(),
                 "CPU seconds": phases["CPU seconds"].sum(), "load (1 min)": os.getloadavg()[0]}
        return markdown_table(pd.concat([frame, pd.DataFrame([total])], ignore_index=True), ".1f")


def profile_markdown(rows: list[dict]) -> str:
    """The demo flow's profile (its Stopwatch rows) and, after its last phase, the flow's end up to now
    (Prefect closes the flow run: the training processes and the data thread end), as a Markdown table.
    What it leaves out is the interpreter's exit (Prefect's server stops; 2-3 s)."""
    watch = Stopwatch()
    watch.rows = list(rows)
    phases = [row for row in rows if row["phase"]]
    end = max(row["began"] + row["seconds"] for row in phases)
    watch.add("end of the flow run", end, time.time() - end, cpu_seconds() - sum(row["CPU seconds"] for row in phases),
              phase=True)
    return watch.markdown()


@dataclass(frozen=True, eq=False)  # identity: a training's params are dicts
class Job:
    """One unit of the demo's work: a federation's data (``training`` None: generate, onboard, preprocess)
    or one of its trainings (a ``DEMO_TRAININGS`` entry)."""

    federation: Path
    training: tuple | None = None

    @property
    def name(self) -> str:
        federation = load_federation(self.federation).name
        return f"data of {federation}" if self.training is None else f"train {self.training[0]} on {federation}"


def run_schedule(jobs: Sequence[Job], slots: int, submit: Callable, first_done: Callable,
                 finished: Callable[[Job, object], None]) -> None:
    """Run ``jobs``, each as soon as it can start: the federations' data one after the other in the list's
    order (each uses every core: two at once would only delay the first federation's trainings), a training
    once its federation's data job has finished and fewer than ``slots`` trainings run, in the list's order.
    ``submit(job)`` starts one and returns its future, ``first_done(futures)`` waits for one of them and
    returns it, ``finished(job, result)`` is called as each ends (a failed job raises here)."""
    prepared = {job.federation for job in jobs if job.training is None}
    orphans = sorted({str(job.federation) for job in jobs if job.federation not in prepared})
    if orphans:
        raise ValueError(f"trainings on federations without a data job: {', '.join(orphans)}")
    waiting, running, ready = list(jobs), {}, set()
    while waiting or running:
        # One training per free slot, in the list's order: submitted all at once, Prefect's process pool would
        # start them in whatever order its threads get to them, and the longest training could start last.
        training = sum(job.training is not None for job in running.values())
        preparing = training < len(running)
        data = [job for job in waiting if job.training is None][:0 if preparing else 1]
        trainable = [job for job in waiting if job.training is not None and job.federation in ready]
        for job in data + trainable[:slots - training]:
            waiting.remove(job)
            running[submit(job)] = job
        done = first_done(list(running))
        job = running.pop(done)
        result = done.result()
        if job.training is None:
            ready.add(job.federation)
        finished(job, result)


@task(name="demo-data", cache_policy=NO_CACHE)
def prepare_data(federation_yaml: str, shards: str, scale: float, seed: int) -> list[dict]:
    """Generate, onboard and preprocess one federation (beside the other federation's data and the first
    trainings); returns its stages' profile rows."""
    federation = load_federation(federation_yaml)
    watch = Stopwatch()
    with watch.stage(f"generate {federation.name}"):
        ensure_generated(Path(federation_yaml), scale, seed)
    with watch.stage(f"onboard {federation.name}"):
        for site in federation.sites:
            flows.onboard_site(str(site.source))
    with watch.stage(f"preprocess {federation.name}"):
        flows.preprocess_federation(federation_yaml, shards)
    return watch.rows


def _before_the_first_training() -> None:
    """Point the training processes at this process's Prefect server (without a ``PREFECT_API_URL`` each
    would start an ephemeral server of its own on the same database: seconds of CPU each, and lock waits) and
    create the MLflow experiments (two first uses at once, in two processes, would both create one)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        os.environ["PREFECT_API_URL"] = SubprocessASGIServer().api_url  # the ephemeral server this flow runs on
    tracking.configure()
    for federation_yaml in (CHEST, MELANOMA):
        tracking.experiment_id(load_federation(federation_yaml).task)


def _one_thread() -> None:
    """Training-process initializer: one intra-op thread (see the module docstring)."""
    import torch

    torch.set_num_threads(1)


def demo_table(task: str) -> str:
    """The experiment's trainings, best first, as the README shows them: AUC cells carry their 95 % interval,
    the per-disease pAUC columns are left to ``fedauc compare``."""
    table = tracking.compare_runs(task)
    bounds = [c for c in table.columns if c.endswith((" low", " high"))]
    shown = [c for c in table.columns if c in SHOWN or (c.startswith("AUC ") and c not in bounds)]
    return markdown_table(fold_intervals(table[shown + bounds]))


@flow(name="demo", task_runner=ProcessPoolTaskRunner(max_workers=PROCESSES, initializer=_one_thread))
def demo(scale: float = 1.0, seed: int = 0, rounds: int | None = None) -> dict[str, str | list[dict]]:
    """Generate, onboard, preprocess, train (FeDXL2, CODASCA and FedAvg on each task), evaluate the champions;
    returns ``{"tables": Markdown, "profile": rows}``, the comparison tables and where the time went
    (``profile_markdown`` shows it)."""
    watch = Stopwatch()
    watch.since_process_start("start-up (imports, Prefect server)")
    _one_thread()
    shards = str(DEMO_DATA / "shards")
    jobs = [Job(CHEST), Job(MELANOMA)] + [Job(training[1], training) for training in DEMO_TRAININGS]
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
                flows.training_artifact(result)
                watch.add(job.name, started[job], time.time() - started[job])
            print(f"{job.name}: {time.time() - started[job]:.0f} s", flush=True)

        run_schedule(jobs, PROCESSES, submit, lambda futures: next(as_completed(futures)), finished)
    tables = []
    with watch.phase("evaluate both champions, compare"):
        for federation_yaml in (CHEST, MELANOMA):
            task_name = load_federation(federation_yaml).task
            flows.evaluate(str(federation_yaml), shards)
            tables.append(f"## {task_name}\n\n" + demo_table(task_name))
    return {"tables": "\n".join(tables), "profile": watch.rows}
