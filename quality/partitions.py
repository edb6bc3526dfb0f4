"""A curated table as its partitions, read one partition and one column set at a time.

The quality task never holds a whole table: the per-table Great Expectations suites run partition by partition on
the columns each suite needs (:func:`quality.gx_suites.run_suites`), and the table-level invariants and the
dashboard read only the columns they use (:meth:`PartitionedTable.column`, :meth:`PartitionedTable.select`: the key
columns of a uniqueness or foreign-key check, one column of a dashboard chart). A partition is one curated
partition file (``curated/<table>/.../shard=N...parquet``, one patient-hash shard: :mod:`etl.zones`), read with
``columns=`` so no other column's bytes are fetched.

A :class:`PartitionedTable` answers the parts of the ``pyarrow.Table`` interface the checks use (``schema``,
``column_names``, ``num_rows``, ``column``, ``select``), so a check written for a table works on either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

#: reads one partition: ``columns`` (list of names) -> pyarrow.Table of exactly those columns
PartitionReader = Callable[[list[str]], pa.Table]


class PartitionedTable:
    """A table of ``schema`` made of partitions read on demand, only the requested columns.

    Parameters
    ----------
    schema : pyarrow.Schema
        the columns that can be requested (for a curated table: its metadata columns,
        :func:`schemas.tables.metadata_columns`).
    readers : sequence of callables
        one per partition, ``columns -> pyarrow.Table`` of those columns (cast to ``schema``'s types).
    """

    def __init__(self, schema: pa.Schema, readers: Sequence[PartitionReader]) -> None:
        self.schema = schema
        self._readers = list(readers)
        self._num_rows: int | None = None

    @classmethod
    def from_tables(cls, parts: Sequence[pa.Table], schema: pa.Schema | None = None) -> PartitionedTable:
        """In-memory partitions (tests, small tables); ``schema`` defaults to the first partition's."""
        if not parts and schema is None:
            raise ValueError("from_tables needs at least one partition or a schema")
        schema = schema if schema is not None else parts[0].schema
        return cls(schema, [lambda cols, t=t: t.select(cols) for t in parts])

    @classmethod
    def from_storage(cls, storage, rel: str, schema: pa.Schema, columns: list[str]) -> PartitionedTable:
        """The partition files of a curated table (every ``*.parquet`` under ``rel``, sorted), each read with
        ``columns=`` by :meth:`etl.storage.Storage.read_table`.

        Parameters
        ----------
        storage : etl.storage.Storage
        rel : str
            the table's folder (:func:`etl.zones.curated_table`); missing: a table without partitions.
        schema : pyarrow.Schema
            the table's full schema (types the files are cast to).
        columns : list of str
            the columns that may be requested (payload columns left out).
        """
        files = sorted(f for f in storage.list_files(rel) if f.endswith(".parquet"))
        sub = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        return cls(sub, [lambda cols, f=f: storage.read_table(f, schema=schema, columns=list(cols)) for f in files])

    @property
    def column_names(self) -> list[str]:
        """The column names that can be read."""
        return list(self.schema.names)

    @property
    def n_partitions(self) -> int:
        """Number of partitions."""
        return len(self._readers)

    def partitions(self, columns: Sequence[str]) -> Iterator[pa.Table]:
        """Each partition's ``columns``, in partition order; a table without partitions yields one empty table
        (so a check always sees one batch of the right schema)."""
        cols = list(columns)
        if not self._readers:
            yield self.schema.empty_table().select(cols)
            return
        for read in self._readers:
            yield read(cols)

    def select(self, columns: Sequence[str]) -> pa.Table:
        """``columns`` of every partition as one table (key columns of a table-level invariant)."""
        cols = list(columns)
        parts = list(self.partitions(cols))
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def column(self, name: str) -> pa.ChunkedArray:
        """One column over every partition (read alone)."""
        return self.select([name]).column(name)

    @property
    def num_rows(self) -> int:
        """Rows over every partition (counted once, from the smallest column read: the first key column)."""
        if self._num_rows is None:
            first = self.schema.names[0]
            self._num_rows = sum(p.num_rows for p in self.partitions([first]))
        return self._num_rows


def as_partitioned(table: pa.Table | PartitionedTable) -> PartitionedTable:
    """A ``pyarrow.Table`` as a one-partition :class:`PartitionedTable`; a PartitionedTable as it is."""
    if isinstance(table, PartitionedTable):
        return table
    return PartitionedTable.from_tables([table], table.schema)
