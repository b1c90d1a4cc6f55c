"""The centre's live reader of a FLARE job (federated/flare/centre/feed.py): its transport's errors are retried and,
once they last, end live logging with one line on stderr; any other error is a bug and is raised."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from federated.flare.centre.feed import LiveFeed, LiveReader


def _records(*rounds: int) -> str:
    return "".join(json.dumps({"record": {"round": r, "train_loss": 0.5}}) + "\n" for r in rounds)


def _run(feed: LiveFeed, reader: LiveReader, seconds: float = 0.3) -> None:
    with feed.reading(reader):
        time.sleep(seconds)


def test_a_transport_that_stays_down_stops_live_logging_with_one_line(capsys):
    calls = []

    def read():
        calls.append(1)
        if len(calls) == 1:
            return _records(0)
        raise ConnectionError("cannot connect to server")

    seen = []
    feed = LiveFeed([seen.append], interval_s=0.01, give_up_s=0.05)
    _run(feed, LiveReader(read, (ConnectionError,)))
    assert [r["round"] for r in seen] == [0]
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["fedauc: live round records stop after round 1: ConnectionError: cannot connect to server "
                     "(the job goes on; the rounds not shown come with its result)"]
    assert feed.stopped == "ConnectionError: cannot connect to server"


def test_a_transport_error_that_passes_is_retried_silently(capsys):
    answers = iter([ConnectionError("dropped"), _records(0), TimeoutError("slow"), _records(0, 1)])

    def read():
        answer = next(answers, _records(0, 1))
        if isinstance(answer, Exception):
            raise answer
        return answer

    seen = []
    feed = LiveFeed([seen.append], interval_s=0.01, give_up_s=5.0)
    _run(feed, LiveReader(read, (OSError,)))
    assert [r["round"] for r in seen] == [0, 1]
    assert capsys.readouterr().err == "" and feed.stopped is None


@pytest.mark.parametrize("read", [lambda: {}["records"],  # the reader's own bug
                                  lambda: json.dumps({"record": {"iteration": 3}})],  # a record without its round
                         ids=["reader", "record"])
def test_a_bug_is_raised_not_taken_for_a_dropped_connection(read, capsys):
    feed = LiveFeed([lambda record: None], interval_s=0.01, give_up_s=60.0)
    with pytest.raises(KeyError):
        _run(feed, LiveReader(read, (OSError,)))
    err = capsys.readouterr().err
    assert err.count("fedauc: live round records stop before the first round: KeyError") == 1, err
    assert "a bug in fedauc, raised when the job ends" in err


@pytest.mark.parametrize("read, raised", [(lambda: _records(0), None), (lambda: {}["records"], KeyError)],
                         ids=["job-ended", "bug"])
def test_the_feed_lets_go_of_its_reader_once_when_the_job_ends(read, raised):
    """The admin reader keeps one session for all its reads (a login costs NVIDIA FLARE's admin client a second's
    wait): the feed closes it once, after its last read, whether the job ended or a bug stopped the feed."""
    events = []

    def reading():
        events.append("read")
        return read()

    feed = LiveFeed([lambda record: None], interval_s=0.01, give_up_s=60.0)
    with pytest.raises(raised) if raised else contextlib.nullcontext():
        _run(feed, LiveReader(reading, (OSError,), lambda: events.append("close")), seconds=0.1)
    assert events.count("close") == 1 and events[-1] == "close" and "read" in events
