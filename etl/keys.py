"""Keyed pseudonyms, UID remapping and per-patient date shifts (HMAC-SHA256).

The secret comes from the deployment, never from the config file or a log:

1. environment variable ``MEDRECO_PSEUDONYM_KEY`` (hex or any string of >= 32 characters), or
2. the Airflow connection ``medreco_pseudonym`` (its password field), looked up only when the
   environment variable is absent and Airflow is importable.

Only the demo (``medreco demo`` / ``make demo``) may generate a local key file; every other run
refuses to start without a key (:class:`MissingKeyError`).

All derivations are domain separated (``kind``) so a patient pseudonym can never equal a study
pseudonym of the same raw string. The same secret and input always give the same output, across
institutions and runs.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from schemas.errors import ReasonCodedError

ENV_VAR = "MEDRECO_PSEUDONYM_KEY"
AIRFLOW_CONN_ID = "medreco_pseudonym"
MIN_KEY_CHARS = 32
#: maximum magnitude of the per-patient date shift, days (shift is in [-MAX, -1] U [1, MAX]).
MAX_DATE_SHIFT_DAYS = 365


class MissingKeyError(ReasonCodedError, RuntimeError):
    """Raised when no pseudonymisation secret is configured."""

    default_reason = "missing_key"
    message_format = "{message}"


@dataclass(frozen=True)
class PseudonymKey:
    """An HMAC-SHA256 key for pseudonyms. ``repr`` never shows the secret."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise MissingKeyError("pseudonymisation secret is too short (need at least 16 bytes)")

    def digest(self, kind: str, value: str) -> bytes:
        """32-byte HMAC-SHA256 of ``kind`` and ``value`` (domain separated by a NUL byte)."""
        return hmac.new(self.secret, f"{kind}\x00{value}".encode(), hashlib.sha256).digest()

    def pseudonym(self, kind: str, value: str, length: int = 16) -> str:
        """Opaque hex pseudonym of ``length`` hex characters (default 64 bits) for ``value``.

        ``kind`` is e.g. ``"patient"``, ``"study"``, ``"accession"``; the institution id should be
        part of ``value`` for identifiers that are only unique within an institution.
        """
        return self.digest(kind, value).hex()[:length]

    def uid(self, original_uid: str) -> str:
        """New DICOM UID in the ``2.25.<integer>`` form (PS3.5 B.2) derived from the keyed hash.

        The integer is the first 128 bits of the HMAC, so it is at most 39 digits and the UID at most
        44 characters (< 64, the UI limit). One original UID always maps to the same new UID.
        """
        n = int.from_bytes(self.digest("uid", original_uid.strip())[:16], "big")
        return f"2.25.{n}"

    def date_shift_days(self, patient_key: str) -> int:
        """Per-patient date offset in days, in ``[-365, -1] U [1, 365]``, never 0.

        Derived from the patient pseudonym (itself keyed), so every stage that knows a patient_key
        (images, reports) applies the same offset without ever seeing the raw PatientID.

        Every date of one patient moves by the same offset, so intervals between a patient's studies
        are preserved exactly (PS3.15 E.3.6, Retain Longitudinal Temporal Information with Modified Dates).
        """
        n = int.from_bytes(self.digest("date-shift", patient_key)[:8], "big")
        magnitude = 1 + n % MAX_DATE_SHIFT_DAYS
        return -magnitude if (n >> 32) & 1 else magnitude

    def shard(self, patient_key: str, shard_count: int) -> int:
        """Shard index in ``[0, shard_count)`` for a patient pseudonym."""
        return int.from_bytes(hashlib.sha256(patient_key.encode()).digest()[:8], "big") % shard_count

    def fingerprint(self) -> str:
        """A short non-secret fingerprint of the key (sha256 of an HMAC of a constant), for manifests."""
        return hashlib.sha256(self.digest("fingerprint", "medreco")).hexdigest()[:12]


def _from_airflow() -> str | None:
    try:
        from airflow.sdk import Connection  # noqa: F401  (only where Airflow is installed)
        from airflow.sdk.bases.hook import BaseHook
    except Exception:  # noqa: BLE001  Airflow absent or not configured
        return None
    try:
        return BaseHook.get_connection(AIRFLOW_CONN_ID).password or None
    except Exception:  # noqa: BLE001  no such connection
        return None


def _decode(raw: str) -> bytes:
    raw = raw.strip()
    if len(raw) < MIN_KEY_CHARS:
        raise MissingKeyError(
            f"pseudonymisation secret in {ENV_VAR} is too short ({len(raw)} characters, need >= {MIN_KEY_CHARS})"
        )
    try:
        return bytes.fromhex(raw)
    except ValueError:
        return raw.encode("utf-8")


def load_key(*, allow_airflow: bool = True) -> PseudonymKey:
    """Load the pseudonymisation secret from the environment or the Airflow connection.

    Raises
    ------
    MissingKeyError
        if neither ``MEDRECO_PSEUDONYM_KEY`` nor the ``medreco_pseudonym`` connection is set.
    """
    raw = os.environ.get(ENV_VAR)
    if not raw and allow_airflow:
        raw = _from_airflow()
    if not raw:
        raise MissingKeyError(
            f"no pseudonymisation secret: set {ENV_VAR} (>= {MIN_KEY_CHARS} characters) or the Airflow "
            f"connection '{AIRFLOW_CONN_ID}'; refusing to run without one"
        )
    return PseudonymKey(_decode(raw))


def demo_key(path: Path) -> str:
    """Create (once) and return a local demo secret stored at ``path`` (mode 0600). Demo only."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


# ---- patient identifiers ---------------------------------------------------------------------------------


def normalise_patient_id(value: str) -> str:
    """PatientID (or issuer) as compared across deliveries: trailing ``^`` and padding removed, inner
    whitespace collapsed, upper case. ``" ab 12^ "`` and ``"AB 12"`` are one patient."""
    return re.sub(r"\s+", " ", str(value).strip().rstrip("^").strip()).upper()


def patient_value(institution: str, patient_id: str, issuer: str | None = None) -> str:
    """The string pseudonymised for a patient: institution, issuer of the ID, normalised PatientID.

    PatientID is unique only within its issuer, and issuers only within an institution's namespace.
    """
    return f"{institution}|{normalise_patient_id(issuer or '')}|{normalise_patient_id(patient_id)}"


def patient_key_for(key: PseudonymKey, institution: str, patient_id: str, issuer: str | None = None) -> str:
    """The patient pseudonym (HMAC-SHA256, 64 bits hex) used everywhere: tables, shards, date shifts."""
    return key.pseudonym("patient", patient_value(institution, patient_id, issuer))
