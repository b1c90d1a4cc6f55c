"""Secure aggregation's key exchange over NVIDIA FLARE: every site's X25519 public key travels through the
server signed with the site's consortium key, and every site checks every key against the consortium's
root CA, so the server (or anyone between) cannot substitute a key of its own and unmask a site.

A site's consortium identity is its startup kit (``startup/client.key``, ``client.crt``, ``rootCA.pem``,
what ``fedauc consortium provision`` wrote; inside a FLARE job ``collab.workspace.get_startup_kit_dir()``).
The signature covers the job id, the site's name and index and the public key, so a key is good for one
site in one job. The simulator has no consortium (no kit): its sites use per-run keys, unsigned, and a site
that has a kit never accepts an unsigned key. What is checked, for every site's key: the certificate was
issued by the site's own copy of the root CA and is valid now, it names the site the federation lists at
that index, and the signature verifies.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from common.errors import ConfigError
from federated.secure_aggregation import PUBLIC_KEY_BYTES, SecureAggregationError

KIT_FILES = ("client.key", "client.crt", "rootCA.pem")
# In the site's own log (its kit's workspace): what a hospital's reviewer reads to see that keys were checked.
log = logging.getLogger(__name__)


@dataclass
class ConsortiumIdentity:
    """A site's own key, certificate and the consortium's root CA, from its startup kit."""

    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    certificate: x509.Certificate
    root: x509.Certificate


def load_identity(startup_dir: str | Path) -> ConsortiumIdentity | None:
    """The identity in a kit's ``startup/`` folder; None where there is no kit (the simulator)."""
    startup = Path(startup_dir)
    present = [name for name in KIT_FILES if (startup / name).is_file()]
    if not present:
        return None
    if len(present) < len(KIT_FILES):
        missing = ", ".join(n for n in KIT_FILES if n not in present)
        raise ConfigError(f"{startup}: the startup kit lacks {missing}, so this site cannot sign its secure "
                          "aggregation key", fix="reinstall the hospital's kit from `fedauc consortium provision`")
    key = serialization.load_pem_private_key((startup / "client.key").read_bytes(), password=None)
    return ConsortiumIdentity(key, x509.load_pem_x509_certificate((startup / "client.crt").read_bytes()),
                              x509.load_pem_x509_certificate((startup / "rootCA.pem").read_bytes()))


def _message(job_id: str, site: str, index: int, public_key: bytes) -> bytes:
    return b"\n".join([b"fedauc secure aggregation key v1", job_id.encode(), site.encode(), str(index).encode(),
                       public_key])


def _sign(key, message: bytes) -> bytes:
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(message, padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.DIGEST_LENGTH), hashes.SHA256())
    return key.sign(message, ec.ECDSA(hashes.SHA256()))


def _verify(public, signature: bytes, message: bytes) -> None:
    if isinstance(public, rsa.RSAPublicKey):
        public.verify(signature, message, padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.DIGEST_LENGTH),
                      hashes.SHA256())
    else:
        public.verify(signature, message, ec.ECDSA(hashes.SHA256()))


@dataclass
class SiteKeys:
    """One site's side of the exchange in job ``job_id`` of the federation ``site_names`` (in site order)."""

    identity: ConsortiumIdentity | None
    job_id: str
    site_names: list[str]

    def signed(self, index: int, public_key: bytes) -> dict:
        """What site ``index`` sends the server: its public key, certificate and signature."""
        name = self.site_names[index]
        if self.identity is None:
            return {"site": name, "public_key": public_key, "certificate": None, "signature": None}
        return {"site": name, "public_key": public_key,
                "certificate": self.identity.certificate.public_bytes(serialization.Encoding.PEM),
                "signature": _sign(self.identity.key, _message(self.job_id, name, index, public_key))}

    def verified(self, entries: list[dict], now: dt.datetime | None = None) -> list[bytes]:
        """Every site's public key, in site order, once each has passed the checks; refuses otherwise."""
        if len(entries) != len(self.site_names):
            raise SecureAggregationError(f"the server returned {len(entries)} secure aggregation keys for "
                                         f"{len(self.site_names)} sites; the job stops")
        keys = [self._check(index, entry, now or dt.datetime.now(dt.timezone.utc)) for index, entry in enumerate(entries)]
        log.info("secure aggregation, job %s: %s", self.job_id,
                 "the simulator's per-run public keys (no consortium kit here)" if self.identity is None else
                 f"the public keys of {len(keys)} sites verified against the consortium's root CA "
                 f"({self.identity.root.subject.rfc4514_string()})")
        return keys

    def _check(self, index: int, entry: dict, now: dt.datetime) -> bytes:
        name = self.site_names[index]
        public_key = entry.get("public_key")

        def refuse(why: str) -> SecureAggregationError:
            return SecureAggregationError(
                f"secure aggregation: the public key given for site {name!r} (index {index}) is refused: {why}; "
                "the server or the network altered the key exchange, so this site sends nothing and the job stops",
                fix="ask the consortium's operator to check the server; restart the job once it is trusted")

        if entry.get("site") != name:
            raise refuse(f"it is labelled as site {entry.get('site')!r}")
        if not isinstance(public_key, bytes) or len(public_key) != PUBLIC_KEY_BYTES:
            raise refuse("it is not a 32-byte X25519 key")
        if self.identity is None:
            return public_key  # the simulator: one machine, per-run keys, no consortium to sign with
        if entry.get("certificate") is None or entry.get("signature") is None:
            raise refuse("it is not signed (this site belongs to a consortium and accepts signed keys only)")
        try:
            certificate = x509.load_pem_x509_certificate(entry["certificate"])
            certificate.verify_directly_issued_by(self.identity.root)
        except (ValueError, TypeError, InvalidSignature):
            raise refuse("its certificate was not issued by this consortium's root CA") from None
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise refuse(f"its certificate is not valid now (valid {certificate.not_valid_before_utc:%Y-%m-%d} to "
                         f"{certificate.not_valid_after_utc:%Y-%m-%d})")
        names = [a.value for a in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        if names != [name]:
            raise refuse(f"its certificate belongs to {', '.join(map(str, names)) or 'no one'}")
        try:
            _verify(certificate.public_key(), entry["signature"], _message(self.job_id, name, index, public_key))
        except InvalidSignature:
            raise refuse("its signature does not verify (the key, the job or the site index was changed)") from None
        return public_key
