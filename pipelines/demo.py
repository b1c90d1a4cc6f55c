"""The demo: synthetic hospitals in the real formats, onboarded, preprocessed, trained, logged, compared.

``fedauc demo`` / ``make demo`` run the ``demo`` flow with these defaults, sized for a 2-core CPU: about 400
CPU seconds for a fresh run (docs/performance.md, "The demo": where they go, per stage). A second run reuses
the generated data and the shards (nothing changed, nothing redone) and the trained models (Prefect's cache).

Both tasks train FedAvg (BCE) beside AUC methods. The trainings run two at a time in their own processes
(Prefect's process pool), each on one thread: on two cores this beats one training on two threads, whose
threads wait on each other at every operation, and by far when other work shares the cores.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import pandas as pd
import psutil
from prefect import flow
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner

from pipelines import flows, tracking
from pipelines.tables import fold_intervals, markdown_table
from preprocessing.federation import load_federation
from preprocessing.synth import generate_federation

PROJECT_DIR = Path(__file__).resolve().parents[1]
CHEST = PROJECT_DIR / "sites" / "demo" / "chest.yaml"
MELANOMA = PROJECT_DIR / "sites" / "demo" / "melanoma.yaml"
DEMO_DATA = PROJECT_DIR / "demo_data"
TRAINING_PROCESSES = 2

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
    """Wall and CPU seconds per stage of the demo, with the machine's 1-minute load average when each ended.
    On a shared machine the wall seconds depend on the others' load; the CPU seconds much less so (CPU
    seconds / wall seconds: how many of the two cores the stage had)."""

    def __init__(self):
        self.rows: list[dict] = []

    def since_process_start(self, stage: str) -> None:
        """A stage that began when this process did (interpreter, imports, Prefect's server start-up)."""
        self._add(stage, time.time() - psutil.Process().create_time(), cpu_seconds())

    @contextmanager
    def stage(self, name: str):
        wall, cpu = time.perf_counter(), cpu_seconds()
        yield
        self._add(name, time.perf_counter() - wall, cpu_seconds() - cpu)

    def _add(self, stage: str, seconds: float, cpu: float) -> None:
        self.rows.append({"stage": stage, "seconds": seconds, "CPU seconds": cpu, "load (1 min)": os.getloadavg()[0]})

    def markdown(self) -> str:
        frame = pd.DataFrame(self.rows)
        frame.insert(2, "share", frame["seconds"] / frame["seconds"].sum())
        total = {"stage": "total", "seconds": frame["seconds"].sum(), "share": 1.0,
                 "CPU seconds": frame["CPU seconds"].sum(), "load (1 min)": os.getloadavg()[0]}
        return markdown_table(pd.concat([frame, pd.DataFrame([total])], ignore_index=True), ".2f")


def _share_prefect_server() -> None:
    """Point the training processes at this process's Prefect server: without a ``PREFECT_API_URL`` each
    would start an ephemeral server of its own on the same database (seconds of CPU each, and lock waits)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        os.environ["PREFECT_API_URL"] = SubprocessASGIServer().api_url  # the ephemeral server this flow runs on


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


@flow(name="demo", task_runner=ProcessPoolTaskRunner(max_workers=TRAINING_PROCESSES, initializer=_one_thread))
def demo(scale: float = 1.0, seed: int = 0, rounds: int | None = None) -> dict[str, str]:
    """Generate, onboard, preprocess, train (FeDXL2, CODASCA and FedAvg on each task), evaluate the champions;
    returns ``{"tables": Markdown, "profile": Markdown}``, the comparison tables and the seconds each stage took."""
    watch = Stopwatch()
    watch.since_process_start("start-up (imports, Prefect server)")
    _one_thread()
    shards = DEMO_DATA / "shards"
    for federation_yaml in (CHEST, MELANOMA):
        name = load_federation(federation_yaml).name
        with watch.stage(f"generate {name}"):
            ensure_generated(federation_yaml, scale, seed)
        with watch.stage(f"onboard {name}"):
            for site in load_federation(federation_yaml).sites:
                flows.onboard_site(str(site.source))
        with watch.stage(f"preprocess {name}"):
            flows.preprocess_federation(str(federation_yaml), str(shards))
    with watch.stage(f"train ({len(DEMO_TRAININGS)} trainings, {TRAINING_PROCESSES} processes)"):
        _share_prefect_server()
        # Created here, before the processes start: two first uses at once would both create the experiment.
        tracking.configure()
        for federation_yaml in (CHEST, MELANOMA):
            tracking.experiment_id(load_federation(federation_yaml).task)
        waiting, running = list(DEMO_TRAININGS), {}
        while waiting or running:
            # One submission per free process, in the list's order: submitted all at once, the pool would start
            # them in whatever order its threads get to them, and the longest could start last.
            while waiting and len(running) < TRAINING_PROCESSES:
                run_name, federation_yaml, algorithm, params, overrides = waiting.pop(0)
                config = {**BASE_CONFIG, **overrides, "algorithm": algorithm, "params": params}
                if rounds is not None:
                    config["rounds"] = rounds
                future = flows.train_task.submit(str(federation_yaml), str(shards), config, run_name)
                running[future] = load_federation(federation_yaml).name
            done = next(as_completed(list(running)))
            summary = done.result()
            flows.training_artifact(summary)
            print(f"trained {summary['run_name']} on {running.pop(done)} in {summary['seconds']:.0f} s", flush=True)
    tables = []
    for federation_yaml in (CHEST, MELANOMA):
        task = load_federation(federation_yaml).task
        with watch.stage(f"evaluate {task} champion"):
            flows.evaluate(str(federation_yaml), str(shards))
        with watch.stage(f"compare {task}"):
            tables.append(f"## {task}\n\n" + demo_table(task))
    return {"tables": "\n".join(tables), "profile": watch.markdown()}
