"""``medreco snapshot diff``: rows added, removed and changed per table between two releases, by key."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from etl.snapshots.manifest import read_manifest, read_snapshot_table
from etl.storage import Storage


@dataclass(frozen=True)
class TableDiff:
    """Rows of one table that differ between two releases, identified by the table's key columns.

    ``added``/``removed``/``changed`` hold key tuples (in ``key`` column order), sorted; ``status`` is
    ``unchanged``, ``changed``, ``added_table`` or ``removed_table``; ``schema`` is ``(old, new)`` schema
    versions when they differ (only the common columns are compared then).
    """

    table: str
    key: tuple[str, ...]
    status: str
    added: list[tuple] = field(default_factory=list)
    removed: list[tuple] = field(default_factory=list)
    changed: list[tuple] = field(default_factory=list)
    schema: tuple[str | None, str | None] | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (key tuples become lists)."""
        return {
            "table": self.table,
            "key": list(self.key),
            "status": self.status,
            "schema": self.schema,
            "added": [list(k) for k in self.added],
            "removed": [list(k) for k in self.removed],
            "changed": [list(k) for k in self.changed],
        }


def _row_digests(table: pa.Table, key: list[str], columns: list[str]) -> dict[tuple, bytes]:
    """key tuple -> sha256 of the row's other columns (canonical JSON; bytes values by their sha256)."""

    def enc(v: Any) -> Any:
        if isinstance(v, bytes):
            return "sha256:" + hashlib.sha256(v).hexdigest()
        if isinstance(v, dict):
            return {k: enc(x) for k, x in v.items()}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, (dt.date, dt.datetime, dt.time)):
            return v.isoformat()
        return v

    out: dict[tuple, bytes] = {}
    keys = list(zip(*(table[k].to_pylist() for k in key), strict=True))
    others = [c for c in columns if c not in key]
    for batch_start in range(0, table.num_rows, 4096):
        part = table.slice(batch_start, 4096).select(others).to_pylist()
        for i, row in enumerate(part):
            digest = hashlib.sha256(json.dumps(enc(row), sort_keys=True, separators=(",", ":")).encode()).digest()
            out[keys[batch_start + i]] = digest
    return out


def diff(storage: Storage, old: str, new: str) -> dict[str, TableDiff]:
    """Rows added, removed and changed per table between two releases, by each table's key columns.

    Tables whose pinned data files are identical are reported ``unchanged`` without being read. A row is
    ``changed`` when its key is in both releases and any other column common to both schemas differs.

    Returns
    -------
    dict
        table -> :class:`TableDiff`, tables of either release in name order.

    Raises
    ------
    SnapshotError
        for an unknown release.
    """
    m_old, m_new = read_manifest(storage, old), read_manifest(storage, new)
    out = {}
    for t in sorted(set(m_old["tables"]) | set(m_new["tables"])):
        a, b = m_old["tables"].get(t), m_new["tables"].get(t)
        key = tuple((b or a)["key"])
        if a is None or b is None:
            present = b or a
            keys = list(
                zip(
                    *(
                        read_snapshot_table(storage, m_new["version"] if b else m_old["version"], t, columns=list(key))[
                            k
                        ].to_pylist()
                        for k in key
                    ),
                    strict=True,
                )
            )
            out[t] = TableDiff(
                t,
                key,
                "added_table" if b else "removed_table",
                added=sorted(keys) if b else [],
                removed=[] if b else sorted(keys),
                schema=(None, present["schema_version"]) if b else (present["schema_version"], None),
            )
            continue
        schema = (a["schema_version"], b["schema_version"]) if a["schema_version"] != b["schema_version"] else None
        if a["sha256"] == b["sha256"]:
            out[t] = TableDiff(t, key, "unchanged", schema=schema)
            continue
        ta = read_snapshot_table(storage, m_old["version"], t)
        tb = read_snapshot_table(storage, m_new["version"], t)
        common = [c for c in tb.column_names if c in ta.column_names]
        da, db = _row_digests(ta, list(key), common), _row_digests(tb, list(key), common)
        added = sorted(k for k in db if k not in da)
        removed = sorted(k for k in da if k not in db)
        changed = sorted(k for k in db if k in da and da[k] != db[k])
        status = "changed" if added or removed or changed or schema else "unchanged"
        out[t] = TableDiff(t, key, status, added, removed, changed, schema)
    return out
