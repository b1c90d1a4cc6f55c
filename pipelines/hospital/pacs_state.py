"""What the PACS scoring job remembers between runs, per model version (docs/deploy.md section 3).

Per study in the lookback window: ``held``, what the study holds that the model could take (its accepted
series and the PACS's instance count of each), and ``since``, when the job first saw it hold that; ``done``,
the ``held`` that was last scored (or found without an image the model takes); ``report``, the SR that
scoring wrote (its UIDs, for the next SR's Predecessor Documents Sequence) and the images it covers;
``counted``, the instances whose rows went into a run's drift counts (a study scored again adds its new ones);
``failures``, ``retry_after`` and ``reason`` while the study cannot be retrieved. A study whose date leaves
the window leaves the state: its size is bounded by the studies of ``lookback_days`` (plus the days since
the last run), not by the PACS's history. The file (``<shards>/pacs-state/<site>.json``) is written
whole, mode 0600, by rename.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from common.formats import check as check_format
from common.formats import stamp

# Backoff of a study that cannot be retrieved: the next try after 15 minutes, then 30, 60 ... at most a day.
BACKOFF_FIRST = dt.timedelta(minutes=15)
BACKOFF_MAX = dt.timedelta(days=1)


def read(path: Path) -> dict:
    return check_format("pacs-state", json.loads(path.read_text()), path) if path.is_file() else {}


def write(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stamp("pacs-state", state), indent=1, sort_keys=True))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def window_start(mine: dict, today: dt.date, lookback_days: int, since: dt.date | None) -> dt.date:
    """The first StudyDate looked at: ``since`` when given, else ``lookback_days`` before the last run (before
    today on the first run: an archive is not scored)."""
    if since is not None:
        return since
    last = dt.date.fromisoformat(mine["last_run"]) if "last_run" in mine else today
    return last - dt.timedelta(days=lookback_days)


def prune(studies: dict, start: dt.date) -> dict:
    """The entries of studies dated ``start`` or later (an entry without a date is kept one window)."""
    first = f"{start:%Y%m%d}"
    return {uid: entry for uid, entry in studies.items() if entry.get("date", first) >= first}


def observe(entry: dict, held: dict[str, int], now: dt.datetime) -> None:
    """Record what the study holds now; a change restarts its stability clock and its retries."""
    if entry.get("held") != held:
        entry.update(held=held, since=now.isoformat())
        for key in ("failures", "retry_after", "reason"):
            entry.pop(key, None)


def stable(entry: dict, now: dt.datetime, stable_minutes: float) -> bool:
    return now - dt.datetime.fromisoformat(entry["since"]) >= dt.timedelta(minutes=stable_minutes)


def waiting_to_retry(entry: dict, now: dt.datetime) -> bool:
    return "retry_after" in entry and now < dt.datetime.fromisoformat(entry["retry_after"])


def failed(entry: dict, reason: str, now: dt.datetime) -> None:
    entry["failures"] = entry.get("failures", 0) + 1
    delay = min(BACKOFF_FIRST * 2 ** (entry["failures"] - 1), BACKOFF_MAX)
    entry.update(reason=reason, retry_after=(now + delay).isoformat())


def done(entry: dict, report: dict | None = None) -> None:
    entry["done"] = entry["held"]
    if report is not None:
        entry["report"] = report
    for key in ("failures", "retry_after", "reason"):
        entry.pop(key, None)
