"""Reading and writing Parquet files through pyiceberg's FileIO, so that object stores and their
credentials work from the same catalog properties the JVM uses, on the driver and on executors;
new files on a local path are written with Python's own file API, which is cheaper per file."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icecdc.domain.layout import FIELD_ID


@functools.lru_cache(maxsize=8)
def _file_io(properties: tuple[tuple[str, str], ...], scheme: str) -> Any:
    from pyiceberg.io import load_file_io

    return load_file_io(dict(properties), f"{scheme}://" if scheme else "/")


def file_io(path: str, io_properties: Mapping[str, str]) -> Any:
    scheme = path.split("://", 1)[0] if "://" in path else ""
    return _file_io(tuple(sorted(io_properties.items())), scheme)


def write_parquet(table: pa.Table, path: str, io_properties: Mapping[str, str]) -> int:
    """Write a new file of the compactor's (never overwriting one); returns its size. A dictionary
    only for the columns whose values repeat (``dictionary_columns``), and no Arrow schema: only
    pyarrow reads it, every type reads back from the Parquet schema alone
    (tests/unit/test_fileio.py), and the Arrow schema is a large share of a conversion's small
    position-delete file, which the write amplification counts every batch (docs/BENCHMARKS.md,
    row "Write amplification")."""
    return len(write_new_parquet(table, path, io_properties, use_dictionary=dictionary_columns(table), store_schema=False))


# The rows a column's choice of encoding is made on, as parquet-mr makes it on its first pages.
DICTIONARY_SAMPLE_ROWS = 65_536


def dictionary_columns(table: pa.Table) -> list[str]:
    """The columns worth a dictionary: at most one distinct value (null included) in two of the
    first ``DICTIONARY_SAMPLE_ROWS`` rows. parquet-mr, the writer of Iceberg's Java and Spark
    rewrites, makes the same choice as it writes: it falls back to plain encoding when a column's
    dictionary does not pay. Arrow's writer does not; it gives every column a dictionary until the
    dictionary reaches 1 MB. Under zstd a dictionary makes columns of distinct values (keys,
    amounts, timestamps) larger than plain and few-valued ones much smaller (docs/BENCHMARKS.md,
    row "Write amplification"); on random values the sizes cross near one distinct value in two.
    Nested columns get none (icecdc's tables have none; a table given one elsewhere is rewritten
    with it plain)."""
    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    return [
        name
        for name, column in zip(sample.column_names, sample.columns, strict=True)
        if not pa.types.is_nested(column.type) and 2 * pc.count_distinct(column, mode="all").as_py() <= len(column)
    ]


def write_new_parquet(
    table: pa.Table,
    path: str,
    io_properties: Mapping[str, str],
    *,
    compression: str = "zstd",
    use_dictionary: bool | list[str] = True,
    store_schema: bool = True,
) -> bytes:
    """Write a new file (never overwriting one); returns its bytes, which end with its footer.
    ``compression``: Parquet's codec (zstd is Iceberg's default). ``use_dictionary=False`` writes
    each column plain, a list of names gives only those a dictionary; ``store_schema=False`` leaves
    out the Arrow schema (pyarrow's ``ARROW:schema`` key), which only pyarrow reads back. A batch's
    small, short-lived files take both (``batch_files.write_file``)."""
    # Arrow's own buffer, not io.BytesIO: the writer then never calls back into Python for its
    # pieces, which a batch of many small files feels (docs/BENCHMARKS.md, row "Many tables in one
    # batch").
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression=compression, use_dictionary=use_dictionary, store_schema=store_schema)
    data = buffer.getvalue().to_pybytes()
    local = _local_path(path)
    if local is not None:
        # A batch of a connector's many tables writes a thousand files of a few rows, and Python's
        # own file API costs less a file than pyiceberg's stream.
        _create_local(local, data)
    else:
        with file_io(path, io_properties).new_output(path).create(overwrite=False) as stream:
            stream.write(data)
    return data


def _create_local(local: str, data: bytes) -> None:
    """A new local file, its folder made only when missing: a partition's folder almost always
    exists after its first batch, and asking first cost a stat per folder level a file."""
    try:
        _write_new_local(local, data)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        _write_new_local(local, data)


def _write_new_local(local: str, data: bytes) -> None:
    with open(local, "xb") as out:  # never overwriting: a committed snapshot may reference it
        out.write(data)


def _local_path(path: str) -> str | None:
    """The path on this host's file system of a location without a scheme or with ``file:``."""
    if path.startswith("file:"):
        return "/" + path.removeprefix("file:").lstrip("/")
    return None if "://" in path else path


def read_parquet_fields(path: str, field_ids: list[int], io_properties: Mapping[str, str]) -> pa.Table:
    """The columns of a Parquet file that carry the given Iceberg field ids, in that order and
    named by field id, so that a column renamed since the file was written is still found."""
    with file_io(path, io_properties).new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        by_id = _columns_by_field_id(parquet)
        missing = [f for f in field_ids if f not in by_id]
        if missing:
            raise ValueError(f"{path} has no column with field id(s) {missing}")
        table = parquet.read(columns=[by_id[f] for f in field_ids])
    return table.rename_columns([str(f) for f in field_ids])


def read_parquet_rows(path: str, schema: pa.Schema, io_properties: Mapping[str, str]) -> pa.Table:
    """Every row of a Parquet data file in the table's current schema (``schema``: field ids in
    the fields' metadata): columns found by field id, so renames do not matter; cast to the
    current type (the promotions Iceberg allows: int to long, float to double, wider decimals);
    a column added after the file was written read as nulls, as Iceberg reads it."""
    with file_io(path, io_properties).new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        by_id = _columns_by_field_id(parquet)
        wanted = [int(field.metadata[FIELD_ID]) for field in schema]
        read = parquet.read(columns=[by_id[f] for f in wanted if f in by_id])
    columns = [
        read.column(by_id[field_id]).cast(field.type) if field_id in by_id else pa.nulls(read.num_rows, field.type)
        for field_id, field in zip(wanted, schema, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _columns_by_field_id(parquet: pq.ParquetFile) -> dict[int, str]:
    """A Parquet file's top-level column names by the Iceberg field id each carries."""
    return {
        int(field.metadata[FIELD_ID]): field.name
        for field in parquet.schema_arrow
        if field.metadata and FIELD_ID in field.metadata
    }
