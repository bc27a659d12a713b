"""Rewriting data files with their deletes applied, with pyarrow on executors (the ``arrow``
rewrite engine, ``compactor.rewrite_engine``): one job item per output file, a bin of one
partition's data files that together fit the target size.

Spark's Iceberg reader applies equality deletes row by row, and its row-based read and write is
slower than pyarrow's on the same bytes (docs/BENCHMARKS.md, row "Rewrite throughput"). Here a
file's deleted rows are found as a conversion finds them (``positions``) and filtered out as one
vectorized mask. Which deletes apply to which file is not decided here: Iceberg's own scan
planning attached them to each file's scan task, so every sequence-number rule comes with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icecdc.compactor.positions import FileDeletes, KeyReader, deleted_positions_of, key_reader
from icecdc.domain.sort_order import UNSORTED, SortOrder
from icecdc.runtime.fileio import read_parquet_rows, write_parquet


@dataclass(frozen=True)
class RowMerge:
    """Data files of one partition, rewritten into one new file at ``output``."""

    inputs: tuple[FileDeletes, ...]  # each with the deletes Iceberg's scan planning attached to it
    schema: pa.Schema  # the table's current schema, field ids in the fields' metadata
    output: str
    sort: SortOrder = UNSORTED  # the table's order, applied only when ``sort.applies``


@dataclass(frozen=True)
class MergedFile:
    path: str | None  # None when the deletes removed every row (nothing written)
    size: int
    records: int
    source: str  # one of the data files it replaces (its partition is the new file's)


def merge(job: RowMerge, io_properties: Mapping[str, str], read_keys: KeyReader) -> MergedFile:
    deleted = deleted_positions_of(job.inputs, io_properties, read_keys)
    rows = pa.concat_tables(
        [_live_rows(f.data_file, job.schema, io_properties, *d) for f, d in zip(job.inputs, deleted, strict=True)]
    )
    source = job.inputs[0].data_file
    if not rows.num_rows:
        return MergedFile(None, 0, 0, source)
    if job.sort.applies:
        rows = sorted_rows(rows, job.sort)
    return MergedFile(job.output, write_parquet(rows, job.output, io_properties), rows.num_rows, source)


def sorted_rows(rows: pa.Table, order: SortOrder) -> pa.Table:
    """``rows`` in the table's sort order (``order.applies``), stable: equal keys keep arrival order."""
    columns: dict[str, pa.ChunkedArray] = {}
    keys: list[tuple[str, str]] = []
    for n, key in enumerate(order.arrow_keys()):
        values = rows.column(key.column)
        if values.null_count:  # a column without nulls needs no flag: every flag would be false
            columns[f"null{n}"] = pc.is_null(values)
            keys.append((f"null{n}", key.null_flag))
        columns[f"key{n}"] = values
        keys.append((f"key{n}", key.order))
    return rows.take(pc.sort_indices(pa.table(columns), sort_keys=keys))


def _live_rows(data_file: str, schema: pa.Schema, io_properties: Mapping[str, str], *deleted: pa.Array) -> pa.Table:
    """The rows of one data file that none of its deletes removes (``deleted``: positions)."""
    rows = read_parquet_rows(data_file, schema, io_properties)
    positions = pa.concat_arrays(list(deleted))
    if not len(positions):
        return rows
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[positions.to_numpy()] = False
    return rows.filter(pa.array(keep))


def merge_all(jobs: Iterable[RowMerge], io_properties: Mapping[str, str]) -> list[MergedFile]:
    """The merges of one executor task: an equality-delete file that applies to files of several
    of them is read once."""
    read = key_reader(io_properties)
    return [merge(job, io_properties, read) for job in jobs]


def bins(files: Sequence[tuple[str, int]], target_bytes: int) -> list[list[str]]:
    """One partition's data files (path, size), smallest first, packed into runs of at most
    ``target_bytes`` each (a file larger than that is a run of its own): one output file each.
    Smallest first so that whenever the two smallest fit in one run they share it: a pack of
    medium files (``policy.medium_files_pack``) always makes fewer files than it reads."""
    runs: list[list[str]] = []
    size = 0
    for path, length in sorted(files, key=lambda file: file[1]):
        if runs and size + length <= target_bytes:
            runs[-1].append(path)
            size += length
        else:
            runs.append([path])
            size = length
    return runs
