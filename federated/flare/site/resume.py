"""Checkpoints of an NVIDIA FLARE training: every site keeps its own, at its own place, and before a resumed
training starts the sites agree on the round to continue from.

Where: under the simulator and a POC consortium every site runs on the submitting machine, so each writes
``<checkpoint_dir>/<site>``; at a hospital, under its own kit's workspace,
``<kit>/fedauc_checkpoints/<name of the job's checkpoint_dir>`` (the centre names the training, never a
path on a hospital's machine). Each site commits its own rounds (``federated.checkpoint``: ``LATEST`` and
the round before it), so a site killed between two rounds' commits may be one round behind the others:
the sites exchange the rounds they hold (one collective, the round numbers only) and every one continues
from the newest round all of them completed.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import DataError
from federated.checkpoint import LATEST, committed_rounds, point_latest
from federated.flare.protocol import RESUME_SEQ, Collective
from federated.flare.site.backend import CollectiveCall
from federated.flare.spec import FlareJob

CHECKPOINTS = "fedauc_checkpoints"


def site_checkpoint_dir(job: FlareJob, site: str, workspace_root: Path) -> Path | None:
    """Where site ``site`` keeps the checkpoints of ``job`` (None: the training keeps none)."""
    configured = job.settings.get("checkpoint_dir")
    if configured is None:
        return None
    if job.checkpoints_here:
        return Path(configured) / site
    return Path(workspace_root) / CHECKPOINTS / Path(configured).name


def agree_on_round(call: CollectiveCall, site_index: int, sites: list[str], ckpt_dir: Path) -> int | None:
    """The round every site completed, pointed at by this site's ``LATEST``; None when no site holds a
    checkpoint of this training (it starts over). Every site decides from the same exchanged lists, so a
    refusal is the same at every site and names the site(s) it concerns."""
    everyone = call(RESUME_SEQ, Collective.RESUME, site_index, committed_rounds(ckpt_dir))
    if not any(everyone):
        (ckpt_dir / LATEST).unlink(missing_ok=True)
        return None
    without = [name for name, rounds in zip(sites, everyone) if not rounds]
    if without:
        raise DataError(f"cannot resume: site(s) {', '.join(without)} hold no checkpoint of this training, the "
                        f"others do (up to round {max(max(r) for r in everyone if r) + 1})",
                        fix="restore those sites' fedauc_checkpoints folder, or train again without --resume")
    common = min(max(rounds) for rounds in everyone)
    lacking = [name for name, rounds in zip(sites, everyone) if common not in rounds]
    if lacking:
        raise DataError(f"cannot resume: site(s) {', '.join(lacking)} no longer hold round {common + 1}, the last "
                        "round every site completed", fix="train again without --resume")
    point_latest(ckpt_dir, common)
    return common
