"""Shared helpers for the versioned pyarrow table schemas (one module per table)."""

from __future__ import annotations

import pyarrow as pa


def versioned(name: str, version: str, fields: list[pa.Field], key: list[str]) -> pa.Schema:
    """Build a pyarrow schema with ``medreco.table``, ``medreco.schema_version`` and ``medreco.key`` metadata.

    Parameters
    ----------
    name : str
        table name (``"studies"``).
    version : str
        semantic version of the schema; bump the minor for added columns, the major for breaking changes.
    fields : list of pyarrow.Field
        the columns.
    key : list of str
        the columns that identify a row (unique, non-null).
    """
    missing = [k for k in key if k not in {f.name for f in fields}]
    if missing:
        raise ValueError(f"key columns {missing} not in schema {name}")
    return pa.schema(
        fields,
        metadata={"medreco.table": name, "medreco.schema_version": version, "medreco.key": ",".join(key)},
    )


def key_columns(schema: pa.Schema) -> list[str]:
    """The key columns recorded in a schema's metadata."""
    return schema.metadata[b"medreco.key"].decode().split(",")


def schema_version(schema: pa.Schema) -> str:
    """The version recorded in a schema's metadata."""
    return schema.metadata[b"medreco.schema_version"].decode()


def table_from_rows(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """Build a table of ``schema`` from a list of row dicts (missing keys become null).

    Raises
    ------
    pyarrow.ArrowInvalid / ArrowTypeError
        if a value does not fit its column type.
    """
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.table(cols, schema=schema)
