"""Turning the equality deletes that apply to one large data file into one position-delete file,
on an executor: read the file's key columns (not its rows), find the positions whose keys the
deletes name, add the positions already deleted by earlier position-delete files, and write them
in Iceberg's position-delete layout. Iceberg 1.10 has no action for this; Amoro does the same to
avoid rewriting a large file for a handful of deleted rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from icecdc.fileio import FIELD_ID, read_parquet_fields, write_parquet

# Reserved field ids of the position-delete schema (Iceberg spec, "Position Delete Files").
FILE_PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545
POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={FIELD_ID: str(FILE_PATH_FIELD_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={FIELD_ID: str(POS_FIELD_ID).encode()}),
    ]
)


@dataclass(frozen=True)
class EqualityDeletes:
    path: str
    field_ids: tuple[int, ...]


@dataclass(frozen=True)
class Conversion:
    data_file: str
    equality_deletes: tuple[EqualityDeletes, ...]
    position_deletes: tuple[str, ...]
    output: str  # where the position-delete file goes


@dataclass(frozen=True)
class ConvertedFile:
    data_file: str
    path: str | None  # None when no row of the data file is deleted
    positions: int
    size: int


def _matching_positions(data: pa.Table, deletes: pa.Table) -> pa.Array:
    """Row numbers of ``data`` whose key equals a row of ``deletes`` (same column names).
    Equality deletes treat null as equal to null, which joins do not: keys with nulls are
    matched column by column."""
    data = data.append_column("__pos", pa.array(range(data.num_rows), pa.int64()))
    columns = deletes.column_names
    if len(columns) == 1:
        mask = pc.is_in(data[columns[0]], value_set=deletes[columns[0]], skip_nulls=False)
        return data.filter(mask)["__pos"].combine_chunks()
    has_null = pc.is_null(deletes[columns[0]])
    for column in columns[1:]:
        has_null = pc.or_(has_null, pc.is_null(deletes[column]))
    plain = deletes.filter(pc.invert(has_null))
    found = [data.join(plain, columns, join_type="left semi")["__pos"]]
    for row in deletes.filter(has_null).to_pylist():
        mask = None
        for column, value in row.items():
            term = pc.is_null(data[column]) if value is None else pc.equal(data[column], value)
            mask = term if mask is None else pc.and_kleene(mask, term)
        found.append(data.filter(pc.fill_null(mask, False))["__pos"])
    return pa.chunked_array(found, pa.int64()).combine_chunks()


def convert(task: Conversion, io_properties: Mapping[str, str]) -> ConvertedFile:
    positions: list[pa.Array] = []
    keys_by_ids: dict[tuple[int, ...], list[pa.Table]] = {}
    for deletes in task.equality_deletes:
        keys_by_ids.setdefault(deletes.field_ids, []).append(
            read_parquet_fields(deletes.path, list(deletes.field_ids), io_properties)
        )
    for field_ids, tables in keys_by_ids.items():
        data = read_parquet_fields(task.data_file, list(field_ids), io_properties)
        positions.append(_matching_positions(data, pa.concat_tables(tables)))
    for path in task.position_deletes:
        earlier = read_parquet_fields(path, [FILE_PATH_FIELD_ID, POS_FIELD_ID], io_properties)
        mine = pc.equal(earlier[str(FILE_PATH_FIELD_ID)], task.data_file)
        positions.append(earlier.filter(mine)[str(POS_FIELD_ID)].combine_chunks())
    unique = pc.unique(pa.chunked_array(positions, pa.int64()).combine_chunks()) if positions else pa.array([], pa.int64())
    if not len(unique):
        return ConvertedFile(task.data_file, None, 0, 0)
    # The spec requires position deletes sorted by (file_path, pos).
    ordered = unique.take(pc.array_sort_indices(unique))
    table = pa.Table.from_arrays([pa.array([task.data_file] * len(ordered), pa.string()), ordered], schema=POSITION_DELETE_SCHEMA)
    size = write_parquet(table, task.output, io_properties)
    return ConvertedFile(task.data_file, task.output, len(ordered), size)


def convert_all(tasks: Sequence[Conversion], io_properties: Mapping[str, str]) -> list[ConvertedFile]:
    return [convert(task, io_properties) for task in tasks]
