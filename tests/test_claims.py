"""The claims benchmark (``python -m benchmarks.claims`` and its modules): its verdict rule on constructed numbers,
and its whole path (phantom clinics generated and preprocessed, every claim trained, the doc and plots written) on a tiny
setting, the long-budget mode of claim (b) and the stagewise-defaults measurement included."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from benchmarks.claims import __main__ as claims
from benchmarks.claims import long as long_budget
from benchmarks.claims import runs, stats
from benchmarks.claims import stagewise as stagewise_defaults


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One cache for the module's runs: the tiny pool of phantoms is generated and preprocessed once."""
    return tmp_path_factory.mktemp("claims-work")


def test_interval_is_the_t_interval_over_seeds():
    mean, low, high = stats.interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    # t(0.975, 2) = 4.3027, sd 1, n 3
    assert high - mean == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert mean - low == pytest.approx(high - mean)
    assert math.isnan(stats.interval([0.5])[1])


@pytest.mark.parametrize(("differences", "margin", "expected"), [
    ([0.020, 0.030, 0.025, 0.020, 0.030], 0.0, "reproduced"),         # interval above 0
    ([-0.020, -0.030, -0.025, -0.020, -0.030], 0.0, "not reproduced"),  # interval below 0: the opposite shown
    ([0.030, -0.020, 0.010, -0.010, 0.000], 0.0, "inconclusive"),      # interval contains 0
    ([-0.004, -0.005, -0.006, -0.005, -0.005], 0.01, "reproduced"),     # worse, but within the non-inferiority margin
    ([-0.004, -0.005, -0.006, -0.005, -0.005], 0.0, "not reproduced"),  # the same numbers claimed as superiority
    ([-0.030, -0.040, -0.035, -0.030, -0.040], 0.01, "not reproduced"),  # worse than the margin
    ([0.5], 0.0, "inconclusive"),                                       # one seed: no interval
])
def test_verdict_follows_the_interval_of_the_paired_difference(differences, margin, expected):
    assert stats.verdict(differences, margin) == expected


def test_write_doc_replaces_only_the_text_between_the_markers(tmp_path):
    doc = tmp_path / "result.md"
    begin, end = runs.markers("full")
    other = "\n".join(runs.markers("long"))
    doc.write_text(f"# Title\n\nwritten by hand\n\n{begin}\nold numbers\n{end}\n\nafter\n{other}\n")
    runs.write_doc(doc, "new numbers", "full")
    text = doc.read_text()
    assert "written by hand" in text and "after" in text and "new numbers" in text and "old numbers" not in text
    assert text.endswith(f"{other}\n")  # another run's block is left alone
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        runs.write_doc(doc, "x", "full")


def test_the_quick_path_runs_every_claim_on_a_tiny_setting_and_a_rerun_reuses_the_runs(tmp_path, work):
    tiny = runs.Setting(pool=150, n_train=40, iterations=8, local_steps=4, periods=(1, 4), rates=(0.01, 0.2),
                          lr_grid=(0.3,), seeds=(0, 1), eval_points=2)
    doc = tmp_path / "docs" / "result.md"
    verdicts = claims.run_claims(tiny, work, doc, list(claims.CLAIMS), "tiny")
    assert set(verdicts) == set(claims.CLAIMS)
    allowed = {"reproduced", "not reproduced", "inconclusive"}
    assert all(v in allowed for checks in verdicts.values() for v in checks.values())
    checks = [check for claim in verdicts.values() for check in claim]
    assert len(checks) == len(set(checks))  # each check belongs to one claim
    text = doc.read_text()
    for title, _ in claims.CLAIMS.values():
        assert f"#### {title}" in text
    for png in ("claims_tiny_period.png", "claims_tiny_rate.png", "claims_tiny_rounds.png"):
        assert (doc.parent / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{png}]({png})" in text
    stored = work / "runs-tiny.jsonl"
    records = [json.loads(line) for line in stored.read_text().splitlines()]
    assert all(0.0 <= r["auc"] <= 1.0 for r in records)
    # Claim (c)'s curves: evaluations along the run, at increasing iterations.
    curves = [r["curve"] for r in records if r["algorithm"] == "localscgdam"]
    assert curves and all(len(c) == 2 and c[0][0] < c[1][0] == tiny.iterations for c in curves)
    # Warm-up runs number their iterations across both phases.
    assert any(r["warmup_rounds"] and r["curve"][-1][0] == tiny.iterations for r in records)
    assert claims.run_claims(tiny, work, doc, list(claims.CLAIMS), "tiny") == verdicts
    assert len(stored.read_text().splitlines()) == len(records)  # nothing retrained


def test_the_command_line_sets_the_regime_and_the_clinics_mean_score(tmp_path, work):
    doc = tmp_path / "result.md"
    assert claims.main(["--quick", "--pool", "150", "--rows-per-site", "40", "--iterations", "8", "--lr-grid", "0.3",
                        "--seeds", "2", "--rates", "0.2", "--claims", "b", "--score", "macro_over_sites",
                        "--name", "cli", "--work", str(work), "--doc", str(doc)]) == 0
    records = [json.loads(line) for line in (work / "runs-cli.jsonl").read_text().splitlines()]
    assert {r["lr"] for r in records} == {0.3} and {tuple(r["rates"]) for r in records} == {(0.2, 0.2, 0.2)}
    assert all(r["setting"][:4] == [150, 32, 40, 8] and r["score"] == "macro_over_sites" for r in records)
    assert all(r["auc"] == r["auc_sites"] for r in records)
    assert any(r["auc_sites"] != r["auc_pooled"] for r in records)  # the two scores are different numbers
    text = doc.read_text()
    assert "3 sites x 40 training rows" in text and "clinics' mean test AUC" in text


def test_validation_seeds_score_on_the_valid_splits_and_reported_seeds_on_the_test_splits():
    rng = np.random.default_rng(0)

    def split(n, value):
        return np.full((n, 4, 4, 3), value, np.uint8), (rng.random(n) < 0.5).astype(np.float32)

    pool = runs.Pool({p: {"train": split(30, 0), "valid": split(5, 1), "test": split(7, 2)} for p, _ in runs.CLINICS})
    for seed, n, value in ((0, 7, 2), (4, 7, 2), (runs.VALIDATION_SEED, 5, 1), (runs.VALIDATION_SEED + 2, 5, 1)):
        site = runs.federation(pool, (0.2,) * 3, 10, seed)[0]
        assert len(site.test[0]) == n and int(site.test[0].max()) == value


def test_the_long_budget_mode_chooses_lrs_on_validation_seeds_and_writes_curves_and_verdicts(tmp_path, work):
    tiny = runs.Setting(pool=150, n_train=40, iterations=8, local_steps=4, rates=(0.02,), seeds=(0, 1), eval_points=2,
                        score="macro_over_sites")
    doc = tmp_path / "docs" / "result.md"
    verdicts = long_budget.run_long(tiny, 4, (100, 101), work, doc)
    assert set(verdicts.values()) <= {"reproduced", "not reproduced", "inconclusive"} and len(verdicts) == 4
    assert "CODASCA (AUC-M) stagewise vs one stage, T = 8" in verdicts
    records = [json.loads(line) for line in (work / "runs-long-b.jsonl").read_text().splitlines()]
    validation = [r for r in records if r["seed"] >= 100]
    reported = [r for r in records if r["seed"] < 100]
    # Every candidate lr of every method on every validation seed, at the shorter validation budget.
    assert len(validation) == sum(map(len, long_budget.CANDIDATES.values())) * 2
    assert {r["setting"][3] for r in validation} == {4} and {r["setting"][3] for r in reported} == {8}
    assert len(reported) == len(long_budget.METHODS) * 2 and all(len(r["curve"]) == 2 for r in reported)
    # CODASCA trains its defaults, spelled out so that the cached runs' keys say what was trained, beside its
    # former one-stage defaults.
    from federated.algorithms.codasca import CODASCAParams
    assert {json.dumps(r["params"], sort_keys=True) for r in records if r["algorithm"] == "codasca"} == {
        json.dumps(p, sort_keys=True) for p in (stagewise_defaults.NEW, stagewise_defaults.OLD)}
    assert CODASCAParams(**stagewise_defaults.NEW) == CODASCAParams()
    for name, (alg, params) in long_budget.METHODS.items():
        chosen = {r["lr"] for r in reported if r["algorithm"] == alg and r["params"] == params}
        assert len(chosen) == 1 and chosen <= set(long_budget.CANDIDATES[name])
    text = doc.read_text()
    assert "2 of 2 seeds finished" in text and "**" in text and "t = 8" in text
    png = "claims_long-b_curves.png"
    assert (doc.parent / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"![{png}]({png})" in text
    assert long_budget.run_long(tiny, 4, (100, 101), work, doc) == verdicts  # all reused
    assert len((work / "runs-long-b.jsonl").read_text().splitlines()) == len(records)
    # A stopped run: FeDXL2's seed 1 and everything of seed 2 missing; the tables keep what is paired.
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "pool-n150-px32-p0.3.npz").symlink_to(work / "pool-n150-px32-p0.3.npz")
    (stopped / "runs-long-b.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in records if not (r["algorithm"] == "fedxl2" and r["seed"] == 1)))
    three = dataclasses.replace(tiny, seeds=(0, 1, 2))
    long_budget.run_long(three, 4, (100, 101), stopped, doc, from_cache=True)
    assert len((stopped / "runs-long-b.jsonl").read_text().splitlines()) == len(records) - 1  # nothing trained
    text = doc.read_text()
    assert "2 of 3 seeds finished" in text
    assert [line.split(" | ")[2] for line in text.splitlines() if line.startswith("| FeDXL2") and "**" in line] == ["1"]


def test_the_stagewise_defaults_measurement_pairs_both_schedules_at_every_lr_and_budget(tmp_path, work):
    tiny = runs.Setting(pool=150, n_train=40, iterations=8, local_steps=4, seeds=(0, 1), eval_points=2,
                        score="macro_over_sites")
    pool = runs.build_pool(work, tiny)
    runners = [runs.Runner(pool, dataclasses.replace(tiny, iterations=T), tmp_path / "runs.jsonl", tmp_path, "tiny")
               for T in (8, 16)]
    body, verdicts = stagewise_defaults.measure(runners, jobs=1)
    assert len(verdicts) == 2 * sum(len(case[3]) for case in stagewise_defaults.CASES)
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * len(verdicts)  # both schedules, both seeds
    assert {json.dumps(r["params"], sort_keys=True) for r in records} == {
        json.dumps(p, sort_keys=True) for p in (stagewise_defaults.OLD, stagewise_defaults.NEW)}
    rows = [line for line in body.splitlines() if line.startswith("| CODASCA")]
    assert [row.split(" | ")[1] for row in rows] == ["8", "8", "16", "16"]
    # The last column: how far the runs end below their best evaluation, never negative.
    assert all(float(x) >= 0 for row in rows for x in row.rstrip(" |").split(" | ")[-1].split(" / "))
    # The choice among schedules: every candidate on every validation seed, the new defaults among them.
    choice = stagewise_defaults.choose(runners[1], jobs=1)
    table = [line for line in choice if line.startswith("| ") and not line.startswith("| schedule")]
    assert len(table) == len(stagewise_defaults.candidates(16, 4)) and any("the new defaults" in r for r in table)
    chosen = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()][len(records):]
    assert {r["seed"] for r in chosen} == set(stagewise_defaults.CHOICE_SEEDS)
    assert stagewise_defaults.NEW in stagewise_defaults.candidates(16, 4).values()


def test_runs_trained_side_by_side_store_what_one_process_trains(tmp_path, work):
    """``--jobs``: run_many's worker processes give each run the record a sequential run (``--jobs 1``, in the
    calling process) gives (same seed, same AUC and curve), each stored once, and a rerun trains nothing."""
    tiny = runs.Setting(pool=150, n_train=40, iterations=8, local_steps=4, seeds=(0, 1), eval_points=2,
                        score="macro_over_sites")
    pool = runs.build_pool(work, tiny)
    calls = [(("fedavg", {}, 0.3, (0.2,) * 3, seed), {}) for seed in (0, 1)] + [
        (("codasca", {"stages": 2}, 0.3, (0.2,) * 3, 0), {})]
    parallel = runs.Runner(pool, tiny, tmp_path / "parallel.jsonl", tmp_path, "p")
    parallel.run_many(calls, jobs=2)
    stored = [json.loads(line) for line in (tmp_path / "parallel.jsonl").read_text().splitlines()]
    assert len(stored) == 3
    sequential = runs.Runner(pool, tiny, tmp_path / "sequential.jsonl", tmp_path, "s")
    sequential.run_many(calls, jobs=1)  # one after another in this process, no worker
    assert len((tmp_path / "sequential.jsonl").read_text().splitlines()) == 3
    for args, kw in calls:
        expected = sequential.run(*args, **kw)  # read back too
        got = parallel.run(*args, **kw)  # read back, not trained again
        assert got["key"] == expected["key"]
        assert got["auc"] == pytest.approx(expected["auc"], abs=1e-6)
        assert [a for _, a in got["curve"]] == pytest.approx([a for _, a in expected["curve"]], abs=1e-6)
    reread = runs.Runner(pool, tiny, tmp_path / "parallel.jsonl", tmp_path, "p")
    reread.run_many(calls, jobs=2)
    assert len((tmp_path / "parallel.jsonl").read_text().splitlines()) == 3


def test_a_run_stored_under_other_defaults_is_not_taken_for_this_one(tmp_path, work, monkeypatch):
    """The run's key holds the algorithm's parameters with its defaults filled in: after a change of
    defaults, a cached ``codasca {}`` run trained under the old ones is trained again, not reused."""
    from federated.algorithms.codasca import CODASCAParams

    tiny = runs.Setting(pool=150, n_train=40, iterations=8, local_steps=4, seeds=(0,), eval_points=1)
    runner = runs.Runner(runs.build_pool(work, tiny), tiny, tmp_path / "runs.jsonl", tmp_path, "t")
    now = runner.spec("codasca", {}, 0.3, (0.2,) * 3, 0)
    assert now["resolved"] == CODASCAParams().model_dump(mode="json")

    class OneStage(CODASCAParams):
        stages: int = 1

    monkeypatch.setattr(runs, "get_algorithm", lambda name: type("Algorithm", (), {"Params": OneStage}))
    assert runner.spec("codasca", {}, 0.3, (0.2,) * 3, 0)["key"] != now["key"]
