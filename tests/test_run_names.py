"""Every flow and task with a computed run name is named from its own run's parameters, wherever it is called
from: at top level, inside a task, and inside a flow inside a task (the demo onboards its sites from its data
task: Prefect 3.8 keeps the caller's task run context inside a flow called there, PrefectHQ/prefect#19449).
A deployment run by a real worker: tests/test_deploy_schedule.py checks the names of its runs.

Each real flow and task is probed with its own namer on a body that returns the name Prefect gave the run, so
that the names are checked without training or preprocessing anything."""

import inspect

import pytest

from pipelines.prefect_env import PROJECT_ROOT, configure_prefect_env

configure_prefect_env()

from prefect import Flow, Task, flow, task  # noqa: E402
from prefect.runtime import flow_run, task_run  # noqa: E402

from pipelines import demo, flows, preprocess_flow  # noqa: E402

CHEST = str(PROJECT_ROOT / "sites" / "demo" / "chest.yaml")
MELANOMA = str(PROJECT_ROOT / "sites" / "demo" / "melanoma.yaml")

# (the real flow or task, the parameters of a call, the name its run must get)
NAMED = [
    (flows.onboard_site, {"site": "stanford"}, "onboard stanford"),
    (preprocess_flow.preprocess_site, {"site": "hanoi"}, "preprocess hanoi"),
    (flows.preprocess_federation, {"federation_yaml": CHEST, "out_dir": "shards"}, "data chest-xray"),
    (flows.train_federated, {"federation_yaml": CHEST, "shards_root": "shards", "config": {"algorithm": "codasca"}},
     "train chest-xray codasca"),
    (flows.evaluate, {"federation_yaml": CHEST}, "evaluate chest-xray champion"),
    (flows.compare, {"federation_yaml": CHEST, "shards_root": "shards", "base_config": {}, "algorithms": ["fedavg"],
                     "local_steps": [4]}, "compare chest-xray"),
    (flows.validate, {"site_yaml": "/sites/stanford.yaml"}, "validate stanford"),
    (flows.labels_only_report, {"site_yaml": "/sites/stanford.yaml"}, "labels-report stanford"),
    (preprocess_flow.scan, {"site_yaml": "/sites/vienna.yaml"}, "scan vienna"),
    (flows.train_task, {"federation_yaml": CHEST, "shards_root": "shards", "config": {"algorithm": "fedavg"},
                        "run_name": "fedavg-I8"}, "train chest-xray fedavg-I8"),
    (flows.evaluate_task, {"federation_yaml": CHEST, "shards_root": None, "model_versions": ["2", "3"],
                           "launcher": None}, "evaluate chest-xray v2,v3"),
    (demo.prepare_data, {"federation_yaml": MELANOMA, "shards": "shards", "scale": 1.0, "seed": 0}, "data melanoma"),
]
# The parameters of the runs the probes are called from: every name a namer might read, each a decoy.
DECOY = {"site": "decoy-site", "site_yaml": "/decoy/decoy-yaml.yaml", "federation_yaml": MELANOMA,
         "config": {"algorithm": "decoy-algorithm"}, "run_name": "decoy-run", "model_versions": ["99"]}


def _probe(real: Flow | Task):
    """A flow or task with ``real``'s name, namer and signature whose body returns the name of its own run."""
    if isinstance(real, Flow):
        def body(*args, **kwargs):
            return flow_run.name
        body.__signature__ = inspect.signature(real.fn)
        return flow(name=f"probe-{real.name}", flow_run_name=real.flow_run_name, validate_parameters=False)(body)

    def body(*args, **kwargs):
        return task_run.name
    body.__signature__ = inspect.signature(real.fn)
    return task(name=f"probe-{real.name}", task_run_name=real.task_run_name, cache_policy=None)(body)


@task(name="decoy-task")
def _in_task(probe, parameters, site=None, site_yaml=None, federation_yaml=None, config=None, run_name=None,
             model_versions=None):
    return probe(**parameters)


@flow(name="decoy-flow", validate_parameters=False)
def _in_flow(probe, parameters, site=None, site_yaml=None, federation_yaml=None, config=None, run_name=None,
             model_versions=None):
    return probe(**parameters)


@task(name="decoy-task-around-a-flow")
def _in_flow_in_task(probe, parameters, site=None, site_yaml=None, federation_yaml=None, config=None,
                     run_name=None, model_versions=None):
    return _in_flow(probe, parameters, **DECOY)


CALLERS = {
    "top level": lambda probe, parameters: probe(**parameters),
    "inside a task": lambda probe, parameters: _in_task(probe, parameters, **DECOY),
    "inside a flow inside a task": lambda probe, parameters: _in_flow_in_task(probe, parameters, **DECOY),
}


def test_every_computed_name_is_probed():
    """A new flow or task with a computed name joins NAMED (a callable namer is what this test checks)."""
    modules = (flows, preprocess_flow, demo)
    computed = {obj.name for module in modules for obj in vars(module).values()
                if (isinstance(obj, Flow) and callable(obj.flow_run_name))
                or (isinstance(obj, Task) and callable(obj.task_run_name))}
    assert computed == {real.name for real, _, _ in NAMED}


@pytest.mark.parametrize("caller", CALLERS)
def test_runs_are_named_from_their_own_parameters(caller):
    names = {real.name: CALLERS[caller](_probe(real), parameters) for real, parameters, _ in NAMED}
    assert names == {real.name: expected for real, _, expected in NAMED}
