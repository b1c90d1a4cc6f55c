"""The server's liveness watch names a site that left the consortium (its client logged out, recorded by the
server's own process in ``LEFT_FILE``) within a second, and only one still training in this job; earlier
departures are not this job's (federated/flare/server/live.py). The POC case is tests/test_flare_site_lifetime.py."""

from __future__ import annotations

import threading

from federated.flare.server.live import LiveRecords, record_departure


def test_the_watch_names_a_training_site_that_left_and_ignores_earlier_or_finished_ones(tmp_path):
    record_departure(tmp_path, "vienna")  # left and came back before this job
    live = LiveRecords(tmp_path / "run", tmp_path, ["vienna", "barcelona", "new-york"], "job-1")
    named: list[tuple[str, str]] = []
    called = threading.Event()
    live.watch(lambda site, reason: (named.append((site, reason)), called.set()))
    live.heartbeat("barcelona", "0.1.0", True)  # its training returned: leaving now harms no one
    record_departure(tmp_path, "barcelona")
    assert not called.wait(2.5)
    record_departure(tmp_path, "new-york")
    assert called.wait(2.5)
    live.stop()
    # A failing job's failure is the departure of a site that left without its result (federated/flare/server/job.py).
    assert live.departed(["vienna", "barcelona"]) == "barcelona" and live.departed(["vienna"]) is None
    assert named == [("new-york", "site 'new-york' left the consortium (its operator stopped fedauc); the job stops: "
                                  "start the site again with `fedauc consortium start-site`, then `fedauc train "
                                  "--resume`")]
