"""The build context every stage receives: configuration, storage root, key and run id, plus zone paths."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

from etl import zones
from etl.keys import PseudonymKey, load_key
from etl.storage import Storage
from schemas.config import PROJECT_ROOT, PipelineConfig, load_config
from schemas.errors import ReasonCodedError

EVENT_SCHEMA = pa.schema(
    [
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # ingested | quarantined
        pa.field("reason", pa.string()),
        pa.field("detail", pa.string()),
        pa.field("sop_key", pa.string()),
        pa.field("study_key", pa.string()),
    ]
)


KEY_FINGERPRINT_FILE = zones.KEY_FINGERPRINT_FILE


#: what the curated tables are a function of besides their inputs: the code and data files of these
#: project folders (``config/`` holds the rule and template data files stages read)
CODE_FOLDERS = ("etl", "schemas", "entity_extraction", "config", "reader/src/medreco_reader")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".txt", ".csv", ".tsv", ".jsonl")


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 (hex) over the paths and bytes of the project's code and data files (:data:`CODE_FOLDERS`).

    Part of :meth:`BuildContext.build_fingerprint`: an edit to the code invalidates every shard's
    incremental state, so the next run rebuilds in full rather than mixing outputs of two code versions.
    """
    root = PROJECT_ROOT
    h = hashlib.sha256()
    for folder in CODE_FOLDERS:
        for f in sorted((root / folder).rglob("*")):
            if f.is_file() and f.suffix in CODE_SUFFIXES and "__pycache__" not in f.parts:
                h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class KeyMismatchError(ReasonCodedError, RuntimeError):
    """Raised when a storage root built with one pseudonymisation key is run with another."""

    default_reason = "key_mismatch"
    message_format = "{message}"


def safe_run_id(run_id: str) -> str:
    """A run id usable as a path segment (Airflow run ids contain ':' and '+')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("_") or "run"


@dataclass
class BuildContext:
    """Everything a stage needs. Build with :meth:`from_config_file` inside each task (cheap)."""

    cfg: PipelineConfig
    storage: Storage
    key: PseudonymKey
    run_id: str

    @classmethod
    def from_config_file(cls, path: str | Path, run_id: str, key: PseudonymKey | None = None) -> BuildContext:
        """Load and validate the config, open the storage root, load the key (refusing a missing one)."""
        cfg = load_config(path)
        return cls.from_config(cfg, run_id, key)

    @classmethod
    def from_config(cls, cfg: PipelineConfig, run_id: str, key: PseudonymKey | None = None) -> BuildContext:
        """As :meth:`from_config_file` for an already validated config."""
        return cls(cfg=cfg, storage=Storage.from_config(cfg), key=key or load_key(), run_id=safe_run_id(run_id))

    def check_key(self) -> None:
        """Bind the storage root to the key's (non-secret) fingerprint on first use; refuse another key later.

        Pseudonyms, UIDs and date shifts all derive from the key: mixing keys in one root would split
        every patient in two.

        Raises
        ------
        KeyMismatchError
            when the root was built with a different key.
        """
        fp = self.key.fingerprint()
        if self.storage.is_file(KEY_FINGERPRINT_FILE):
            known = json.loads(self.storage.read_text(KEY_FINGERPRINT_FILE))["fingerprint"]
            if known != fp:
                raise KeyMismatchError(
                    f"this storage root ({self.storage.uri}) was built with pseudonymisation key fingerprint {known}, "
                    f"but the key given has fingerprint {fp}: set the original key, or use a new storage root"
                )
        else:
            self.storage.write_text(KEY_FINGERPRINT_FILE, json.dumps({"fingerprint": fp}))

    def build_fingerprint(self) -> str:
        """sha256 (hex) of what every curated output depends on besides its input files: the config hash
        (storage location excluded), the key's fingerprint and :func:`code_fingerprint`."""
        parts = (self.cfg.config_hash(), self.key.fingerprint(), code_fingerprint())
        return hashlib.sha256("|".join(parts).encode()).hexdigest()

    # ---- zone paths (root-relative) -------------------------------------------------------------
    @property
    def run_dir(self) -> str:
        """Restricted per-run working folder under the ledger zone."""
        return zones.run_dir(self.run_id)

    def plan_path(self, institution: str | None = None) -> str:
        """The merged plan, or one institution's discovery output."""
        return zones.run_plan(self.run_id, institution)

    def events_path(self, stage: str, shard: int | None = None) -> str:
        """Per-stage outcome events (restricted: names source files)."""
        return zones.run_events(self.run_id, stage, shard)

    def audit_path(self, stage: str, shard: int) -> str:
        """Per-shard de-identification audit counts (JSON, PHI-free)."""
        return zones.run_audit(self.run_id, stage, shard)

    @staticmethod
    def table_path(table: str, shard: int) -> str:
        """One shard partition of a curated table."""
        return zones.curated_partition(table, shard)

    @staticmethod
    def dicom_dir(shard: int) -> str:
        """De-identified DICOM files of one shard."""
        return zones.curated_dicom(shard)

    @property
    def ledger_path(self) -> str:
        """This run's ledger."""
        return zones.ledger_file(self.run_id)

    @property
    def inputs_ledger_path(self) -> str:
        """This run's clean-view ledger: every input file with the outcome a clean build of everything under
        the sources gives it (re-delivered files included), which the snapshot's input lineage hashes."""
        return zones.inputs_file(self.run_id)

    @staticmethod
    def stage_state_path(stage: str, shard: int) -> str:
        """Incremental state of one per-shard stage: the digest of the inputs its outputs were built from."""
        return zones.incremental_state(stage, shard)

    @property
    def quarantine_dir(self) -> str:
        """This run's quarantine records."""
        return zones.quarantine_dir(self.run_id)
