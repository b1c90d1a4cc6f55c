"""The demo's design, checked without running it: what it trains, how many positives its tests hold, and
the order its work runs in."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pytest

from pipelines.prefect_env import configure_prefect_env

configure_prefect_env()  # before pipelines.demo imports Prefect, which reads its settings at import

from federated.algorithms.fedavg import FedAvg  # noqa: E402
from federated.registry import get_algorithm  # noqa: E402
from pipelines.demo import CHEST, DEMO_TRAININGS, MELANOMA, _probability  # noqa: E402
from pipelines.schedule import Job, Stopwatch, profile_markdown, run_schedule  # noqa: E402
from preprocessing.federation import load_federation  # noqa: E402
from preprocessing.scan import scan_site  # noqa: E402
from preprocessing.synth import generate_federation  # noqa: E402


def test_both_tasks_train_fedavg_beside_an_auc_method():
    assert len({(name, yaml) for name, yaml, *_ in DEMO_TRAININGS}) == len(DEMO_TRAININGS)  # one run name each
    for federation in (CHEST, MELANOMA):
        algorithms = [get_algorithm(algorithm) for _, yaml, algorithm, _, _ in DEMO_TRAININGS if yaml == federation]
        assert get_algorithm("fedavg") in algorithms, federation.name
        # FedAvg and its relatives (FedProx, local SGD with momentum) minimise cross-entropy; the rest an AUC loss.
        assert any(not issubclass(algorithm, FedAvg) for algorithm in algorithms), federation.name


def test_codasca_trains_the_schedule_its_demo_lrs_were_chosen_under_whatever_the_defaults():
    """docs/sweeps.md "Demo learning rates": one decay at T0 = 160 by 3, weight decay 1e-5, restarting from
    the stage mean. The algorithm's defaults have moved since (docs/algorithms.md section 12); the demo must not."""
    for _, _, algorithm, params, _ in DEMO_TRAININGS:
        if algorithm == "codasca":
            p = get_algorithm(algorithm).Params(**params)
            assert (p.T0, p.lr_decay, p.weight_decay, p.stage_restart) == (160, 3.0, 1e-5, True)


def test_the_pooled_melanoma_test_holds_at_least_40_positives(tmp_path):
    # The labels and patients alone (no image): the splits are drawn by patient from these, as the demo's
    # preprocessing draws them.
    generated = generate_federation(MELANOMA, tmp_path, images=False, progress=False)
    positives = {"train": 0, "valid": 0, "test": 0}
    for site in load_federation(MELANOMA).sites:
        records = scan_site(site.model_copy(update={"root": generated[site.name].root})).records
        for split in positives:
            positives[split] += int(records.loc[records["split"] == split, "Melanoma"].sum())
    assert positives["test"] >= 40, positives
    assert positives["valid"] >= 10, positives  # the champion is picked on the pooled validation AUC


def _schedule(tmp_path, log: list, fail: Path | None = None):
    """Runs the demo's jobs through ``run_schedule`` on real threads: a data job writes its federation's
    marker, the second federation's only once a training has started (or after a minute: a scheduler that
    waits for every federation's data fails the test instead of hanging it); a training records whether its
    marker existed when it started, how many trainings were running then and whether a data job was. Returns
    the jobs, ``(job, result)`` in the order they finished, and whether the second data job saw a training."""
    lock, running, first_training, waited = threading.Lock(), {"data": 0, "training": 0}, threading.Event(), []
    jobs = [Job(CHEST), Job(MELANOMA)] + [Job(training[1], training) for training in DEMO_TRAININGS]

    def work(job: Job):
        marker = tmp_path / f"{job.federation.stem}.ready"
        kind = "data" if job.training is None else "training"
        with lock:
            running[kind] += 1
            log.append((job, marker.exists(), dict(running)))
        if job.training is None and job.federation == MELANOMA:
            waited.append(first_training.wait(timeout=60))
        if job.training is not None:
            first_training.set()
            time.sleep(0.01)  # so that trainings overlap
        with lock:
            running[kind] -= 1
        if job.federation == fail and job.training is None:
            raise OSError(f"disk full while preprocessing {job.federation.stem}")
        if job.training is None:
            marker.touch()
        return kind

    finished = []
    with ThreadPoolExecutor(max_workers=len(jobs)) as executor:
        run_schedule(jobs, 2, lambda job: executor.submit(work, job),
                     lambda futures: next(as_completed(futures)), lambda job, result: finished.append((job, result)))
    return jobs, finished, waited


def test_trainings_start_after_their_federations_data_two_at_a_time_longest_first(tmp_path):
    log = []
    jobs, finished, waited = _schedule(tmp_path, log)
    assert sorted(map(id, (job for job, _ in finished))) == sorted(map(id, jobs))  # every job ran, once
    trainings = [(job, ready, running) for job, ready, running in log if job.training is not None]
    assert all(ready for _, ready, _ in trainings)  # no training before its federation's shards
    assert max(running["training"] for _, _, running in trainings) <= 2
    assert max(running["data"] for _, _, running in log) == 1  # one federation's data at a time, chest first
    assert [job.federation for job, _, _ in log if job.training is None] == [CHEST, MELANOMA]
    assert waited == [True]  # the chest trainings did not wait for melanoma's data
    for federation in (CHEST, MELANOMA):  # each federation's trainings start in the list's (longest-first) order
        started = [job.training for job, _, _ in trainings if job.federation == federation]
        assert started == [training for training in DEMO_TRAININGS if training[1] == federation]


def test_a_failed_data_job_stops_the_demo_before_its_trainings(tmp_path):
    log = []
    with pytest.raises(OSError, match="disk full while preprocessing chest"):
        _schedule(tmp_path, log, fail=CHEST)
    assert [job.training for job, _, _ in log if job.federation == CHEST] == [None]


def test_a_training_without_its_federations_data_job_is_refused():
    with pytest.raises(ValueError, match="without a data job"):
        run_schedule([Job(CHEST), Job(MELANOMA, DEMO_TRAININGS[3])], 2, None, None, None)


def test_the_profile_phases_add_up_to_the_total_and_list_their_stages_in_start_order():
    watch = Stopwatch()
    watch.since_process_start("start-up")
    with watch.phase("overlapped"):
        began = time.time()
        with watch.stage("first"):
            pass
        watch.add("second", began, time.time() - began)  # started before "first", reported after it
    with watch.phase("evaluate"):
        pass
    rows = [line.split(" | ") for line in profile_markdown(watch.rows).splitlines()[2:]]
    names = [row[0].removeprefix("| ") for row in rows]
    assert names == ["**start-up**", "**overlapped**", "second", "first", "**evaluate**", "**end of the flow run**",
                     "**total**"]
    phases = [float(row[3]) for name, row in zip(names, rows) if name.startswith("**") and name != "**total**"]
    total = rows[-1]
    assert float(total[3]) == pytest.approx(sum(phases), abs=0.2)  # the table rounds each to 0.1 s
    assert float(total[2]) == pytest.approx(float(total[3]), abs=0.1)  # phases are consecutive: no gap, no overlap


def test_prefect_logs_at_the_products_level():
    """Prefect set up before configure_prefect_env() logged at INFO, and its "Stopping temporary server" line
    at exit went to pytest's captured stderr, closed by then: a `--- Logging error ---` at the end of `make test`."""
    import logging

    assert logging.getLogger("prefect").getEffectiveLevel() == logging.WARNING


def test_the_new_studies_table_shows_a_raw_score_as_one():
    """The calibrated probability to three decimals (the melanoma champion's raw scores all read 0.00 at two); where
    a contract has no calibration (an empty or NaN column), the raw score, never shown as a probability."""
    assert _probability(0.0042, 5.7e-05) == "0.004"
    assert _probability("", 0.11300522) == "raw 0.113" and _probability(float("nan"), 0.11300522) == "raw 0.113"
