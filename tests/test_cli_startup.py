"""What a daily command loads before it answers (issue 45: every daily command answers in under 2 s):
`fedauc --help`, `fedauc compare`, `fedauc consortium status` and the champion's lookup import neither torch
nor the training stack, and the command line's choice names, defined in light modules, agree with what they
name. Each check runs in a fresh interpreter, since this test session has long imported everything; what it
checks is which modules are loaded, not how long they take (benchmarks/throughput/cli_startup.py measures that)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import get_args

import pytest

# Loaded after the command ran: the top-level packages in sys.modules, as JSON on stdout.
_LOADED_AFTER = """
import json, sys
{body}
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}})))
"""

_RUN_FEDAUC = """
from pipelines.cli import app
try:
    app({args!r}, prog_name="fedauc")
except SystemExit:
    pass
"""

TRAINING_STACK = {"torch", "torchvision", "prefect", "nvflare", "opacus"}


def loaded_after(body: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _LOADED_AFTER.format(body=body)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def loaded_by_fedauc(*args: str) -> set[str]:
    return loaded_after(_RUN_FEDAUC.format(args=list(args)))


@pytest.mark.parametrize("args", [["--help"], ["compare", "--help"], ["train", "--help"], ["consortium", "--help"]])
def test_help_loads_no_training_stack_nor_mlflow(args):
    loaded = loaded_by_fedauc(*args)
    assert "pipelines" in loaded  # the command line itself ran
    unneeded = loaded & (TRAINING_STACK | {"mlflow", "pandas", "pydicom"})
    assert not unneeded, f"fedauc {' '.join(args)} loads {sorted(unneeded)}"


def test_compare_loads_mlflow_only():
    """`fedauc compare` on the session's store (no such experiment: it says so and exits 1) reads MLflow and
    nothing of the training."""
    loaded = loaded_by_fedauc("compare", "--experiment", "no-such-experiment")
    assert "mlflow" in loaded
    assert not loaded & TRAINING_STACK


def test_consortium_status_loads_no_torch(tmp_path):
    """`fedauc consortium status` reads the server through NVFlare's admin API and the jobs' live files
    (federated/flare/centre/operate.py and feed.py): no engine. A folder that is no kit ends it before any
    connection, so the admin session (NVFlare's client, imported when it opens) is loaded apart."""
    loaded = loaded_by_fedauc("consortium", "status", "--kit", str(tmp_path))
    assert "federated" in loaded and not loaded & TRAINING_STACK
    session = loaded_after("import federated.flare.centre.operate\n"
                           "from nvflare.fuel.flare_api.flare_api import Session")
    assert "nvflare" in session and not session & {"torch", "prefect", "mlflow"}


def test_champion_lookup_loads_no_torch():
    loaded = loaded_after("from pipelines.registry import champion_version")
    assert "mlflow" in loaded and not loaded & TRAINING_STACK


def test_importing_a_light_module_of_federated_loads_no_engine():
    """federated/__init__.py's exports load on first use; the package's light modules stay light."""
    assert not loaded_after("import federated.settings, federated.registry") & TRAINING_STACK
    assert "torch" in loaded_after("from federated import train")


def test_choice_names_agree_with_what_they_name():
    from federated.config import TrainConfig
    from federated.flare.centre.environments import FLARE_ENVS
    from federated.launch import LAUNCHERS, Flare
    from federated.settings import LAUNCHER_KINDS, RULES
    from pipelines.cli.train_options import Aggregation, FlareEnv, TrainBackend

    assert tuple(LAUNCHERS) == LAUNCHER_KINDS == tuple(kind.value for kind in TrainBackend)
    assert get_args(TrainConfig.model_fields["robust_aggregation"].annotation) == RULES
    assert tuple(rule.value for rule in Aggregation) == RULES
    assert get_args(Flare.model_fields["env"].annotation) == FLARE_ENVS == tuple(env.value for env in FlareEnv)
