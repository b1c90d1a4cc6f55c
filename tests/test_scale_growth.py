"""What grew faster than the consortium (python -m benchmarks.scale found them): the server rewrote the sites'
heartbeat file at every site's heartbeat (K writes of K sites every period), and the health check sorted the
other sites' norms once per site (K sorts of K values every round). Both now cost linear in K, with the same
results."""

from __future__ import annotations

import json
import math
import random

from federated.flare.protocol import SITES_FILE
from federated.flare.server.live import LiveRecords
from federated.health import relative_to_others


def _per_site_sort(values: list[float]) -> list[float]:
    """The definition: each value over the median of the others, the others sorted for each site."""
    out = []
    for k, v in enumerate(values):
        others = sorted(values[:k] + values[k + 1:])
        if not others:
            out.append(math.nan)
            continue
        mid = len(others) // 2
        median = others[mid] if len(others) % 2 else 0.5 * (others[mid - 1] + others[mid])
        out.append(v / median if median > 0 else math.nan)
    return out


def test_relative_norms_equal_the_per_site_definition():
    rng = random.Random(0)
    for n in range(0, 40):
        for _ in range(20):
            values = [rng.choice([0.0, 1.0, 2.0, rng.random(), rng.random() * 100]) for _ in range(n)]
            got, want = relative_to_others(values), _per_site_sort(values)
            assert len(got) == n
            assert all(g == w or (math.isnan(g) and math.isnan(w)) for g, w in zip(got, want)), values


def test_heartbeats_of_many_sites_are_written_once_a_flush_not_once_each(tmp_path):
    sites = [f"h{k:02d}" for k in range(64)]
    (tmp_path / SITES_FILE).write_text(json.dumps({"sites": {"old-site": {"last_heartbeat": 1.0}}}))
    live = LiveRecords(tmp_path / "run", tmp_path, sites, "job-1")
    before = (tmp_path / SITES_FILE).stat().st_mtime_ns
    for site in sites:
        live.heartbeat(site, "0.1.0+gabc", False)
    assert (tmp_path / SITES_FILE).stat().st_mtime_ns == before  # no write per heartbeat
    live.stop()  # the watch loop flushes every second; stopping flushes what is left
    known = json.loads((tmp_path / SITES_FILE).read_text())["sites"]
    assert set(known) == {*sites, "old-site"}  # earlier jobs' sites kept
    assert known["h63"]["fedauc"] == "0.1.0+gabc" and known["h63"]["job"] == "job-1"
