"""The names the centre, the server and the sites of a fedauc NVFlare job agree on: where a job keeps what,
and how its server marks a failure. Constants only, so that every role reads them from here and no role
imports another's code for them.
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
# In RESULT_DIR: ``<site>.qc_grid.png``, the sample grid of a site whose sharing policy shares it.
GRID_SUFFIX = "qc_grid.png"

# An evaluation job's weights (a list of state dicts, one per model, in the job's order), in its config/ folder.
WEIGHTS_FILE = "fedauc_models.pt"

# Starts the server's account of a failed job in its log: how the submitter finds the reason there.
FAILURE_MARK = "fedauc training failed: "
