"""Conversions through the key index (``key_index``), in the sidecar's own process with pyarrow:
no Spark job, whose fixed cost a batch's conversion need not pay.

One conversion reads the key columns of the data files the index lacks (every file of a
partition on first touch or after a restart or an eviction, then only the files added since),
the equality-delete files, and the position deletes of the files whose rows it deletes when the
index does not know them; it writes one position-delete file or deletion vector per such file
with ``positions.convert``. It declines (None) what it cannot answer exactly, and the caller
takes ``positions.convert_all``'s path: equality deletes on other columns than the table's key.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from icecdc.compactor.key_index import DeleteKeys, KeyIndex
from icecdc.compactor.plans import DataFileFacts
from icecdc.compactor.positions import (
    Conversion,
    ConvertedFile,
    EqualityDeletes,
    FileDeletes,
    PositionDeletes,
    convert,
    deleted_positions_of,
    earlier_positions,
    key_reader,
    not_yet_deleted,
)
from icecdc.domain.files import LiveDataFile, LiveDeleteFile
from icecdc.runtime.fileio import read_parquet_fields


class ConversionFiles(Protocol):
    """The reads and writes of a conversion (``ParquetFiles``; a model's in the tests)."""

    def data_keys(self, path: str, field_ids: Sequence[int]) -> pa.Table: ...
    def delete_keys(self, path: str, field_ids: Sequence[int]) -> pa.Table: ...
    def earlier_positions(self, data_file: str, position_deletes: Sequence[PositionDeletes]) -> pa.Array: ...
    def deleted_positions_of(self, files: Sequence[FileDeletes]) -> list[tuple[pa.Array, pa.Array]]: ...
    def write(self, task: Conversion, deleted: tuple[pa.Array, pa.Array]) -> ConvertedFile: ...


class ParquetFiles:
    """The table's files through its FileIO, as ``positions`` reads and writes them."""

    def __init__(self, io_properties: Mapping[str, str]) -> None:
        self._io = io_properties
        self._delete_keys = key_reader(io_properties)

    def data_keys(self, path: str, field_ids: Sequence[int]) -> pa.Table:
        return read_parquet_fields(path, list(field_ids), self._io)

    def delete_keys(self, path: str, field_ids: Sequence[int]) -> pa.Table:
        return self._delete_keys(EqualityDeletes(path, tuple(field_ids)))

    def earlier_positions(self, data_file: str, position_deletes: Sequence[PositionDeletes]) -> pa.Array:
        return earlier_positions(data_file, position_deletes, self._io)

    def deleted_positions_of(self, files: Sequence[FileDeletes]) -> list[tuple[pa.Array, pa.Array]]:
        return deleted_positions_of(files, self._io, self._delete_keys)

    def write(self, task: Conversion, deleted: tuple[pa.Array, pa.Array]) -> ConvertedFile:
        return convert(task, self._io, deleted=deleted)


@dataclass
class Reads:
    """What one conversion read: the measure of what it cost."""

    key_files: int = 0  # data files whose key columns were read
    key_bytes: int = 0  # their decoded key columns
    delete_files: int = 0


@dataclass(frozen=True)
class IndexedConversion:
    converted: list[ConvertedFile]
    reads: Reads


def convert_with_index(
    index: KeyIndex,
    partitions: Sequence[tuple[Hashable, Sequence[LiveDataFile]]],
    convert_files: Sequence[DataFileFacts],
    deletes: Mapping[str, LiveDeleteFile],
    key_field_ids: Sequence[int],
    files: ConversionFiles,
    output_for: Callable[[str], str],
    deletion_vector: bool,
) -> IndexedConversion | None:
    """Convert the equality deletes of ``convert_files`` (the plan's files, with the deletes that
    apply to each) into position deletes. ``partitions``: each listed partition with its live
    data files at the starting snapshot, which the index is reconciled with and extended from;
    empty for a resolution of global deletes, where the files the index does not hold are read
    for this conversion only. None: not answerable by the index."""
    key_ids = tuple(key_field_ids)
    equality = sorted({p for f in convert_files for p in f.equality_deletes})
    if any(deletes[p].equality_field_ids != key_ids for p in equality):
        return None
    reads = Reads(delete_files=len(equality))
    for partition, live in partitions:
        for missing in index.reconcile(partition, live):
            keys = files.data_keys(missing.path, key_ids)
            reads.key_files += 1
            reads.key_bytes += int(keys.nbytes)
            index.add(partition, missing.path, missing.data_sequence_number, keys)
    delete_keys = [DeleteKeys(deletes[p].data_sequence_number, files.delete_keys(p, key_ids)) for p in equality]
    held = [f for f in convert_files if f.path in index]
    removed = index.removed([(f.path, f.data_sequence_number, f.position_deletes) for f in held], delete_keys)
    facts = {f.path: f for f in convert_files}
    tasks, deleted = [], []
    for found in removed:
        file = facts[found.data_file]
        if found.earlier is not None:
            earlier, new = found.earlier, found.new
        else:
            earlier = files.earlier_positions(file.path, _position_deletes(file, deletes))
            new = not_yet_deleted([found.new], earlier)
        if len(new):
            tasks.append(_task(file, deletes, key_ids, output_for, deletion_vector))
            deleted.append((earlier, new))
    # Files the index does not hold (a global resolution outside the held partitions): read now.
    others = [_task(f, deletes, key_ids, output_for, deletion_vector) for f in convert_files if f.path not in index]
    if others:
        reads.key_files += len(others)
        tasks += others
        deleted += files.deleted_positions_of([FileDeletes(t.data_file, t.equality_deletes, t.position_deletes) for t in others])
    written = {}
    for task, positions in zip(tasks, deleted, strict=True):
        result = files.write(task, positions)
        written[task.data_file] = result
        if result.path is not None:
            every = pa.concat_arrays([positions[0], positions[1]])
            index.record_deleted(task.data_file, [result.path], every.take(pc.array_sort_indices(every)))
    for partition, _ in partitions:
        index.evict(keep=partition)
    converted = [written.get(f.path) or ConvertedFile(f.path, None, 0, 0, 0) for f in convert_files]
    return IndexedConversion(converted, reads)


def _position_deletes(file: DataFileFacts, deletes: Mapping[str, LiveDeleteFile]) -> tuple[PositionDeletes, ...]:
    return tuple(PositionDeletes(p, deletes[p].is_deletion_vector) for p in file.position_deletes)


def _task(
    file: DataFileFacts,
    deletes: Mapping[str, LiveDeleteFile],
    key_ids: tuple[int, ...],
    output_for: Callable[[str], str],
    deletion_vector: bool,
) -> Conversion:
    return Conversion(
        file.path,
        tuple(EqualityDeletes(p, key_ids) for p in file.equality_deletes),
        _position_deletes(file, deletes),
        output_for(file.path),
        deletion_vector=deletion_vector,
    )
