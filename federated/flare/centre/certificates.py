"""Certificates that do not stop the consortium: when each kit's certificate and the root CA expire, a
warning ``WARN_BEFORE`` ahead, and the renewal of every kit from the same identities.

Renewal keeps the root CA's key (and its name): a root certificate re-issued for that key verifies every
certificate the old one signed and the old one verifies every certificate the new one signs, so hospitals
change kits one at a time, each when it restarts, with the server on either kit. The participants keep their
names, organisations and roles (the project file ``provision`` wrote); NVIDIA FLARE's own ``CertBuilder``
issues their new certificates (with new keys) and ``SignatureBuilder`` signs the new kits.

NVIDIA FLARE takes a root's validity in whole days (``root_valid_days``) and caps every participant's at the
root's; a root valid for minutes (``provision(..., root_valid_for=...)``, for tests) is made here with
NVIDIA FLARE's own ``generate_cert``, and the participants' certificates follow it. The renewal itself is
``provision.renew``.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from federated.flare.lockdown import write_owner_only

WARN_BEFORE = dt.timedelta(days=30)
ROOT_VALID = dt.timedelta(days=360)
STATE_FILE = "cert.json"  # NVIDIA FLARE's provisioning state: the root CA and every participant's key and certificate
ROOT_KEYS = ("root_cert", "root_pri_key")


def issue_root(name: str, key, valid_for: dt.timedelta) -> dict:
    """The provisioning state's root entries for a root certificate of ``name`` and ``key`` valid ``valid_for``."""
    from nvflare.lighter.utils import Identity, generate_cert, serialize_cert, serialize_pri_key

    cert = generate_cert(Identity(name), Identity(name), key, key.public_key(),
                         valid_days=valid_for / dt.timedelta(days=1), ca=True)
    return {"root_cert": serialize_cert(cert).decode("ascii"), "root_pri_key": serialize_pri_key(key).decode("ascii")}


def seed_root(state_dir: Path, name: str, valid_for: dt.timedelta) -> None:
    """A new root CA of ``valid_for`` in an empty provisioning state (NVIDIA FLARE's would be whole days)."""
    from nvflare.lighter.utils import generate_keys

    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_owner_only(state_dir / STATE_FILE, json.dumps(issue_root(name, generate_keys()[0], valid_for)))


def stored_root(state_dir: Path) -> tuple[bytes, object] | None:
    """The provisioning state's root certificate (PEM) and private key, None before the first provisioning."""
    from cryptography.hazmat.primitives import serialization

    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    return state["root_cert"].encode("ascii"), serialization.load_pem_private_key(state["root_pri_key"].encode("ascii"), None)


def _expiry(pem: Path) -> dt.datetime:
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.read_bytes()).not_valid_after_utc


def kit_expiries(prod: Path) -> dict[str, dt.datetime]:
    """When each kit's certificate in provisioning folder ``prod`` expires (by kit name), and the root CA's
    (``root CA``)."""
    found: dict[str, dt.datetime] = {}
    for kit in sorted(p for p in Path(prod).iterdir() if (p / "startup").is_dir()):
        for name in ("server.crt", "client.crt"):
            if (kit / "startup" / name).is_file():
                found[kit.name] = _expiry(kit / "startup" / name)
                break
        if "root CA" not in found and (kit / "startup" / "rootCA.pem").is_file():
            found["root CA"] = _expiry(kit / "startup" / "rootCA.pem")
    return found


def expiry_warnings(expiries: dict[str, dt.datetime], now: dt.datetime | None = None,
                    within: dt.timedelta = WARN_BEFORE) -> list[str]:
    """One line per certificate that expires within ``within`` (or has expired), soonest first."""
    now = now or dt.datetime.now(dt.timezone.utc)
    lines = []
    for name, when in sorted(expiries.items(), key=lambda item: item[1]):
        if when - now > within:
            continue
        what = "the root CA" if name == "root CA" else f"kit {name}'s certificate"
        state = "expired" if when <= now else "expires"
        lines.append(f"warning: {what} {state} on {when:%Y-%m-%d %H:%M} UTC; renew every kit with "
                     "`fedauc consortium renew --out <provisioning folder>` and send each its new kit")
    return lines
