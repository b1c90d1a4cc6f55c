"""The PACS over DICOMweb (DICOM PS3.18) through ``dicomweb-client``: what the scoring job asks of it.

QIDO-RS finds studies (by StudyDate and ModalitiesInStudy) and their series (Modality, BodyPartExamined,
ViewPosition, NumberOfSeriesRelatedInstances); WADO-RS retrieves one series at a time with
``transfer-syntax=*``, the instances as the PACS stores them (no transcoding: fedauc's own decoder reads
them, as ``fedauc predict`` does), streamed part by part into a folder; STOW-RS stores an SR.

A series counts as retrieved only whole: as many instances as the PACS's own count for it, each parsed,
and the multipart body closed by its close-delimiter (RFC 2046). dicomweb-client hands over what follows
the last delimiter as a part even when the body stops short (a PACS that fails to transcode mid-stream ends
its 200 answer so), hence the response hook here. Anything else is ``StudyNotRetrieved``.

A PACS that cannot be used at all (credentials refused, no connection, a name that does not resolve, TLS
failing, no answer in time, a server error to a search) is ``PacsUnavailable``: one line naming the PACS and
what to check; no study UID. Transient failures are retried by dicomweb-client (``ATTEMPTS`` tries,
exponential wait) before that.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import pydicom
import requests
from dicomweb_client import DICOMwebClient
from pydicom.errors import InvalidDicomError
from urllib3.exceptions import NameResolutionError

from common.errors import FedaucError

ATTEMPTS = 3
PAGE = 500  # QIDO-RS results per request
_AS_STORED = (("application/dicom", "*"),)
_TRANSIENT = (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.REQUEST_TIMEOUT, HTTPStatus.BAD_GATEWAY,
              HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.GATEWAY_TIMEOUT)
_SERIES_FIELDS = ["Modality", "BodyPartExamined", "ViewPosition", "NumberOfSeriesRelatedInstances",
                  "SeriesDescription"]


class PacsUnavailable(FedaucError):
    """The PACS cannot be used this run: nothing was scored after this, and nothing half-stored. The message names
    the PACS's address and user for the hospital's operator; ``without_address`` is what may leave the site."""

    def __init__(self, message: str, address: str = "", user: str | None = None):
        super().__init__(message)
        self.address, self.user = address, user

    def without_address(self) -> str:
        text = str(self)
        if self.user:
            text = text.replace(f"user {self.user!r}", "the user in pacs.username")
        return text.replace(self.address, "<pacs.url>") if self.address else text


class StudyNotRetrieved(Exception):
    """One study could not be retrieved whole; ``reason`` says why without naming it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _CloseDelimiter:
    """A requests response hook: records whether a multipart body ended with its close-delimiter."""

    def __init__(self):
        self.closed = True

    def __call__(self, response: requests.Response, *args, **kwargs) -> requests.Response:
        self.closed = True  # until a multipart body starts
        media_type, *parameters = [p.strip() for p in response.headers.get("Content-Type", "").split(";")]
        boundary = next((p.split("=", 1)[1].strip('"') for p in parameters if p.lower().startswith("boundary=")),
                        None)
        if media_type.lower() != "multipart/related" or boundary is None:
            return response
        end = f"--{boundary}--".encode()
        read, watch = response.iter_content, self
        watch.closed = False

        def iter_content(chunk_size=1, decode_unicode=False) -> Iterator[bytes]:
            tail = b""
            for chunk in read(chunk_size, decode_unicode):
                tail = (tail + chunk)[-(len(end) + 8):]  # the delimiter, then at most a short epilogue (CRLF)
                yield chunk
            watch.closed = end in tail

        response.iter_content = iter_content
        return response


class Pacs:
    """One DICOMweb root, with a user and password or none."""

    def __init__(self, url: str, auth: tuple[str, str] | None = None, timeout_s: float = 60.0,
                 password_env: str | None = None):
        self.url, self.user, self.password_env, self.timeout_s = url.rstrip("/"), auth and auth[0], password_env, timeout_s
        session = requests.Session()
        session.auth = auth
        self._body = _CloseDelimiter()
        session.hooks["response"].append(self._body)
        self.client = DICOMwebClient(self.url, session=session, timeout=timeout_s)
        self.client.set_http_retry_params(max_attempts=ATTEMPTS, wait_exponential_multiplier=500,
                                          retriable_error_codes=_TRANSIENT)

    def studies(self, since: dt.date, modalities: list[str]) -> list[dict]:
        """Studies dated ``since`` or later holding one of ``modalities``: per study its UID and StudyDate."""
        # PS3.18 8.3.4.1: several values of one attribute are given comma-separated.
        filters = {"StudyDate": f"{since:%Y%m%d}-", "ModalitiesInStudy": ",".join(modalities)}
        try:
            found = _every_page(self.client.search_for_studies, "0020000D", search_filters=filters,
                                fields=["StudyDate", "ModalitiesInStudy"])
        except (requests.RequestException, ValueError) as err:
            raise self.unavailable(err, "a study search") from None
        wanted = set(modalities)
        return [{"study": _value(entry, "0020000D"), "date": _value(entry, "00080020")} for entry in found
                if wanted & set(entry.get("00080061", {}).get("Value", wanted))]  # PACS that ignore the filter

    def series(self, study: str) -> list[dict]:
        """The study's series: UID, Modality, BodyPartExamined, ViewPosition, instance count, description."""
        try:
            found = _every_page(self.client.search_for_series, "0020000E", study, fields=_SERIES_FIELDS)
        except requests.HTTPError as err:
            self._unless_refused(err)
            raise StudyNotRetrieved(f"its series search answered HTTP {err.response.status_code}") from None
        except (requests.RequestException, ValueError) as err:
            raise self.unavailable(err, "a series search") from None
        return [{"series": _value(e, "0020000E"), "modality": _value(e, "00080060").upper(),
                 "body_part": _value(e, "00180015").upper(), "view": _value(e, "00185101").upper(),
                 "instances": int(_value(e, "00201209") or 0), "description": _value(e, "0008103E")} for e in found]

    def instances(self, study: str, series: str) -> list[dict]:
        """SOP Class and Instance UID and the instance number of each instance of a series."""
        try:
            found = _every_page(self.client.search_for_instances, "00080018", study, series,
                                fields=["SOPClassUID", "InstanceNumber"])
        except (requests.RequestException, ValueError) as err:
            raise self.unavailable(err, "an instance search") from None
        return [{"sop_class": _value(e, "00080016"), "sop": _value(e, "00080018"),
                 "number": int(_value(e, "00200013") or 0)} for e in found]

    def retrieve_series(self, study: str, series: dict, folder: Path) -> list[Path]:
        """Every instance of ``series`` (a ``series()`` entry) as stored, one file each in ``folder``, or
        ``StudyNotRetrieved``. One instance is in memory at a time, whatever the series' size."""
        paths = []
        try:
            for dataset in self.client.iter_series(study, series["series"], media_types=_AS_STORED):
                paths.append(folder / f"{series['series']}-{len(paths)}.dcm")
                dataset.save_as(paths[-1], enforce_file_format=True)
                del dataset  # before the next part is read: one instance in memory, not two
        except requests.HTTPError as err:
            self._unless_refused(err)
            raise StudyNotRetrieved(f"a series retrieval answered HTTP {err.response.status_code}") from None
        except (requests.ConnectionError, requests.Timeout) as err:
            raise StudyNotRetrieved(f"a series retrieval broke off ({type(err).__name__})") from None
        except (InvalidDicomError, EOFError, ValueError, KeyError, TypeError, OSError, IndexError) as err:
            raise StudyNotRetrieved(f"a series arrived with an unreadable instance ({type(err).__name__})") from None
        if not self._body.closed:
            raise StudyNotRetrieved("a series' body ended before its closing boundary")
        if len(paths) != series["instances"]:
            raise StudyNotRetrieved(f"a series arrived with {len(paths)} of its {series['instances']} instances")
        return paths

    def store(self, dataset: pydicom.Dataset) -> None:
        try:
            answer = self.client.store_instances([dataset])
        except requests.HTTPError as err:
            self._unless_refused(err)
            raise StudyNotRetrieved(f"storing its report answered HTTP {err.response.status_code}") from None
        except (requests.RequestException, ValueError) as err:
            raise self.unavailable(err, "storing a report") from None
        if answer.get("FailedSOPSequence"):
            raise StudyNotRetrieved("the PACS refused its report (FailedSOPSequence)")

    def _unless_refused(self, err: requests.HTTPError) -> None:
        if err.response is not None and err.response.status_code in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            raise self.unavailable(err, "a request") from None

    def unavailable(self, err: Exception, doing: str) -> PacsUnavailable:
        """One line naming the PACS, what failed and what to check."""
        return PacsUnavailable(self._unavailable_text(err, doing), self.url, self.user)

    def _unavailable_text(self, err: Exception, doing: str) -> str:
        where = f"the PACS at {self.url}"
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
            who = f"user {self.user!r}" if self.user else "a request without a user"
            check = (f"check pacs.username in the site YAML and the password in ${self.password_env}" if self.user
                     else "give the site YAML's pacs: block a username (and its password variable)")
            return f"{where} refused {who} (HTTP {status}): {check}"
        if status is not None:
            return f"{where} answered HTTP {status} to {doing} ({ATTEMPTS} tries): see the PACS's log"
        if isinstance(err, requests.exceptions.SSLError):
            return f"TLS with {where} failed: {_root_cause(err)}: check its certificate and REQUESTS_CA_BUNDLE"
        if isinstance(err, requests.Timeout):
            return (f"{where} did not answer {doing} within {self.timeout_s:g} s ({ATTEMPTS} tries): check the PACS, "
                    "or raise pacs.timeout_s")
        if isinstance(err, requests.ConnectionError):
            if any(isinstance(inner, NameResolutionError) for inner in _causes(err)):
                return f"the PACS host of {self.url} does not resolve: check pacs.url"
            return (f"{where} cannot be reached ({_root_cause(err)}): is it running, and are pacs.url's host and "
                    "port right?")
        return (f"{where} answered {doing} with something that is not DICOMweb ({_root_cause(err)}): check that "
                "pacs.url is the DICOMweb root")

def _every_page(search, key: str, *args, **kwargs) -> list[dict]:
    """Every result of a QIDO-RS search, a page at a time. dicomweb-client's ``get_remaining`` asks until a page
    is empty, which never comes from a PACS that ignores ``offset`` (Orthanc's DICOMweb 1.7 for series):
    here a short page or one that repeats ends it."""
    results, seen = [], set()
    while True:
        page = search(*args, limit=PAGE, offset=len(results), **kwargs)
        fresh = [entry for entry in page if _value(entry, key) not in seen]
        results.extend(fresh)
        seen.update(_value(entry, key) for entry in fresh)
        if len(page) < PAGE or len(fresh) < len(page):
            return results


def _value(entry: dict, tag: str) -> str:
    values = entry.get(tag, {}).get("Value") or [""]
    return str(values[0])


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the errors inside it (requests wraps urllib3's, which wraps the socket's)."""
    while isinstance(err, BaseException):
        yield err
        inner = getattr(err, "reason", None) or (err.args[0] if err.args else None)
        if inner is err:
            return
        err = inner


def _root_cause(err: BaseException) -> str:
    """The innermost reason of a requests/urllib3 error, in one short line."""
    *_, innermost = _causes(err)
    text = str(innermost) or type(innermost).__name__
    errno = re.search(r"\[Errno -?\d+\] ([^)\]]+)", text)  # "Connection refused", not urllib3's object dump
    return errno.group(1) if errno else text.splitlines()[0][:160]
