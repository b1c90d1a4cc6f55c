"""The admin's session with a consortium's server, as NVIDIA FLARE's ``new_secure_session`` opens it, but quiet:
NVFlare's admin client prints its progress ("Connecting to FLARE ...") on this process's stdout, which is
fedauc's own (a command's output, what other threads print meanwhile). Its lines go to ``note`` instead (the
job's log), or nowhere; the session object alone is changed, never ``sys.stdout``.

Its threads also log tracebacks of their own connection errors to the root logger (``secure_log_traceback()``
with no logger), which a command with no logging set up prints on stderr: a stopping server's last replies
did so after ``fedauc consortium stop-server`` had said it stopped. Those records, and only those, go to the
``nvflare.admin`` logger at DEBUG instead: out of a command's output, still there for whoever logs at DEBUG.
So do the tracebacks its admin client and authenticator print on stderr themselves (``traceback.print_exc()``)
before they raise or report the same error: ``shutdown``'s poll logging in while the server went down printed
one after `stop-server` had said the server stopped."""

from __future__ import annotations

import logging
import traceback
import types
from collections.abc import Callable
from pathlib import Path


def quiet_session(username: str, kit: str | Path, timeout_s: float, note: Callable[[str], None] | None = None):
    """An NVFlare ``Session`` logged in as ``username`` with the startup kit ``kit`` (NVFlare's errors as
    ``new_secure_session`` raises them)."""
    from nvflare.fuel.flare_api.flare_api import Session

    _drop_nvflare_root_tracebacks()
    _nvflare_printed_tracebacks_to_debug()
    _nvflare_config_from_the_kit(Path(kit))
    session = _quieted(Session(username=username, startup_path=str(kit), secure_mode=True), note)
    try:
        session.try_connect(timeout_s)
    except BaseException:
        session.close()
        raise
    return session


def _nvflare_config_from_the_kit(kit: Path) -> None:
    """NVIDIA FLARE reads its communication settings (``comm_config.json``) from the kit's ``local`` and
    ``startup`` folders, as its server and clients read theirs. Its admin client sets no such folders, and NVIDIA
    FLARE then looked for the file in the working directory and every folder below it, once per config format:
    about a second from this project's root, far longer from an operator's home or a network mount, and a
    ``comm_config.json`` anywhere below the working directory set up the admin's connection."""
    from nvflare.fuel.utils.config_service import ConfigService

    folders = [str(kit / name) for name in ("local", "startup") if (kit / name).is_dir()]
    if folders:
        ConfigService.initialize(section_files={}, config_path=folders)


def _quieted(session, note: Callable[[str], None] | None):
    """``session`` with its admin client's prints (its one way out: ``_print_hci``) sent to ``note``, and so each
    session it opens itself (``shutdown`` polls the stopping server with sessions of their own)."""
    session.api._print_hci = note or (lambda line: None)
    opens = session._new_poll_session
    session._new_poll_session = lambda: _quieted(opens(), note)
    return session


class _NvflareRootRecords(logging.Filter):
    def __init__(self):
        super().__init__()
        import nvflare

        self.package = str(Path(nvflare.__file__).parent)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.pathname.startswith(self.package):
            return True
        logging.getLogger("nvflare.admin").debug(record.getMessage())
        return False


def _drop_nvflare_root_tracebacks() -> None:
    root = logging.getLogger()
    if not any(isinstance(f, _NvflareRootRecords) for f in root.filters):
        root.addFilter(_NvflareRootRecords())


def _print_exc_to_debug(*_args, **_kwargs) -> None:
    logging.getLogger("nvflare.admin").debug(traceback.format_exc())


def _nvflare_printed_tracebacks_to_debug() -> None:
    from nvflare.fuel.hci.client import api
    from nvflare.private.fed import authenticator

    quieted = types.SimpleNamespace(**{**vars(traceback), "print_exc": _print_exc_to_debug})
    for module in (api, authenticator):
        module.traceback = quieted
