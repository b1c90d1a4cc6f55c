"""The launcher: one value says where a training or an evaluation runs, and nothing downstream branches on it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from common.errors import ConfigError
from federated.flare.centre.environments import FLARE_ENVS
from federated.launch import LAUNCHERS, Flare, InProcess, Torchrun, launcher

ROOT = Path(__file__).resolve().parents[1]


def test_a_launcher_travels_as_json_and_comes_back_the_same():
    """Prefect parameters and deployments carry the launcher as JSON: the value that comes back is the one sent."""
    prod = Flare(env="prod", workspace=Path("ws"), kit=Path("kits/admin@fedauc.org"))
    for value in (InProcess(), Torchrun(), Flare(), prod):
        assert launcher(value.model_dump(mode="json")) == value
    assert launcher(None) == InProcess()
    with pytest.raises(ValueError, match="kind"):
        launcher({"kind": "cloud"})


def test_what_each_launcher_owns():
    prod = Flare(env="prod", kit=Path("admin"))
    assert [InProcess().reads_shards_here, Torchrun().reads_shards_here, Flare(env="sim").reads_shards_here,
            Flare(env="poc").reads_shards_here, prod.reads_shards_here] == [True, True, True, True, False]
    assert InProcess().pools("centralized") and not InProcess().pools("codasca")
    assert not Torchrun().pools("centralized") and not Flare().pools("centralized")
    with pytest.raises(ConfigError, match="moves patient data"):
        Flare().check_algorithm("centralized")
    # The hospitals checkpoint on their own machines: a relative folder, never the centre's path.
    assert prod.checkpoint_dir("run", Path("/centre/store")) == "checkpoints/run"
    assert Flare().checkpoint_dir("run", Path("/centre/store")) == "/centre/store/checkpoints/run"
    assert prod.params() == {"backend": "flare", "flare_env": "prod"}
    assert InProcess().params() == {"backend": "inprocess"}
    with pytest.raises(ConfigError, match="goes with --flare-env prod"):
        Flare(env="prod").check()
    with pytest.raises(ConfigError, match="not an admin's startup kit"):
        prod.check()


def test_the_command_line_offers_what_the_launchers_and_environments_define():
    from pipelines.cli.train_options import FlareEnv, TrainBackend

    assert [m.value for m in TrainBackend] == list(LAUNCHERS) == ["inprocess", "torchrun", "flare"]
    assert tuple(m.value for m in FlareEnv) == FLARE_ENVS


@pytest.mark.parametrize("pattern", [r"flare is None", r"flare\[\"env\"\]", r"backend\.name ==", r"hasattr\(backend",
                                     r"flare: dict"])
def test_no_product_code_branches_on_where_it_runs(pattern):
    """Where a training runs is the launcher's (federated/launch.py) and the transport's (federated/transport.py)
    to say: product code neither tests a FLARE dict nor asks a backend what it is."""
    found = subprocess.run(["git", "grep", "-nE", pattern, "--", "common", "federated", "pipelines", "preprocessing", "models"],
                           cwd=ROOT, capture_output=True, text=True).stdout
    assert not re.findall(r"\S+\.py:\d+:", found), found


@pytest.mark.parametrize("kind", list(LAUNCHERS))
def test_every_registered_launcher_keeps_the_contract(kind):
    """What a new launcher must do to be offered by the command line, the flows and the deployments."""
    import typer.main

    from federated.settings import LAUNCHER_KINDS
    from pipelines.cli import app

    cls = LAUNCHERS[kind]
    assert not cls.__abstractmethods__  # train (and score) implemented
    default = cls.from_options({})
    assert default.kind == kind and kind in LAUNCHER_KINDS
    assert launcher(default.model_dump(mode="json")) == default  # travels as a flow's JSON parameter
    assert default.params()["backend"] == kind and isinstance(default.checkpoint_dir("r", Path("out")), str)
    commands = typer.main.get_command(app).commands
    for option, field in cls.options.items():
        assert field in cls.model_fields
        for command in ("train", "evaluate"):  # the options it declares are the commands' own
            assert any(option in param.opts for param in commands[command].params), (option, command)
    for option in {o for other in LAUNCHERS.values() for o in other.options} - set(cls.options):
        with pytest.raises(ConfigError, match=f"^{option} goes with --backend .*, not {kind}"):
            cls.from_options({option: "x"})


def test_the_command_line_names_no_launcher():
    found = subprocess.run(["git", "grep", "-nE", "[\"'](" + "|".join(LAUNCHERS) + ")[\"']", "--", "pipelines/cli"],
                           cwd=ROOT, capture_output=True, text=True).stdout
    assert found == ""
