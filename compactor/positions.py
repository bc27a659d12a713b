"""Turning the equality deletes that apply to one data file into position deletes, on an
executor: read the file's key columns (not its rows), find the positions whose keys the deletes
name, add the positions earlier position deletes of the file already removed, and write them as
one file-scoped position-delete file (format v2, Iceberg's Parquet layout) or one deletion
vector (format v3, ``icecdc.runtime.puffin``). Iceberg 1.10 has no action for this; Amoro does the same
to avoid rewriting a file for a handful of deleted rows.

Nothing is written for a file whose equality deletes match no row it still holds: its earlier
position deletes stay as they are, and the equality deletes apply to it no more than before.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icecdc.runtime.fileio import FIELD_ID, read_parquet_fields, write_parquet
from icecdc.runtime.puffin import read_deletion_vector, write_deletion_vector

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
class PositionDeletes:
    """Earlier position deletes that apply to the data file: a Parquet file, or a deletion vector."""

    path: str
    deletion_vector: bool = False


@dataclass(frozen=True)
class FileDeletes:
    """A data file and the delete files that apply to it."""

    data_file: str
    equality_deletes: tuple[EqualityDeletes, ...] = ()
    position_deletes: tuple[PositionDeletes, ...] = ()


@dataclass(frozen=True)
class Conversion:
    data_file: str
    equality_deletes: tuple[EqualityDeletes, ...]
    position_deletes: tuple[PositionDeletes, ...]
    output: str  # where the new position-delete file goes
    deletion_vector: bool = False  # write a deletion vector (format v3) instead of Parquet


KeyReader = Callable[[EqualityDeletes], pa.Table]


@dataclass(frozen=True)
class ConvertedFile:
    data_file: str
    path: str | None  # None when nothing new is deleted (nothing written)
    positions: int  # in the new file: the earlier ones and the new ones
    new_positions: int  # rows the equality deletes matched that were not deleted yet
    size: int
    content_offset: int | None = None  # deletion vectors: where the blob is in the Puffin file
    content_size: int | None = None


def _matching_positions(data: pa.Table, deletes: pa.Table) -> pa.Array:
    """Row numbers of ``data`` whose key equals a row of ``deletes`` (same column names).
    Equality deletes treat null as equal to null, which joins do not: keys with nulls are
    matched column by column."""
    columns = deletes.column_names
    if len(columns) == 1:
        mask = pc.is_in(data[columns[0]], value_set=deletes[columns[0]], skip_nulls=False)
        return pc.indices_nonzero(mask).cast(pa.int64())
    data = data.append_column("__pos", pa.array(np.arange(data.num_rows, dtype=np.int64)))
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


def earlier_positions(data_file: str, position_deletes: Sequence[PositionDeletes], io_properties: Mapping[str, str]) -> pa.Array:
    """The positions of a data file its position deletes (or deletion vector) remove, each once."""
    found = []
    for deletes in position_deletes:
        if deletes.deletion_vector:
            found.append(read_deletion_vector(deletes.path, data_file, io_properties))
            continue
        earlier = read_parquet_fields(deletes.path, [FILE_PATH_FIELD_ID, POS_FIELD_ID], io_properties)
        mine = pc.equal(earlier[str(FILE_PATH_FIELD_ID)], data_file)
        found.append(earlier.filter(mine)[str(POS_FIELD_ID)].combine_chunks())
    return pc.unique(pa.chunked_array(found, pa.int64()).combine_chunks()) if found else pa.array([], pa.int64())


def _same_types(data: Sequence[pa.Table], deletes: Sequence[pa.Table]) -> tuple[pa.Table, pa.Table]:
    """Key columns of data files and of equality deletes, each concatenated, in one type per
    column: files written before a key column's type was promoted (int to long) hold the old type."""
    schema = pa.unify_schemas([t.schema for t in (*data, *deletes)], promote_options="permissive")

    def joined(tables: Sequence[pa.Table]) -> pa.Table:
        return pa.concat_tables([t.cast(schema) for t in tables])

    return joined(data), joined(deletes)


def deleted_positions(
    data_file: str,
    equality_deletes: Sequence[EqualityDeletes],
    position_deletes: Sequence[PositionDeletes],
    io_properties: Mapping[str, str],
    read_keys: KeyReader | None = None,
) -> tuple[pa.Array, pa.Array]:
    """The rows of one data file its deletes remove: (positions its position deletes already
    remove, positions only its equality deletes name), each without repeats. Reads the data
    file's key columns only."""
    file = FileDeletes(data_file, tuple(equality_deletes), tuple(position_deletes))
    return deleted_positions_of([file], io_properties, read_keys)[0]


def deleted_positions_of(
    files: Sequence[FileDeletes], io_properties: Mapping[str, str], read_keys: KeyReader | None = None
) -> list[tuple[pa.Array, pa.Array]]:
    """``deleted_positions`` of several data files, in order. Files with the same equality
    deletes (a batch's deletes apply to every older file of the partition) are matched together,
    their key columns side by side: the deleted keys' hash set is built once, not once a file."""
    read = read_keys or (lambda deletes: read_parquet_fields(deletes.path, list(deletes.field_ids), io_properties))
    sharing: dict[tuple[EqualityDeletes, ...], list[str]] = {}
    for file in files:
        sharing.setdefault(file.equality_deletes, []).append(file.data_file)
    matched: dict[str, list[pa.Array]] = {file.data_file: [] for file in files}
    for equality, data_files in sharing.items():
        keys_by_ids: dict[tuple[int, ...], list[pa.Table]] = {}
        for deletes in equality:
            keys_by_ids.setdefault(deletes.field_ids, []).append(read(deletes))
        for field_ids, tables in keys_by_ids.items():
            data = [read_parquet_fields(path, list(field_ids), io_properties) for path in data_files]
            for path, found in zip(data_files, matched_positions(data, tables), strict=True):
                matched[path].append(found)
    out = []
    for file in files:
        earlier = earlier_positions(file.data_file, file.position_deletes, io_properties)
        out.append((earlier, not_yet_deleted(matched[file.data_file], earlier)))
    return out


def matched_positions(data: Sequence[pa.Table], deletes: Sequence[pa.Table]) -> list[pa.Array]:
    """For each of several data files' key columns, the positions whose key one of the equality
    deletes' key tables names (possibly repeated). The files are matched side by side: the
    deleted keys' hash set is built once, not once a file."""
    found = _matching_positions(*_same_types(data, deletes)).to_numpy()
    offsets = np.cumsum([0, *(t.num_rows for t in data)])
    return [pa.array(found[(found >= start) & (found < end)] - start, pa.int64()) for start, end in itertools.pairwise(offsets)]


def not_yet_deleted(matched: Sequence[pa.Array], earlier: pa.Array) -> pa.Array:
    """The matched positions, each once, that the ``earlier`` positions do not already remove."""
    new = pc.unique(pa.chunked_array(matched, pa.int64()).combine_chunks()) if matched else pa.array([], pa.int64())
    return new.filter(pc.invert(pc.is_in(new, value_set=earlier)))


def convert(
    task: Conversion,
    io_properties: Mapping[str, str],
    read_keys: KeyReader | None = None,
    deleted: tuple[pa.Array, pa.Array] | None = None,
) -> ConvertedFile:
    """``deleted``: the file's ``deleted_positions``, when already known."""
    earlier, new = deleted or deleted_positions(
        task.data_file, task.equality_deletes, task.position_deletes, io_properties, read_keys
    )
    if not len(new):
        return ConvertedFile(task.data_file, None, len(earlier), 0, 0)
    every = pa.concat_arrays([earlier, new])
    # The spec requires position deletes sorted by (file_path, pos); a bitmap is sorted anyway.
    ordered = every.take(pc.array_sort_indices(every))
    if task.deletion_vector:
        dv = write_deletion_vector(task.output, task.data_file, ordered, io_properties)
        return ConvertedFile(task.data_file, dv.path, len(ordered), len(new), dv.size, dv.content_offset, dv.content_size)
    table = pa.Table.from_arrays([pa.array([task.data_file] * len(ordered), pa.string()), ordered], schema=POSITION_DELETE_SCHEMA)
    size = write_parquet(table, task.output, io_properties)
    return ConvertedFile(task.data_file, task.output, len(ordered), len(new), size)


def key_reader(io_properties: Mapping[str, str]) -> KeyReader:
    """Reads each equality-delete file's keys once, however many data files it applies to (a
    global delete applies to every file older than it): for the data files of one executor task."""
    keys: dict[str, pa.Table] = {}

    def read(deletes: EqualityDeletes) -> pa.Table:
        if deletes.path not in keys:
            keys[deletes.path] = read_parquet_fields(deletes.path, list(deletes.field_ids), io_properties)
        return keys[deletes.path]

    return read


def convert_all(tasks: Sequence[Conversion], io_properties: Mapping[str, str]) -> list[ConvertedFile]:
    """Several data files' conversions in one executor task."""
    read = key_reader(io_properties)
    files = [FileDeletes(t.data_file, t.equality_deletes, t.position_deletes) for t in tasks]
    deleted = deleted_positions_of(files, io_properties, read)
    return [convert(task, io_properties, read, positions) for task, positions in zip(tasks, deleted, strict=True)]
