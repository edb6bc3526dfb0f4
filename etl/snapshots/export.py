"""A release as one self-contained folder that can be copied, handed over or pushed to the Hugging Face Hub as is.

A release in the store pins content-addressed data files shared with other releases (``snapshots/tables/``) and
volume objects under the storage root (``curated/volumes/``), so its own folder cannot be moved alone. Exporting
writes everything a reader needs under one folder ``DEST``::

    DEST/README.md                        Hugging Face dataset card: one config per table and view, one split per
                                          patient-level split (train, val, test, external_test), features
    DEST/data/<table>/<split>-00000-of-00001.parquet
                                          the table's rows of that split (``split`` column added from ``splits``
                                          by ``patient_key``; tables without a patient: one split ``full``)
    DEST/curated/volumes/<sha256>.nii.gz  the volume objects the ``images`` rows name (``payload_uri`` is relative
                                          to DEST, as it was to the storage root)
    DEST/manifest.json, DATASET_CARD.md   the release's own manifest and card, as published
    DEST/export.json                      what was exported: version, content hash, files with sha256 and rows

``datasets.load_dataset(DEST, "pairs", split="train")`` then reads the training pairs with no project installed,
and ``huggingface_hub.upload_folder(folder_path=DEST, repo_type="dataset")`` publishes it. Memory is bounded by one
pinned data file: each is read, split and appended to its split's output file in turn.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from etl.snapshots.ecosystem import IMAGE_COLUMNS, VIEW_SCHEMAS, hf_feature
from etl.storage import Storage
from medreco_reader.snapshot import SnapshotError, manifest_files, read_manifest, resolve_version
from schemas.errors import ReasonCodedError

#: the split of rows that belong to no patient (tables without ``patient_key``) or to a patient without a split
NO_SPLIT = "full"


class ExportError(ReasonCodedError, ValueError):
    """An export that cannot be written (destination not empty, release not found)."""

    default_reason = "export_failed"
    message_format = "{message}"


def _split_column(table: pa.Table, split_of: dict[str, str]) -> pa.Array:
    if "split" in table.column_names:
        return pc.fill_null(table["split"], NO_SPLIT)
    if "patient_key" in table.column_names:
        return pa.array(
            [split_of.get(k, NO_SPLIT) if k is not None else NO_SPLIT for k in table["patient_key"].to_pylist()],
            pa.string(),
        )
    return pa.array([NO_SPLIT] * table.num_rows, pa.string())


class _SplitWriter:
    """One Parquet writer per split of one table (opened on the first row of that split)."""

    def __init__(self, folder: Path, schema: pa.Schema) -> None:
        self.folder, self.schema = folder, schema
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.rows: dict[str, int] = {}

    def write(self, table: pa.Table) -> None:
        for split in sorted(set(table["split"].to_pylist())):
            part = table.filter(pc.equal(table["split"], split))
            if split not in self.writers:
                self.folder.mkdir(parents=True, exist_ok=True)
                self.writers[split] = pq.ParquetWriter(
                    self.folder / f"{split}-00000-of-00001.parquet", self.schema, compression="zstd"
                )
            self.writers[split].write_table(part.select(self.schema.names).cast(self.schema))
            self.rows[split] = self.rows.get(split, 0) + part.num_rows

    def close(self) -> dict[str, int]:
        for w in self.writers.values():
            w.close()
        return dict(sorted(self.rows.items()))


def _with_split(schema: pa.Schema) -> pa.Schema:
    return schema if "split" in schema.names else schema.append(pa.field("split", pa.string()))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 2**20):
            h.update(block)
    return h.hexdigest()


def _card(
    manifest: dict,
    splits: dict[str, dict[str, int]],
    schemas: dict[str, pa.Schema],
    card_md: str,
    sizes: dict[tuple[str, str], int],
) -> str:
    configs, infos = [], []
    for name, per_split in splits.items():
        configs.append(
            {"config_name": name, "data_files": [{"split": s, "path": f"data/{name}/{s}-*.parquet"} for s in per_split]}
        )
        infos.append(
            {
                "config_name": name,
                "features": [
                    hf_feature(f.name, f.type, image=f.name in IMAGE_COLUMNS.get(name, ())) for f in schemas[name]
                ],
                "splits": [
                    {"name": s, "num_bytes": sizes.get((name, s), 0), "num_examples": n} for s, n in per_split.items()
                ],
            }
        )
    front = {
        "pretty_name": f"MedReCo-DB {manifest['version']}",
        "license": "other",
        "license_name": "medreco-db-data-use-agreement",
        "license_link": "DATASET_CARD.md",
        "tags": ["medical", "radiology", "dicom", "longitudinal", "vqa"],
        "configs": configs,
        "dataset_info": infos,
    }
    body = (
        f"Exported release {manifest['version']} (content hash `{manifest['content_hash']}`): every table as "
        "Parquet per split under `data/`, volumes under `curated/volumes/` (`images.payload_uri` is relative to "
        'this folder). `datasets.load_dataset(THIS_FOLDER, "pairs", split="train")`; splits are patient '
        "level (`external_test`: whole institutions held out; `full`: rows of no patient)."
    )
    return "---\n" + json.dumps(front, indent=1) + "\n---\n\n" + body + "\n\n" + card_md.rstrip("\n") + "\n"


def export_release(storage: Storage, version: str, dest: str | os.PathLike) -> dict[str, Any]:
    """Write release ``version`` of ``storage`` as a self-contained folder ``dest`` (module docstring).

    Parameters
    ----------
    storage : Storage
        the storage root the release lives under (local or S3).
    version : str
        ``MAJOR.MINOR.PATCH`` or ``"latest"``.
    dest : path
        a local folder that does not exist or is empty.

    Returns
    -------
    dict
        ``export.json``'s content: ``version``, ``content_hash``, ``rows`` per config and split, ``files``
        (path -> sha256).

    Raises
    ------
    ExportError
        ``export_failed`` for a destination that is not empty or a release that cannot be read.
    """
    out = Path(dest)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"export destination {out} exists and is not an empty folder")
    try:
        version = resolve_version(storage, version)
        manifest = read_manifest(storage, version)
    except SnapshotError as err:
        raise ExportError(str(err)) from None
    from medreco_reader.snapshot import load_snapshot

    snap = load_snapshot(storage, version)
    out.mkdir(parents=True, exist_ok=True)
    split_of: dict[str, str] = {}
    if "splits" in manifest["tables"]:
        t = snap.read("splits", columns=["patient_key", "split"])
        split_of = dict(zip(t["patient_key"].to_pylist(), t["split"].to_pylist(), strict=True))
    rows: dict[str, dict[str, int]] = {}
    schemas: dict[str, pa.Schema] = {}
    volumes: set[str] = set()
    for name in manifest["tables"]:
        files = [storage.path(p) for p in manifest_files(manifest, name)]
        if not files:
            continue
        schema = None
        writer = None
        for path in files:  # one pinned data file in memory at a time
            with storage.fs.open_input_file(path) as f:
                part = pq.read_table(f)
            if schema is None:
                schema = _with_split(part.schema.remove_metadata())
                writer = _SplitWriter(out / "data" / name, schema)
            split = _split_column(part, split_of)
            part = (
                part.set_column(part.column_names.index("split"), "split", split)
                if "split" in part.column_names
                else part.append_column("split", split)
            )
            if "payload_uri" in part.column_names:
                volumes |= {u for u in part["payload_uri"].to_pylist() if u}
            assert writer is not None
            writer.write(part)
        assert writer is not None and schema is not None
        rows[name], schemas[name] = writer.close(), schema
    for view in manifest.get("views", {}):
        table = snap.view(view)
        if view == "vqa_images" and "vqa" in manifest["tables"]:
            vqa = snap.read("vqa", columns=["item_id", "split"])
            by_item = dict(zip(vqa["item_id"].to_pylist(), vqa["split"].to_pylist(), strict=True))
            split = pa.array([by_item.get(i) or NO_SPLIT for i in table["item_id"].to_pylist()], pa.string())
        else:
            split = _split_column(table, split_of)
        table = table.append_column("split", split)
        schema = _with_split(VIEW_SCHEMAS.get(view, table.schema).remove_metadata())
        writer = _SplitWriter(out / "data" / view, schema)
        writer.write(table)
        rows[view], schemas[view] = writer.close(), schema
    for uri in sorted(volumes):  # the volume objects, at the same path relative to the export root
        target = out / uri
        target.parent.mkdir(parents=True, exist_ok=True)
        if storage.is_local:
            shutil.copyfile(storage.path(uri), target)
        else:
            target.write_bytes(storage.read_bytes(uri))
    release = f"snapshots/{version}"
    for name in ("manifest.json", "DATASET_CARD.md"):
        if storage.is_file(f"{release}/{name}"):
            (out / name).write_bytes(storage.read_bytes(f"{release}/{name}"))
    card_md = (out / "DATASET_CARD.md").read_text() if (out / "DATASET_CARD.md").is_file() else ""
    sizes = {(p.parent.name, p.name.split("-", 1)[0]): p.stat().st_size for p in (out / "data").glob("*/*.parquet")}
    (out / "README.md").write_text(_card(manifest, rows, schemas, card_md, sizes))
    digests = {p.relative_to(out).as_posix(): _sha256(p) for p in sorted(out.rglob("*")) if p.is_file()}
    record = {"version": version, "content_hash": manifest["content_hash"], "rows": rows, "files": digests}
    (out / "export.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
