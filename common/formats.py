"""The format version of every file fedauc persists, and the one check a reader makes of it.

Each JSON file fedauc writes for later (a hospital's privacy ledger, PACS state and operating points, a
checkpoint's metadata, a site's consortium settings in its kit) carries ``"format": <version>`` (``stamp``);
its reader calls ``check`` before it reads anything else. A file without the field was written before fedauc
versioned its files (every fedauc up to commit 2d9c5ff): format 1, the same fields as now, read as such. A file
of a format newer than this fedauc knows is refused in one line naming the file, its format and what to do.
The fedauc that changes a format raises its version here and keeps reading the one before. Shards carry their own ``format_version``
(``preprocessing.shard_format``): they are rewritten by ``fedauc preprocess``, never migrated.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import DataError

FIELD = "format"

# kind -> the version this fedauc writes (and the newest it reads).
FORMATS: dict[str, int] = {"privacy-ledger": 1, "pacs-state": 1, "thresholds": 1, "checkpoint": 1, "site-settings": 1,
                         "centre-backup": 1, "privacy-binding": 1}


class NewerFormat(DataError):
    """A file this fedauc is too old to read, in one line (a site's refusal is what the centre hears)."""

    def __str__(self) -> str:
        return f"{self.args[0]}; fix: {self.fix}"


def stamp(kind: str, body: dict) -> dict:
    """``body`` with this fedauc's format version of ``kind`` first."""
    return {FIELD: FORMATS[kind], **body}


def check(kind: str, body: object, path: str | Path) -> dict:
    """``body`` (the parsed file at ``path``) without its format field, if this fedauc reads its format."""
    if not isinstance(body, dict):
        raise DataError(f"{path}: expected a JSON object ({kind}), got {type(body).__name__}",
                        fix="restore the file from the backup")
    current = FORMATS[kind]
    version = body.get(FIELD, 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DataError(f"{path}: {FIELD} {version!r} is not a {kind} format version", fix="restore the file from the backup")
    if version > current:
        raise NewerFormat(f"{path}: {kind} format {version} was written by a newer fedauc; this one reads formats "
                        f"1 to {current}", fix="upgrade fedauc on this machine to the version that wrote it")
    return {key: value for key, value in body.items() if key != FIELD}
