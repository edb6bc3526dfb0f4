"""``medreco deid SRC OUT``: de-identify a folder of DICOM files outside the DAG.

Writes ``OUT/files/<sop_key>.dcm``, ``OUT/ledger.parquet`` (one row per input file) and
``OUT/quarantine/<sha256>.json`` records; the ledger always balances.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path

import pydicom

from etl.build.ledger import balance
from etl.deid.dicom import DeidentificationError, deidentify_dataset
from etl.deid.policy import build_policy
from etl.keys import PseudonymKey
from etl.sources.discover import NON_INPUT_EXTENSIONS, classify_dicom
from schemas import ledger as ledger_schema
from schemas.base import table_from_rows
from schemas.config import DeidConfig


class DeidFolderError(ValueError):
    """Raised for an unusable pair of source and output folders."""


def deidentify_folder(src: Path, out: Path, key: PseudonymKey, institution: str = "local",
                      deid_cfg: DeidConfig | None = None) -> dict:
    """De-identify every file under ``src`` into ``out``; returns the ledger balance dict.

    Raises
    ------
    DeidFolderError
        when ``out`` lies inside ``src`` (a second run would re-read its own output).
    """
    import pyarrow.parquet as pq

    out, src = Path(out).resolve(), Path(src).resolve()
    if out == src or src in out.parents:
        raise DeidFolderError(f"output folder {out} lies inside the source folder {src}: choose another")
    (out / "files").mkdir(parents=True, exist_ok=True)
    cfg = deid_cfg or DeidConfig()
    policy = build_policy(cfg)
    rows: list[dict] = []
    seen: dict[str, str] = {}
    written: dict[str, str] = {}
    for path in sorted(p for p in Path(src).rglob("*") if p.is_file()):
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        row = {"run_id": "deid-cli", "source_uri": str(path), "sha256": sha, "bytes": len(data),
               "institution": institution, "kind": "dicom", "stage": "deidentify", "status": "ingested"}
        if path.name.lower().endswith(NON_INPUT_EXTENSIONS):
            row.update(kind="other", status="skipped", reason="not_an_input", stage="discover")
        elif sha in seen:
            row.update(status="duplicate", reason="same_content", duplicate_of=seen[sha], stage="discover")
        else:
            seen[sha] = str(path)
            _, reason, detail = classify_dicom(data)
            if reason:
                row.update(status="quarantined", reason=reason, detail=detail, stage="discover")
            else:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        result = deidentify_dataset(pydicom.dcmread(io.BytesIO(data), force=True), key, institution,
                                                    policy, pixel_cleaning=cfg.pixel_cleaning)
                        if result.sop_key in written:
                            raise DeidentificationError(
                                "duplicate_sop_instance_uid",
                                "another file of this folder has the same SOPInstanceUID and different content")
                        (out / "files" / f"{result.sop_key}.dcm").write_bytes(result.to_bytes())
                        written[result.sop_key] = str(path)
                except DeidentificationError as err:
                    row.update(status="quarantined", reason=err.reason, detail=str(err))
                except Exception as err:  # noqa: BLE001  fail closed on anything pydicom cannot handle
                    row.update(status="quarantined", reason="unreadable_dicom", detail=type(err).__name__)
        rows.append(row)
        if row["status"] == "quarantined":
            (out / "quarantine").mkdir(exist_ok=True)
            (out / "quarantine" / f"{sha}.json").write_text(json.dumps(row, indent=1, sort_keys=True))
    ledger = table_from_rows(rows, ledger_schema.SCHEMA)
    pq.write_table(ledger, out / "ledger.parquet")
    return balance(ledger)
