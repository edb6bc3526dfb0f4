"""``medreco deid SRC OUT``: de-identify a folder of DICOM files outside the DAG.

Writes ``OUT/files/<sop_key>.dcm`` (head CT/MR series defaced, :mod:`etl.deid.deface_series`),
``OUT/ledger.parquet`` (one row per input file, :data:`schemas.ledger.FOLDER_SCHEMA`: the build's columns plus
``output``, the de-identified file of an ingested input, and ``quarantine_record``, the record of a quarantined one,
both relative to OUT), ``OUT/deface_audit.json`` (figures per head series) and ``OUT/quarantine/<sha256>.json``
records (both restricted: 0600 files, an 0700 folder); the ledger always balances: no input file, however malformed,
stops the run (each is quarantined with a reason code).

The ledger is written atomically with the outputs, as in the build: a run writes everything into ``OUT/.staging/``
first; then the previous run's files, records and audit are removed, the ledger replaces ``OUT/ledger.parquet``
(``os.replace``: the commit) and the staged files are moved in. So at any moment, whatever kills the run, every file
under ``OUT/files`` and ``OUT/quarantine`` is named by a row of ``OUT/ledger.parquet`` (at worst a row's file is
missing): a run killed ahead of its commit leaves the previous run's ledger and outputs, and a re-run (which discards
a left-over ``OUT/.staging``) de-identifies the whole folder again and overwrites them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import pydicom

from etl.deid.deface_series import deface_written
from etl.deid.dicom import DeidentificationError, deidentify_dataset
from etl.deid.policy import build_policy
from etl.deid.series_text import SeriesTextGate
from etl.keys import PseudonymKey
from etl.limits import FILE_TIME_LIMIT_S, RecordLimitError, time_limit
from etl.pipeline.ledger import balance
from etl.sources.dicom_bounds import SourceBoundsError, bounded_source
from etl.sources.discover import NON_INPUT_EXTENSIONS, classify_dicom
from etl.storage import escape_name
from schemas import ledger as ledger_schema
from schemas.base import table_from_rows
from schemas.config import DeidConfig
from schemas.errors import ReasonCodedError
from schemas.ontology import infer_body_part

#: where a run writes its outputs until its ledger commits them (under OUT)
STAGING = ".staging"


class DeidFolderError(ReasonCodedError, ValueError):
    """Raised for an unusable pair of source and output folders."""

    default_reason = "deid_folder_invalid"
    message_format = "{message}"


def _write_private(path: Path, data: bytes) -> None:
    """Write a restricted file (0600 whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _series_uid(path: Path) -> str | None:
    """The SeriesInstanceUID of a DICOM file (header only), or None when it cannot be read."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(path, stop_before_pixels=True, force=True, specific_tags=["SeriesInstanceUID"])
        return str(ds.get("SeriesInstanceUID", "") or "").strip() or None
    except Exception:  # noqa: BLE001  unreadable here: de-identification quarantines it with its reason
        return None


def _entries(src: Path) -> list[tuple[Path, str | None]]:
    """Every path under ``src`` that is not a folder, sorted, with why it cannot be read as a file (None when
    it can): named pipes, sockets, devices and links to nothing are listed too, never opened."""
    out: list[tuple[Path, str | None]] = []
    for path in sorted(src.rglob("*"), key=lambda p: os.fsencode(p)):
        try:
            if path.is_dir():
                continue
            if path.is_file():
                out.append((path, None))
            elif path.is_symlink():
                out.append((path, "a symbolic link to nothing"))
            else:
                mode = path.lstat().st_mode
                kind = "named pipe" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device"
                out.append((path, f"not a regular file (a {kind})"))
        except OSError as err:
            out.append((path, f"cannot be inspected ({type(err).__name__})"))
    return out


def deidentify_folder(
    src: Path, out: Path, key: PseudonymKey, institution: str = "local", deid_cfg: DeidConfig | None = None
) -> dict:
    """De-identify every file under ``src`` into ``out``; returns the ledger balance dict. Burned-in text is
    read per series (:class:`etl.deid.series_text.SeriesTextGate`): each series' sample first, if the policy has one.

    Raises
    ------
    DeidFolderError
        when ``out`` lies inside ``src`` (a second run would re-read its own output).
    """
    import pyarrow.parquet as pq

    out, src = Path(out).resolve(), Path(src).resolve()
    if out == src or src in out.parents:
        raise DeidFolderError(f"output folder {out} lies inside the source folder {src}: choose another")
    stage = out / STAGING
    if stage.exists():  # a run killed ahead of its commit: its outputs were never named by a ledger
        shutil.rmtree(stage)
    (stage / "files").mkdir(parents=True)
    cfg = deid_cfg or DeidConfig()
    policy = build_policy(cfg)
    rows: list[dict] = []
    seen: dict[str, str] = {}
    pending: dict[str, tuple[dict, Path]] = {}  # source_uri -> (ledger row, path) of the files to de-identify
    heads: list[dict] = []  # ingested files with their series and anatomy, for defacing
    for path, problem in _entries(src):
        uri = escape_name(str(path))  # a name that is not valid UTF-8 is recorded escaped
        data = b""
        if problem is None:
            try:
                data = path.read_bytes()
            except OSError as err:
                problem = f"the file cannot be read ({type(err).__name__})"
        sha = hashlib.sha256(data if problem is None else f"unreadable:{uri}".encode()).hexdigest()
        row = {
            "run_id": "deid-cli",
            "source_uri": uri,
            "sha256": sha,
            "bytes": len(data),
            "institution": institution,
            "kind": "dicom",
            "stage": "deidentify",
            "status": "ingested",
        }
        if problem is not None:
            row.update(kind="other", status="quarantined", reason="unreadable_file", detail=problem, stage="discover")
        elif path.name.lower().endswith(NON_INPUT_EXTENSIONS):
            row.update(kind="other", status="skipped", reason="not_an_input", stage="discover")
        elif sha in seen:
            row.update(status="duplicate", reason="same_content", duplicate_of=seen[sha], stage="discover")
        else:
            seen[sha] = uri
            try:
                _, reason, detail = classify_dicom(data)
            except Exception as err:  # noqa: BLE001  never a stopped run: the file is quarantined
                reason, detail = "unreadable_dicom", f"{type(err).__name__} while reading the header"
            if reason:
                row.update(status="quarantined", reason=reason, detail=detail, stage="discover")
            else:
                pending[uri] = (row, path)
        rows.append(row)
    # burned-in text per series (etl.deid.series_text): each series' sample first, if the policy has one
    gate = SeriesTextGate((uri, _series_uid(path)) for uri, (_, path) in pending.items())
    written: dict[str, str] = {}
    for member in gate.order():
        uri = str(member)
        row, path = pending[uri]
        try:
            with (
                warnings.catch_warnings(),
                time_limit(FILE_TIME_LIMIT_S, "deidentification_timeout", "file's de-identification"),
            ):
                warnings.simplefilter("ignore")
                data = bounded_source(path.read_bytes())  # deflated inflated with a cap, items counted
                ds = pydicom.dcmread(io.BytesIO(data), force=True)
                body_part = infer_body_part(  # from the source descriptors, before they are cleaned
                    str(ds.get("BodyPartExamined", "") or ""),
                    [str(ds.get(k, "") or "") for k in ("StudyDescription", "SeriesDescription", "ProtocolName")],
                )
                result = deidentify_dataset(
                    ds, key, institution, policy, pixel_cleaning=cfg.pixel_cleaning, series_text=gate.slot(uri)
                )
                gate.record(uri, result.text_regions)
                if result.sop_key in written:
                    raise DeidentificationError(
                        "duplicate_sop_instance_uid",
                        "another file of this folder has the same SOPInstanceUID and different content",
                    )
                (stage / "files" / f"{result.sop_key}.dcm").write_bytes(result.to_bytes())
                written[result.sop_key] = str(uri)
                heads.append(
                    {
                        "sop_key": result.sop_key,
                        "series_key": result.series_key,
                        "modality": str(result.dataset.get("Modality", "") or ""),
                        "body_part": body_part,
                        "dicom_path": str(stage / "files" / f"{result.sop_key}.dcm"),
                        "row": row,
                    }
                )
        except (DeidentificationError, RecordLimitError, SourceBoundsError) as err:
            row.update(status="quarantined", reason=err.reason, detail=str(err))
        except Exception as err:  # noqa: BLE001  fail closed on anything pydicom cannot handle
            row.update(status="quarantined", reason="unreadable_dicom", detail=type(err).__name__)
        except BaseException as err:  # a native library's panic (pyo3 PanicException): not an interrupt
            if isinstance(err, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            row.update(
                status="quarantined", reason="decoder_crashed", detail=f"{type(err).__name__} in a native library"
            )
    # defacing (config deid.deface): head CT/MR series, one at a time, in the files just written
    done = deface_written(heads, lambda p: Path(p).read_bytes(), lambda p, b: Path(p).write_bytes(b), cfg.deface)
    for head in heads:
        if head["sop_key"] in done.quarantined:
            Path(head["dicom_path"]).unlink()
            reason, detail = done.quarantined[head["sop_key"]]
            head["row"].update(status="quarantined", reason=reason, detail=detail)
    for head in heads:
        if head["row"]["status"] == "ingested":
            head["row"]["output"] = f"files/{head['sop_key']}.dcm"
    if done.series:
        _write_private(stage / "deface_audit.json", json.dumps(done.series, indent=1, sort_keys=True).encode())
    for row in rows:
        if row["status"] == "quarantined":  # restricted (names source paths): owner-only
            (stage / "quarantine").mkdir(mode=0o700, exist_ok=True)
            record = f"quarantine/{row['sha256']}.json"
            row["quarantine_record"] = record
            _write_private(stage / record, json.dumps(row, indent=1, sort_keys=True).encode())
    ledger = table_from_rows(rows, ledger_schema.FOLDER_SCHEMA)
    buf = io.BytesIO()
    pq.write_table(ledger, buf)
    _write_private(stage / "ledger.parquet", buf.getvalue())
    _commit(stage, out, rows, audit=bool(done.series))
    return balance(ledger)


def _commit(stage: Path, out: Path, rows: list[dict], audit: bool) -> None:
    """Make the staged run the one under ``out``: remove the previous run's outputs, replace the ledger (the
    commit), then move the staged outputs in. No step leaves a file under ``out/files`` or ``out/quarantine`` that
    ``out/ledger.parquet`` does not name (a kill between steps at most leaves rows whose file is missing)."""
    for folder in ("files", "quarantine"):
        if (out / folder).is_dir():
            for f in (out / folder).iterdir():
                f.unlink()
    (out / "deface_audit.json").unlink(missing_ok=True)
    os.replace(stage / "ledger.parquet", out / "ledger.parquet")
    (out / "files").mkdir(exist_ok=True)
    if (stage / "quarantine").is_dir():
        (out / "quarantine").mkdir(mode=0o700, exist_ok=True)
    named = sorted(r[k] for r in rows for k in ("output", "quarantine_record") if r.get(k))
    for rel in named + (["deface_audit.json"] if audit else []):
        os.replace(stage / rel, out / rel)
    shutil.rmtree(stage)
