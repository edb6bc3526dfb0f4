"""``medreco snapshot verify``: re-check a release against its manifest (files, sha256, rows, Delta commits)."""

from __future__ import annotations

import hashlib
import json

import pyarrow.fs as pafs

from etl import zones
from etl.snapshots.delta import delta_files, table_data_sha256
from etl.snapshots.manifest import (
    CARD,
    MANIFEST,
    MANIFEST_SHA,
    PUBLISH_LOG,
    READ_FORMATS,
    content_hash,
    parquet_rows,
    read_manifest,
    resolve_version,
    sha256_file,
)
from etl.storage import Storage


def verify(storage: Storage, version: str, *, deep: bool = True) -> list[str]:
    """Check a release against its manifest; return the problems found (empty when intact).

    Checks: ``manifest.sha256`` against the manifest's bytes; the manifest format; for every table each
    data file's presence, sha256 (re-hashed, streamed) and row count (Parquet footer), the pinned Delta
    commit file's presence and sha256, and that the pinned Delta version lists exactly the manifest's data
    files; every volume object the ``images`` rows pin (present, sha256 re-hashed); the dataset card's sha256 and
    that of every ``release_files`` entry (views, ``README.md``, ``croissant.json``, ``files/``); the content hash
    recomputed from the manifest; that the publish log, if any, names this release (it is not hashed: it records run ids
    and the wall-clock time); and that the release folder holds no other file. Each problem names the file.

    ``deep=False`` (what :func:`etl.snapshots.publish` checks before publishing on top of a release, so a
    release costs what changed) checks everything except re-hashing: each data file's presence and byte
    size instead of its sha256 and footer rows, and no volume objects; the commit files, card and manifest
    are still hashed (their size does not grow with the archive).

    Raises
    ------
    SnapshotError
        when the release does not exist.
    """
    version = resolve_version(storage, version) if version == "latest" else version
    base = zones.release_dir(version)
    manifest = read_manifest(storage, version)
    problems = []
    text = storage.read_bytes(f"{base}/{MANIFEST}")
    if not storage.is_file(f"{base}/{MANIFEST_SHA}"):
        problems.append(f"missing file {base}/{MANIFEST_SHA}")
    elif storage.read_text(f"{base}/{MANIFEST_SHA}").strip() != hashlib.sha256(text).hexdigest():
        problems.append(f"{base}/{MANIFEST} does not match {MANIFEST_SHA} (manifest edited)")
    if manifest.get("format") not in READ_FORMATS:
        return problems + [
            f"{base}/{MANIFEST}: unsupported manifest format {manifest.get('format')!r} "
            f"(this code reads {', '.join(READ_FORMATS)})"
        ]
    for t, v in manifest["tables"].items():
        folder = v["uri"]
        for f in v["files"]:
            rel = f"{folder}/{f['path']}"
            info = storage.fs.get_file_info(storage.path(rel))
            if info.type != pafs.FileType.File:
                problems.append(f"{t}: missing file {rel}")
            elif not deep:
                if "bytes" in f and info.size != f["bytes"]:
                    problems.append(f"{t}: {info.size} bytes in {rel}, manifest says {f['bytes']} (sha256 mismatch)")
            elif sha256_file(storage, rel) != f["sha256"]:
                problems.append(f"{t}: sha256 mismatch in {rel}")
            else:
                rows = parquet_rows(storage, rel)
                if rows != f["rows"]:
                    problems.append(f"{t}: {rows} rows in {rel}, manifest says {f['rows']}")
        if sum(f["rows"] for f in v["files"]) != v["rows"] or table_data_sha256(v["files"]) != v["sha256"]:
            problems.append(f"{t}: table rows/sha256 do not match its files in {base}/{MANIFEST}")
        log = f"{folder}/{v['delta_log']['path']}"
        if not storage.is_file(log):
            problems.append(f"{t}: missing file {log}")
            continue
        if sha256_file(storage, log) != v["delta_log"]["sha256"]:
            problems.append(f"{t}: sha256 mismatch in {log}")
        try:
            _, names = delta_files(storage, t, v["delta_version"])
        except Exception as err:  # noqa: BLE001 - any Delta read error is a verification failure
            problems.append(f"{t}: Delta version {v['delta_version']} of {folder} unreadable: {err}".splitlines()[0])
            continue
        if names != sorted(f["path"] for f in v["files"]):
            problems.append(f"{t}: Delta version {v['delta_version']} of {folder} lists other files than the manifest")
    if deep and "images" in manifest["tables"]:
        from etl.snapshots.volume_pins import verify_volumes

        problems += verify_volumes(storage, version)  # the volume objects the images rows pin by sha256
    card = f"{base}/{CARD}"
    if not storage.is_file(card):
        problems.append(f"missing file {card}")
    elif sha256_file(storage, card) != manifest.get("card_sha256"):
        problems.append(f"{card}: sha256 mismatch")
    if content_hash(manifest) != manifest["content_hash"]:
        problems.append(f"{base}/{MANIFEST}: content_hash does not match its tables and metadata")
    log = f"{base}/{PUBLISH_LOG}"
    if storage.is_file(log):
        try:
            named = json.loads(storage.read_text(log)).get("version")
        except (ValueError, AttributeError):
            named = None
        if named != version:
            problems.append(f"{log}: not the publish log of {version}")
    extras = manifest.get("release_files", {})  # views, Hugging Face card, Croissant, file lists (ecosystem)
    for rel, sha in sorted(extras.items()):
        if not storage.is_file(f"{base}/{rel}"):
            problems.append(f"missing file {base}/{rel}")
        elif sha256_file(storage, f"{base}/{rel}") != sha:
            problems.append(f"{base}/{rel}: sha256 mismatch")
    listed = {f"{base}/{n}" for n in (MANIFEST, MANIFEST_SHA, CARD, PUBLISH_LOG, *extras)}
    problems += [f"unlisted file {f}" for f in storage.list_files(base) if f not in listed]
    return problems
