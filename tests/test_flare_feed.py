"""The centre's live reader of a FLARE job (federated/flare/centre/feed.py): its transport's errors are retried and,
once they last, end live logging with one line on stderr; any other error is a bug and is raised."""

from __future__ import annotations

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
