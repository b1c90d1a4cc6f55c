"""The demo's work run as soon as it can, and where its time went: the scheduler and the profiler of the
``demo`` flow (``pipelines/demo.py``), apart from Prefect so that they are tested on plain threads."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import psutil

from pipelines.tables import markdown_table
from preprocessing.federation import load_federation


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
        cpu = cpu_seconds()  # first: the walk over the process tree takes time, which must fall inside the phase
        self.add(phase, self.origin, time.time() - self.origin, cpu, phase=True)

    @contextmanager
    def phase(self, name: str):
        began, wall, cpu = time.time(), time.perf_counter(), cpu_seconds()
        yield
        # CPU seconds before the wall clock: the process-tree walk then counts in this phase, not in a gap
        # before the next one (phases are consecutive).
        cpu = cpu_seconds() - cpu
        self.add(name, began, time.perf_counter() - wall, cpu, phase=True)

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
