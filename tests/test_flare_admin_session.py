"""The centre's admin sessions (federated/flare/centre/session.py) keep NVIDIA FLARE's own noise out of a
command's output: its admin client's threads log their connection errors' tracebacks to the root logger, which a
command with no logging set up prints on stderr (`fedauc consortium stop-server` once printed one after saying
the server had stopped), and its admin client and authenticator print some on stderr themselves. And its admin
client takes its communication settings from the kit, not from wherever the operator runs the command.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from federated.flare.centre.provision import project, provision
from pipelines.servers import free_port

# NVIDIA FLARE's own call, in a process of its own: the filter, once installed, lasts for the process.
_SCRIPT = textwrap.dedent("""
    import sys
    from nvflare.security.logging import secure_log_traceback
    if sys.argv[1] == "with-session":
        from federated.flare.centre.session import quiet_session
        try:
            quiet_session("admin@centre.example", sys.argv[2], timeout_s=1)
        except Exception:
            pass  # no kit here: the session's set-up is what this asks for
    try:
        raise TypeError(f"expected a reply but got {type(None)}")
    except TypeError:
        secure_log_traceback()
    # NVIDIA FLARE's login against a server halfway down: it answers with no payload.
    from nvflare.apis.fl_context import FLContext
    from nvflare.apis.signal import Signal
    from nvflare.fuel.f3.message import Message
    from nvflare.private.fed.authenticator import Authenticator

    class StoppingServer:
        def send_request(self, **_):
            return Message()

    try:
        Authenticator(StoppingServer(), "fedauc", "admin@centre.example", "admin", "server", False, None, None, None,
                      msg_timeout=1, retry_interval=0.1, timeout=1).authenticate(FLContext(), Signal())
    except Exception as err:
        print("login refused:", err)
    import logging
    logging.getLogger("fedauc.flare").warning("fedauc's own warning")
    # Whoever logs at DEBUG still has it, under NVIDIA FLARE's name.
    logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    try:
        raise TypeError("a second reply lost")
    except TypeError:
        secure_log_traceback()
""")


@pytest.mark.parametrize("mode", ["without-session", "with-session"])
def test_nvflare_root_tracebacks_stay_out_of_stderr_once_a_session_is_opened(tmp_path, mode):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _SCRIPT, mode, str(tmp_path)], capture_output=True, text=True,
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": ""}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fedauc's own warning" in done.stderr
    before_debug = done.stderr.split("fedauc's own warning")[0]
    # Without a session NVIDIA FLARE's call prints, as it does: the test would see the leak.
    assert ("Traceback" in before_debug) == (mode == "without-session"), done.stderr
    # NVIDIA FLARE's authenticator printed its own traceback before raising; the error itself is still raised.
    assert ("expect payload to be dict" in before_debug) == (mode == "without-session"), done.stderr
    assert "login refused: error:client_registration" in done.stdout
    kept = "nvflare.admin: Traceback" if mode == "with-session" else "root: Traceback"
    assert kept in done.stderr and "TypeError: a second reply lost" in done.stderr, done.stderr


# A fresh process: NVIDIA FLARE reads its communication settings once a process.
_SETTINGS_READ = textwrap.dedent("""
    import sys
    from nvflare.fuel.f3.comm_config import CommConfigurator
    from federated.flare.centre.session import quiet_session
    try:
        quiet_session("admin@fedauc.org", sys.argv[1], timeout_s=0.5)
    except Exception:
        pass  # no server runs: what the admin client read on its way is what this asks for
    print(CommConfigurator().get_config())
""")


def test_an_admin_session_takes_nvflares_settings_from_the_kit_not_the_working_directory(tmp_path):
    federation = SimpleNamespace(name="settings", task="melanoma", sites=[SimpleNamespace(name="vienna")])
    kits = provision(project(federation, "localhost", free_port()), tmp_path / "kits")
    # A comm_config.json somewhere below the operator's working directory (another kit, a download).
    stray = tmp_path / "operator" / "downloads" / "old-kit" / "local"
    stray.mkdir(parents=True)
    (stray / "comm_config.json").write_text(json.dumps({"stray": "below the working directory"}))
    root = Path(__file__).resolve().parents[1]

    def settings() -> str:
        done = subprocess.run([sys.executable, "-c", _SETTINGS_READ, str(kits.admin)], capture_output=True, text=True,
                              cwd=tmp_path / "operator", env={"PYTHONPATH": str(root), "PATH": ""}, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert settings() == "None"  # NVIDIA FLARE's defaults: the kit has none of its own
    (kits.admin / "local" / "comm_config.json").write_text(json.dumps({"kit": "the admin's own"}))
    assert settings() == "{'kit': \"the admin's own\"}"
