"""The MLflow server ``fedauc ui`` starts (``mlflow ui --app-name fedauc``): MLflow's own app, whose pages open
an experiment on its training runs.

MLflow 3.17's UI decides between its GenAI view (an experiment opens on "Overview", traces, a GenAI sidebar) and
its model-training view (the runs table) from the ``workflowType`` URL parameter, else from the browser's stored
choice (localStorage ``mlflow.workflowType_v1``), default GenAI; the experiment tag ``mlflow.experimentKind`` is
not read for it. A link can carry the parameter, but a click inside the UI drops it. So this app stores the
training view as the browser's choice when it has none yet (a user who picks GenAI in the sidebar keeps it).
"""

from __future__ import annotations

import json

from mlflow.server import app as flask_app
from mlflow.server.fastapi_app import app

# The key and value MLflow's UI reads (its useLocalStorage hook: "<key>_v<version>", JSON).
WORKFLOW_STORAGE_KEY = "mlflow.workflowType_v1"
TRAINING_WORKFLOW = "machine_learning"
_KEY, _VALUE = json.dumps(WORKFLOW_STORAGE_KEY), json.dumps(json.dumps(TRAINING_WORKFLOW))
DEFAULT_VIEW_SCRIPT = (f"<script>try{{if(localStorage.getItem({_KEY})===null)localStorage.setItem({_KEY},{_VALUE})}}"
                       "catch(e){}</script>")


@flask_app.after_request
def _training_view_by_default(response):
    """The UI's page (the only HTML MLflow serves) with the default view stored before MLflow's scripts run."""
    if response.status_code != 200 or response.mimetype != "text/html":
        return response
    response.direct_passthrough = False  # index.html is sent as a file: read it to rewrite it
    page = response.get_data(as_text=True)
    if "<head>" not in page or WORKFLOW_STORAGE_KEY in page:
        return response
    response.set_data(page.replace("<head>", "<head>" + DEFAULT_VIEW_SCRIPT, 1))
    response.headers.pop("ETag", None)  # the file's tag no longer describes this body
    return response


__all__ = ["app"]
