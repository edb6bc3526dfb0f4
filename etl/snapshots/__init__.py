"""Versioned snapshots: immutable, reproducible, verifiable releases of every curated table.

Layout under the storage root (a local folder or ``s3://bucket/prefix``)::

    snapshots/tables/<table>/            one Delta Lake table per curated table (``deltalake``), shared by releases:
        part-<sha256>.zstd.parquet         data files, named by the sha256 of their bytes (content addressed): one per
                                           curated partition file, its bytes (hard link / server-side copy)
        _delta_log/<version>.json          one Delta commit per table per release that changed it
    snapshots/<version>/                 one folder per release (semantic version ``MAJOR.MINOR.PATCH``)
        manifest.json                      what the release is (below); written last: no manifest, no release
        manifest.sha256                    sha256 of manifest.json
        DATASET_CARD.md                    counts per institution, modality, entity and split, de-id codes, limits
        publish_log.json                   this publish's run ids and wall-clock time (not hashed, see below)
        README.md, croissant.json          what the field's tools read without the project (:mod:`~etl.snapshots.
        files/<table>.txt, views/*.parquet ecosystem`): Hugging Face card, Croissant, pinned file lists, pair/VQA
                                           image views; sha256 in the manifest's ``release_files``

A release pins, per table, the Delta table version it was published as (time travel:
``DeltaTable(uri, version=n)``), the data files of that version with sha256 and row counts, and the
sha256 of the pinned commit file. Delta gives each table an atomic commit (each commit file is created
only if absent); the manifest, written after every table has committed, is the atomic commit point of
the release as a whole, so all tables of a release are consistent with each other. A table whose content
did not change keeps its Delta version (no empty rewrite); a publish interrupted after some commits is
resumed by the next one (a table whose latest Delta version already holds the wanted files is not
committed again).

Versions: the first release is ``0.1.0``; then, against the latest release, ``MAJOR`` when a table's
schema version changed or a table was removed, ``MINOR`` when rows were added, removed or changed or a
table was added, ``PATCH`` when only metadata in the content hash changed (config hash, ontology
version, code version, key fingerprint, de-identification codes, input ledger). When the content hash
equals the latest release's, nothing is written and that release is returned.

Reproducibility: the same curated tables, config, code and key, published on a root with the same
release history at the same release time, give a byte-identical release: the same ``manifest.json``
(hence ``manifest.sha256``), dataset card, data files and Delta commit files. To that end

- data files: the curated partition files (one per table and shard; ``images`` also per institution and
  modality), which the build writes key-sorted with fixed options (same inputs, same bytes), named by their
  sha256; a release costs what changed: unchanged partitions keep their data file (their sha256 comes from the
  partition hash cache, ``ledger/incremental/publish/<table>.json``, by path, size and mtime), a changed one is
  hard-linked (local) or copied server side (S3) into the Delta table and added, a removed one removed; nothing
  is decoded or re-encoded (except a partition file not in the table's current schema). Rows are in partition
  order (shard, then institution/modality), key order within each file: sort by the key where order matters;
- Delta commit files are written here (newline-delimited JSON actions, keys in a fixed order), not by
  ``deltalake``, whose commits hold the clock and a random table id: every Delta timestamp is the release
  time, the table id is a name-based UUID of the table and key fingerprint (:func:`delta_table_id`);
- the release time (manifest ``created_at`` and ``source_date_epoch``) is ``SOURCE_DATE_EPOCH`` when set
  (reproducible-builds.org), else the clock; a release is rebuilt by setting ``SOURCE_DATE_EPOCH`` to its
  manifest's ``source_date_epoch``;
- lineage in the manifest is the path- and run-free hash and counts of the input ledger; run ids and the
  wall-clock publish time, which differ between rebuilds, are kept in ``publish_log.json``, which
  :func:`verify` does not hash.

The content hash (:func:`content_hash`) is narrower still: it leaves out times, versions and Delta
commit files, so it also matches across roots with different histories.

Modules: :mod:`~etl.snapshots.manifest` (versions, content hash, lineage, reading pinned files),
:mod:`~etl.snapshots.delta` (data files and Delta commits), :mod:`~etl.snapshots.publish`,
:mod:`~etl.snapshots.card` (dataset card), :mod:`~etl.snapshots.ecosystem` (Hugging Face card, Croissant, file
lists, views), :mod:`~etl.snapshots.verify`, :mod:`~etl.snapshots.diff`,
:mod:`~etl.snapshots.api` (:func:`load_snapshot`, :class:`Snapshot`), :mod:`~medreco_reader.tensors` (pixels of a row),
:mod:`~medreco_reader.torch_data` (fixed-shape torch Datasets; imports torch). Reading is the reader package's
(:mod:`medreco_reader`, also installable alone from ``reader/``). This package re-exports the public names, so
``from etl.snapshots import load_snapshot`` is the one-line entry of the README.
"""

from etl.snapshots.api import Snapshot, load_snapshot
from etl.snapshots.card import card_facts, dataset_card
from etl.snapshots.delta import delta_table_id, encode_data_files
from etl.snapshots.diff import TableDiff, diff
from etl.snapshots.manifest import (
    CARD,
    FORMAT,
    MANIFEST,
    MANIFEST_SHA,
    PUBLISH_LOG,
    READ_FORMATS,
    TABLES_DIR,
    Release,
    SnapshotError,
    bump_version,
    change_kind,
    code_version,
    content_hash,
    input_ledger_summary,
    latest_ledger_run,
    list_versions,
    read_manifest,
    read_snapshot_table,
    release_files,
    resolve_version,
    table_counts,
    table_uri,
)
from etl.snapshots.publish import publish, read_publish_log, release_epoch
from etl.snapshots.verify import verify
from medreco_reader.tensors import load_image, to_tensor

__all__ = [
    "CARD",
    "FORMAT",
    "MANIFEST",
    "MANIFEST_SHA",
    "PUBLISH_LOG",
    "READ_FORMATS",
    "TABLES_DIR",
    "Release",
    "Snapshot",
    "SnapshotError",
    "TableDiff",
    "bump_version",
    "card_facts",
    "change_kind",
    "code_version",
    "content_hash",
    "dataset_card",
    "delta_table_id",
    "diff",
    "encode_data_files",
    "input_ledger_summary",
    "latest_ledger_run",
    "list_versions",
    "load_image",
    "load_snapshot",
    "publish",
    "read_manifest",
    "read_publish_log",
    "read_snapshot_table",
    "release_epoch",
    "release_files",
    "resolve_version",
    "table_counts",
    "table_uri",
    "to_tensor",
    "verify",
]
