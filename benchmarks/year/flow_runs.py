"""A year of a centre's Prefect flow runs through Prefect's own API (python -m benchmarks.year): per day, each
site's PACS scoring every 15 minutes, the nightly evaluation and, once a week, the training, each run taken
through the states a worker takes it through (scheduled, pending, running, completed) with the log lines a
run writes. The server is one started for the benchmark (``prefect server start`` on its own database)."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

PACS_RUNS_PER_DAY = 96  # infra/prefect.yaml: pacs-scoring-<site> every 900 s
LOG_LINES = 4  # what a PACS run logs: the model and point, the counts line, the drift warnings or none, the end
CONCURRENCY = 1  # one writer: the SQLite-backed server answers 503 to concurrent writes ("database is locked")


def runs_in(sites: int, days: int) -> int:
    """The flow runs of ``days`` days: each site's PACS runs, a nightly evaluation, a weekly training."""
    return days * (sites * PACS_RUNS_PER_DAY + 1) + -(-days // 7)


async def _one_run(client, flow_id, deployment_id, name: str, when: dt.datetime, semaphore) -> None:
    from prefect.client.schemas.actions import LogCreate
    from prefect.states import Completed, Pending, Running, Scheduled

    async with semaphore:
        run = await client.create_flow_run_from_deployment(deployment_id, name=name,
                                                           state=Scheduled(scheduled_time=when))
        for state in (Pending(), Running(), Completed()):
            await client.set_flow_run_state(run.id, state, force=True)
        await client.create_logs([LogCreate(name="prefect.flow_runs", level=20, message=f"{name}: line {i}",
                                            timestamp=when, flow_run_id=run.id) for i in range(LOG_LINES)])


async def _deployments(client, sites: list[str]) -> dict[str, tuple]:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    out = {}
    for flow_name, deployment, pool in ([("score_pacs", f"pacs-scoring-{s}", f"site-{s}") for s in sites]
                                        + [("evaluate", "evaluate-chest-champion", "fedauc-central"),
                                           ("train_federated", "consortium-chest-codasca", "fedauc-central")]):
        try:
            await client.read_work_pool(pool)
        except ObjectNotFound:  # not there yet
            await client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        flow_id = await client.create_flow_from_name(flow_name)
        out[deployment] = (flow_id, await client.create_deployment(flow_id, deployment, work_pool_name=pool,
                                                                   entrypoint=f"pipelines/flows.py:{flow_name}"))
    return out


async def _write_days(sites: list[str], days: list[dt.date], limit: int | None) -> int:
    from prefect import get_client

    semaphore = asyncio.Semaphore(CONCURRENCY)
    count = 0
    async with get_client() as client:
        deployments = await _deployments(client, sites)
        for day in days:
            start = dt.datetime.combine(day, dt.time(), dt.timezone.utc)
            jobs = [(f"pacs-scoring-{s}", start + dt.timedelta(minutes=15 * i))
                    for s in sites for i in range(PACS_RUNS_PER_DAY)]
            jobs.append(("evaluate-chest-champion", start + dt.timedelta(hours=4)))
            if day.weekday() == 6:
                jobs.append(("consortium-chest-codasca", start + dt.timedelta(hours=2, minutes=30)))
            jobs = jobs[-limit:] if limit else jobs  # a sample: the day's last runs (the evaluation among them)
            await asyncio.gather(*(_one_run(client, *deployments[d], f"{d}-{uuid.uuid4().hex[:8]}", when, semaphore)
                                   for d, when in jobs))
            count += len(jobs)
    return count


def write_days(sites: list[str], days: list[dt.date], limit: int | None = None) -> int:
    """Flow runs of ``days`` on the server PREFECT_API_URL names (each day's last ``limit`` only, with
    ``limit``); how many were written."""
    return asyncio.run(_write_days(sites, days, limit))
