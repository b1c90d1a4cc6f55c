"""What a site tells the centre when its part of a job fails: one line that names no path.

NVFlare's collab call answers an exception with its message and full traceback (the site's file paths, its
shard folder in a ``DataError``) to the server. A site-published function therefore never raises: it logs
the traceback in the site's own log, sends the server one redacted line (``site_failed``, so the other
sites stop waiting at once) and returns ``{FAILED: line}`` for the server to fail the job with.
"""

from __future__ import annotations

import logging
import re

from nvflare.collab import collab

from federated.flare.protocol import FAILED

# Seconds the failure report may take to reach the server.
REPORT_TIMEOUT_S = 30.0
# Absolute POSIX, home-relative and Windows paths (not "and/or" or "3/4": no word character before).
_PATH = re.compile(r"(?<![\w.])(?:~|[A-Za-z]:)?[/\\][^\s'\"`,;:()\[\]{}<>]+")

_log = logging.getLogger(__name__)


def redact(text: str) -> str:
    return _PATH.sub("<path at the site>", text)


def failure_line(err: BaseException) -> str:
    """``err`` as one line, its fix included, with every path replaced."""
    text = " ".join(str(err).split())
    return redact(f"{type(err).__name__}: {text}" if text else type(err).__name__)


def report_failure(site: str, err: BaseException) -> dict:
    """Log ``err`` here, tell the server in one line, and the result the site-published function returns."""
    line = failure_line(err)
    _log.exception("fedauc site %s failed: %s", site, line)
    collab.server(timeout=REPORT_TIMEOUT_S, optional=True).site_failed(site, line)
    return {FAILED: line}
