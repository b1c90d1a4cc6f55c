"""A one-line notice on stderr, between progress bars: what a user should know and that stops nothing (a
stale lock taken over, a staged shard set finished, privacy budgets that differ)."""

from __future__ import annotations

import sys


def notice(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
