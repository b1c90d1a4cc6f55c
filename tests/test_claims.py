"""The claims benchmark (benchmarks/claims.py): its verdict rule on constructed numbers, and its whole path
(phantom clinics generated and preprocessed, every claim trained, the doc and plots written) on a tiny setting."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("claims_benchmark", REPO / "benchmarks" / "claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


claims = _load()


def test_interval_is_the_t_interval_over_seeds():
    mean, low, high = claims.interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    # t(0.975, 2) = 4.3027, sd 1, n 3
    assert high - mean == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert mean - low == pytest.approx(high - mean)
    assert math.isnan(claims.interval([0.5])[1])


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
    assert claims.verdict(differences, margin) == expected


def test_write_doc_replaces_only_the_text_between_the_markers(tmp_path):
    doc = tmp_path / "result.md"
    begin, end = claims.markers("full")
    other = "\n".join(claims.markers("long"))
    doc.write_text(f"# Title\n\nwritten by hand\n\n{begin}\nold numbers\n{end}\n\nafter\n{other}\n")
    claims.write_doc(doc, "new numbers", "full")
    text = doc.read_text()
    assert "written by hand" in text and "after" in text and "new numbers" in text and "old numbers" not in text
    assert text.endswith(f"{other}\n")  # another run's block is left alone
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        claims.write_doc(doc, "x", "full")


def test_the_quick_path_runs_every_claim_on_a_tiny_setting_and_a_rerun_reuses_the_runs(tmp_path):
    tiny = claims.Setting(pool=150, n_train=40, iterations=8, local_steps=4, periods=(1, 4), rates=(0.01, 0.2),
                          lr_grid=(0.3,), seeds=(0, 1), eval_points=2)
    doc = tmp_path / "docs" / "result.md"
    verdicts = claims.run_claims(tiny, tmp_path / "work", doc, list(claims.CLAIMS), "tiny")
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
    runs = tmp_path / "work" / "runs-tiny.jsonl"
    records = [json.loads(line) for line in runs.read_text().splitlines()]
    assert all(0.0 <= r["auc"] <= 1.0 for r in records)
    # Claim (c)'s curves: evaluations along the run, at increasing iterations.
    curves = [r["curve"] for r in records if r["algorithm"] == "localscgdam"]
    assert curves and all(len(c) == 2 and c[0][0] < c[1][0] == tiny.iterations for c in curves)
    # Warm-up runs number their iterations across both phases.
    assert any(r["warmup_rounds"] and r["curve"][-1][0] == tiny.iterations for r in records)
    assert claims.run_claims(tiny, tmp_path / "work", doc, list(claims.CLAIMS), "tiny") == verdicts
    assert len(runs.read_text().splitlines()) == len(records)  # nothing retrained


def test_the_command_line_sets_the_regime_and_the_clinics_mean_score(tmp_path):
    doc = tmp_path / "result.md"
    assert claims.main(["--quick", "--pool", "150", "--rows-per-site", "40", "--iterations", "8", "--lr-grid", "0.3",
                        "--seeds", "2", "--rates", "0.2", "--claims", "b", "--score", "macro_over_sites",
                        "--name", "cli", "--work", str(tmp_path / "work"), "--doc", str(doc)]) == 0
    records = [json.loads(line) for line in (tmp_path / "work" / "runs-cli.jsonl").read_text().splitlines()]
    assert {r["lr"] for r in records} == {0.3} and {tuple(r["rates"]) for r in records} == {(0.2, 0.2, 0.2)}
    assert all(r["setting"][:4] == [150, 32, 40, 8] and r["score"] == "macro_over_sites" for r in records)
    assert all(r["auc"] == r["auc_sites"] for r in records)
    assert any(r["auc_sites"] != r["auc_pooled"] for r in records)  # the two scores are different numbers
    text = doc.read_text()
    assert "3 sites x 40 training rows" in text and "clinics' mean test AUC" in text
