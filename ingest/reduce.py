"""The write stage's reduce over Arrow columns, for the keys whose changes are plain: none carries
an unavailable value or a primary-key change's other key, which is nearly every key. It is
``batch.reduce_plain`` for all of a table's plain keys at once: a key's last after-image is its
row (none when the key ends deleted), and its key is deleted in every partition an earlier
version may live in, or everywhere (a global delete) when a change's old partition is unknown.

Rows and keys are read from their canonical JSON by Arrow's JSON reader
(``TableLayout.arrow_from_json``), so no Python object is made per change: the per-key Python
reduce cost tens of µs a key, most of a large batch's write stage. The other keys go through
``batch.reduce_key`` one by one (``stages``); the property tests compare the two. A table
without a primary key has no keys to reduce: each of its changes is a row (``append_rows``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icecdc.domain.layout import TableLayout
from icecdc.ingest.filemeta import FileKind

GLOBAL_PARTITION = "[]"  # a global delete file has no partition

# A batch's files by (partition, as orjson writes the tuple; kind): their rows.
Files = dict[tuple[str, FileKind], pa.Table]


@dataclass(frozen=True)
class KeyGroups:
    """Change rows in key order (each key's changes together): per row, whether it starts its
    key's group and the number of its group."""

    starts: np.ndarray
    group: np.ndarray

    @classmethod
    def of(cls, keys: pa.ChunkedArray | pa.Array) -> KeyGroups:
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        starts = np.ones(len(keys), dtype=bool)
        if len(keys) > 1:
            starts[1:] = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
        return cls(starts, np.cumsum(starts) - 1)

    @property
    def count(self) -> int:
        return int(self.group[-1]) + 1 if len(self.group) else 0

    @property
    def ends(self) -> np.ndarray:
        """Per row, whether it is its key's last change."""
        return np.append(self.starts[1:], True) if len(self.starts) else self.starts

    def any(self, per_row: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """Per group, whether ``per_row`` (booleans, null as false) holds for one of its rows."""
        flags = pc.fill_null(per_row, False).to_numpy(zero_copy_only=False)
        return np.bincount(self.group, weights=flags, minlength=self.count) > 0


def plain_rows(rows: pa.Table) -> pa.Array:
    """Per change row, whether its key's changes are all plain (``change`` null in each: no
    unavailable column, no primary-key change)."""
    groups = KeyGroups.of(rows.column("key"))
    special = groups.any(pc.is_valid(rows.column("change")))
    return pa.array(~special[groups.group] if len(groups.group) else np.zeros(0, dtype=bool))


def reduce_plain_keys(layout: TableLayout, rows: pa.Table) -> Files:
    """The data and delete files' rows of one table's plain keys; ``rows``: their change rows in
    key order, each key's in source order."""
    if not rows.num_rows:
        return {}
    groups = KeyGroups.of(rows.column("key"))
    last = rows.filter(pa.array(groups.ends))  # one per key, in group order
    files: Files = {}
    written = last.filter(pc.not_equal(last.column("op"), "d"))
    images = layout.arrow_from_json(written.column("after").combine_chunks())
    for partition, of_partition in _by_partition(images, written.column("partition")):
        files[partition, FileKind.DATA] = of_partition
    keys = layout.arrow_from_json(last.column("key").combine_chunks(), key_only=True)
    global_delete = groups.any(rows.column("global_delete"))
    if global_delete.any():
        files[GLOBAL_PARTITION, FileKind.GLOBAL_DELETE] = keys.filter(pa.array(global_delete))
    prior = rows.column("prior").combine_chunks()
    owner = groups.group[pc.list_parent_indices(prior).to_numpy()]
    kept = ~global_delete[owner]
    pairs = pa.table({"partition": pc.list_flatten(prior).filter(pa.array(kept)), "group": owner[kept]})
    pairs = pairs.group_by(["partition", "group"]).aggregate([]).sort_by([("partition", "ascending"), ("group", "ascending")])
    for partition, of_partition in _by_partition(pairs, pairs.column("partition")):
        files[partition, FileKind.DELETE] = keys.take(of_partition.column("group"))
    return files


def append_rows(layout: TableLayout, rows: pa.Table) -> Files:
    """The data files' rows of a table without a primary key (``TableLayout.append_only``):
    every change row is a row of its own, two equal ones too, and nothing is deleted."""
    images = layout.arrow_from_json(rows.column("after").combine_chunks())
    return {
        (partition, FileKind.DATA): of_partition for partition, of_partition in _by_partition(images, rows.column("partition"))
    }


def _by_partition(table: pa.Table, partitions: pa.ChunkedArray) -> Iterator[tuple[str, pa.Table]]:
    """``table``'s rows by their value of ``partitions``, each partition's in their order."""
    if not table.num_rows:
        return
    encoded = pc.dictionary_encode(partitions.combine_chunks())
    codes = encoded.indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    ends = np.cumsum(np.bincount(codes, minlength=len(encoded.dictionary)))
    start = 0
    for partition, end in zip(encoded.dictionary.to_pylist(), ends, strict=True):
        yield partition, table.take(pa.array(order[start:end]))
        start = int(end)
