"""No code travels: a fedauc job names the modules every participant runs from the fedauc it installed.

NVFlare 2.9's ``CollabRecipe`` ships the server's and site's whole package in the job's ``custom/`` folder
(bring-your-own-code, BYOC), so whoever may submit a job could run any code on a hospital's machine.
:class:`InstalledRecipe` writes configuration only. A job without custom code is authorized by each
participant's component allow-list (``class_allow_list`` in its ``local/resources.json``) instead of the
``byoc`` right: :data:`COMPONENTS` is that list for fedauc, and :class:`InstalledModule` admits only
fedauc's two job modules, so the allow-list cannot be used to start any other installed module.
"""

from __future__ import annotations

import json
from pathlib import Path

from nvflare.collab import CollabRecipe
from nvflare.collab.api.module_wrapper import ModuleWrapper

from federated.flare.lockdown import write_owner_only

# The modules a fedauc job may name: its halves at the server and at the sites.
SERVER_MODULE = "federated.flare.server.job"
SITE_MODULE = "federated.flare.site.job"
JOB_MODULES = (SERVER_MODULE, SITE_MODULE)


class InstalledModule(ModuleWrapper):
    """One of :data:`JOB_MODULES`, imported from this machine's fedauc (a job's config names it by path)."""

    def __init__(self, module: str | None = None):
        if module is not None and module not in JOB_MODULES:
            raise ValueError(f"a fedauc job runs {' or '.join(JOB_MODULES)}, not {module!r}")
        super().__init__(module)


# What a participant may build from a fedauc job's config (NVFlare's ComponentPathAuthorizer); nothing else.
COMPONENTS = ("nvflare.collab.runtime.controller.CollabController",
              "nvflare.collab.runtime.executor.CollabExecutor",
              f"{InstalledModule.__module__}.{InstalledModule.__name__}")


class InstalledRecipe(CollabRecipe):
    """A ``CollabRecipe`` whose job holds no code: ``server`` and ``client`` are :data:`JOB_MODULES`' names."""

    def __init__(self, job_name: str, server: str, client: str, **kwargs):
        super().__init__(job_name=job_name, server=InstalledModule(server), client=InstalledModule(client), **kwargs)
        # The fedauc package is installed everywhere: NVFlare's job config copies none of its sources.
        self._job.set_app_packages([server.split(".")[0]])

    @staticmethod
    def _user_source_entries(objs) -> list:
        return []


def allow_components(local_dir: str | Path, component: dict | None = None) -> Path:
    """Write ``local/resources.json`` (from the kit's ``resources.json.default`` when there is one) with
    :data:`COMPONENTS` as its only allowed components, enforced, and no log streaming (NVFlare otherwise
    adds a ``JobLogStreamer`` to every job, which uploads the site's ``error_log.txt``, tracebacks with the
    site's paths, to the centre), and ``component`` among the process's own (one of the same id replaced);
    the file written."""
    local = Path(local_dir)
    resources = {"format_version": 2}
    for name in ("resources.json", "resources.json.default"):
        if (local / name).is_file():
            resources = json.loads((local / name).read_text())
            break
    resources.update(class_allow_list=list(COMPONENTS), class_list_enforcement_mode="enforce",
                     allow_log_streaming=False)
    if component is not None:
        resources["components"] = [c for c in resources.get("components", []) if c["id"] != component["id"]] + [component]
    local.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_owner_only(local / "resources.json", json.dumps(resources, indent=2))
    return local / "resources.json"
