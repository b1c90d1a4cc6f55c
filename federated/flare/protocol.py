"""The names the centre, the server and the sites of a fedauc NVFlare job agree on: where a job keeps what,
how its server marks a failure, how a site reports one, beats and calls the server's collectives, and where
the server keeps its live account. Constants only, so that every role reads them from here and no role
imports another's code for them. The calls themselves are the functions each half of the job publishes
(``collab.publish``: the server's ``collective``, ``site_failed``, ``record``, ``heartbeat``, ``budget``;
every site's ``train`` and ``evaluate``).
"""

from __future__ import annotations

# The server app's prop that holds the job (``federated.flare.spec.FlareJob``, as JSON).
JOB_PROP = "fedauc_job"

# The folder of the job's run folder the server writes its result to; it comes back with the job's result.
RESULT_DIR = "fedauc_result"
# In RESULT_DIR: what came back (JSON: a training's history and site reports, or an evaluation's summaries).
RESULT_FILE = "result.json"
# In RESULT_DIR: a training's final global model (torch state dict).
STATE_FILE = "global_state.pt"
# In RESULT_DIR: a training's out-of-distribution refusal model (``federated.ood.to_saved``: tensors and plain
# values, read back with ``weights_only=True``); absent where none was fitted (under DP, ``ood_false_refusal=0``).
OOD_STATE_FILE = "ood_state.pt"
# In RESULT_DIR: ``<site>.qc_grid.png``, the sample grid of a site whose sharing policy shares it.
GRID_SUFFIX = "qc_grid.png"

# An evaluation job's weights (a list of state dicts, one per model, in the job's order), in its config/ folder.
WEIGHTS_FILE = "fedauc_models.pt"

# Starts the server's account of a failed job in its log: how the submitter finds the reason there.
FAILURE_MARK = "fedauc training failed: "

# A site's part of a job that failed returns ``{FAILED: <one line naming no path>}`` to the server.
FAILED = "fedauc_failed"

# Seconds between a training site's heartbeats to the server's published ``heartbeat``.
HEARTBEAT_S = 5.0

# The server's live account of a running job, in the job's run folder, one JSON object a line (NVFlare's admin
# ``cat`` serves only some extensions; .json is one): what the submitter and ``fedauc consortium status`` read.
LIVE_FILE = "fedauc_live.json"
# In the server's workspace root: every site's last heartbeat, fedauc version and privacy spend, across jobs.
SITES_FILE = "fedauc_sites.json"
# Beside SITES_FILE: when each site last left the consortium (its client logged out).
LEFT_FILE = "fedauc_left.json"


class Collective:
    """What a site's call of the server's ``collective(seq, what, site, payload)`` asks the server to do with
    every site's payload (the server combines them by kind); plain strings on the wire."""

    MEAN = "mean"
    ROBUST_MEAN = "robust_mean"
    GATHER = "gather"
    BARRIER = "barrier"
    RING_SUM = "ring_sum"
    KEYS = "keys"
    INPUTS = "inputs"
    RESUME = "resume"


# The sequence numbers of the collectives before the engine's (a site's transport numbers its own from 1):
# the checkpoint rounds every site holds (a resumed training), then every site's model input.
RESUME_SEQ = -1
INPUTS_SEQ = 0
