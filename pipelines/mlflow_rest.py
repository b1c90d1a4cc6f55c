"""An MLflow tracking server read over its REST API with the standard library, for the daily commands that only
read (``fedauc compare``): importing MLflow takes over a second, an HTTP request to the server a few
milliseconds. MLflow's REST API (https://mlflow.org/docs/latest/rest-api.html): ``experiments/get-by-name``,
``runs/search`` paged by its ``next_page_token``.

Credentials and TLS are taken as MLflow's own client takes them (mlflow/utils/credentials.py,
mlflow/utils/rest_utils.py): MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (else the ``[mlflow]``
section of ~/.mlflow/credentials) as HTTP basic auth, else MLFLOW_TRACKING_TOKEN as a bearer token;
MLFLOW_TRACKING_INSECURE_TLS, MLFLOW_TRACKING_SERVER_CERT_PATH (a CA bundle), MLFLOW_TRACKING_CLIENT_CERT_PATH
(a PEM with the certificate and its key), MLFLOW_HTTP_REQUEST_TIMEOUT, MLFLOW_WORKSPACE. An auth plugin
(MLFLOW_TRACKING_AUTH, MLFLOW_TRACKING_AWS_SIGV4) only MLflow can sign with, or credentials in the URI:
``reads_over_http`` is false and the caller uses MLflow's client. Unlike MLflow's client this reader does not
retry: a server that is down, or refuses, is one line at once (MLflow's retries with back-off take minutes
before they say so).
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from common.errors import FedaucError

SEARCH_PAGE = 1000  # runs per runs/search request (the server allows up to 50,000)
_TRUE = ("true", "1")


class TrackingServerError(FedaucError):
    """The MLflow server did not answer, or refused, a request: which server, which request, why."""


def reads_over_http(uri: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``uri`` is an MLflow server this module reads: http or https, no auth plugin in the way, and no
    credentials inside the URI (MLflow's client sends those; this module would print them in its errors)."""
    return (uri.startswith(("http://", "https://")) and urllib.parse.urlsplit(uri).username is None
            and not environ.get("MLFLOW_TRACKING_AUTH") and environ.get("MLFLOW_TRACKING_AWS_SIGV4", "").lower() not in _TRUE)


def _credentials_file() -> configparser.SectionProxy | dict:
    config = configparser.ConfigParser()
    config.read(Path("~/.mlflow/credentials").expanduser())
    return config["mlflow"] if config.has_section("mlflow") else {}


def request_headers(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The headers MLflow's client sends for the credentials in ``environ``: basic auth where a username and a
    password are given, else a bearer token; the workspace where one is named."""
    saved = _credentials_file()
    username = environ.get("MLFLOW_TRACKING_USERNAME") or saved.get("mlflow_tracking_username")
    password = environ.get("MLFLOW_TRACKING_PASSWORD") or saved.get("mlflow_tracking_password")
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if username and password:
        headers["Authorization"] = "Basic " + base64.standard_b64encode(f"{username}:{password}".encode()).decode()
    elif environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {environ['MLFLOW_TRACKING_TOKEN']}"
    if (environ.get("MLFLOW_WORKSPACE") or "").strip():
        headers["X-MLFLOW-WORKSPACE"] = environ["MLFLOW_WORKSPACE"].strip()
    return headers


def tls_context(environ: Mapping[str, str] = os.environ) -> ssl.SSLContext:
    insecure = environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in _TRUE
    ca_bundle, client_cert = environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH"), environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH")
    if insecure and ca_bundle:
        raise TrackingServerError("MLFLOW_TRACKING_INSECURE_TLS and MLFLOW_TRACKING_SERVER_CERT_PATH are both set",
                                  fix="set only one of them (as MLflow's own client requires)")
    try:
        context = ssl.create_default_context(cafile=ca_bundle)
        if client_cert:
            context.load_cert_chain(client_cert)
    except OSError as err:  # a missing or unreadable PEM
        raise TrackingServerError(f"the MLflow server's TLS files ({ca_bundle or ''} {client_cert or ''}): {err}",
                                  fix="fix MLFLOW_TRACKING_SERVER_CERT_PATH / MLFLOW_TRACKING_CLIENT_CERT_PATH") from None
    if insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


class TrackingServer:
    """One MLflow server at ``uri`` (``http(s)://host:port[/prefix]``), read with the credentials of ``environ``."""

    def __init__(self, uri: str, environ: Mapping[str, str] = os.environ):
        self.uri = uri.rstrip("/")
        self.headers = request_headers(environ)
        self.context = tls_context(environ) if uri.startswith("https://") else None
        self.timeout_s = float(environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 120)

    def call(self, endpoint: str, body: dict | None = None, query: dict | None = None) -> dict:
        """The JSON answer of ``/api/2.0/mlflow/<endpoint>`` (POST ``body``, else GET with ``query``)."""
        url = f"{self.uri}/api/2.0/mlflow/{endpoint}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        request = urllib.request.Request(url, None if body is None else json.dumps(body).encode(), self.headers,
                                         method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise _refused(self.uri, endpoint, err) from None
        except (OSError, ValueError) as err:  # refused or timed out, TLS, not JSON (not an MLflow server)
            reason = getattr(err, "reason", None) or err
            raise TrackingServerError(f"MLflow server {self.uri} did not answer {endpoint}: {reason}",
                                      fix="check MLFLOW_TRACKING_URI and that the server runs "
                                          "(`systemctl status fedauc-mlflow` at the centre)") from None

    def experiment_id(self, name: str) -> str | None:
        """The id of the experiment named ``name``, None where the server has none."""
        try:
            return self.call("experiments/get-by-name", query={"experiment_name": name})["experiment"]["experiment_id"]
        except _NoSuchResource:
            return None

    def search_runs(self, experiment_ids: list[str], filter_string: str) -> list[dict]:
        """Every active run of the experiments that ``filter_string`` selects, in the server's order (newest
        first), as the REST API gives them (``{"info": {...}, "data": {"metrics": [...], ...}}``)."""
        runs, token = [], None
        while True:
            page = self.call("runs/search", {"experiment_ids": experiment_ids, "filter": filter_string,
                                             "max_results": SEARCH_PAGE, **({"page_token": token} if token else {})})
            runs.extend(page.get("runs", []))
            token = page.get("next_page_token")
            if not token:
                return runs


class _NoSuchResource(TrackingServerError):
    pass


def _refused(uri: str, endpoint: str, err: urllib.error.HTTPError) -> TrackingServerError:
    """The server's error as one line: its error code and message where it sent MLflow's JSON error."""
    try:
        detail = json.loads(err.read())
    except ValueError:
        detail = {}
    said = f"{detail.get('error_code', f'HTTP {err.code}')}: {detail.get('message', err.reason)}".splitlines()[0]
    if detail.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
        return _NoSuchResource(f"MLflow server {uri}, {endpoint}: {said}")
    fix = ("set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, to an account of "
           "the server" if err.code in (401, 403) else "read the MLflow server's log")
    return TrackingServerError(f"MLflow server {uri} refused {endpoint}: {said}", fix=fix)
