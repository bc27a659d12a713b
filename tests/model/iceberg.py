"""An in-memory model of an Iceberg table's rows (format v2 and v3), written from the spec's
"Scan Planning" and "Sequence Numbers" rules as the project design notes state them, and sharing no code
with the product: the property tests check the product's pure decisions (what a batch writes,
what a compaction plan touches) against it, thousands of histories in seconds.

What it holds: immutable snapshots, each with a sequence number and the live data files (rows,
partition, spec id, data sequence number) and delete files of the table. Every file carries the
partition spec it was written in: a table whose spec changed holds files of several. The read rule:

- an equality delete of sequence number ``e`` removes the rows whose key it names from the data
  files of sequence number ``d < e`` of its own spec and partition (not from another spec's files,
  whatever their partition), or of every partition of every spec when it is stored under the
  unpartitioned spec (a global delete);
- a position delete or deletion vector of sequence number ``x`` removes the positions it lists
  from the one data file it names, when that file's ``d <= x``;
- format v3 allows at most one deletion vector per data file, and no Parquet position deletes.

The commits: the writer's ``RowDelta`` (adds files, removes none, validates nothing); a
``RewriteFiles`` whose new data files take the STARTING snapshot's sequence number; a ``RowDelta``
of position deletes that removes delete files (a conversion). Every commit gets the next sequence
number; the compactor's two are validated from their starting snapshot as Iceberg validates them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Key = tuple[Any, ...]
Partition = tuple[Any, ...]
Row = Mapping[str, Any]

PARTITIONED_SPEC_ID = 0
UNPARTITIONED_SPEC_ID = 1  # where global equality deletes live


@dataclass(frozen=True)
class DataFile:
    path: str
    partition: Partition
    sequence_number: int  # the data sequence number
    rows: tuple[Row, ...]
    size: int
    spec_id: int = PARTITIONED_SPEC_ID


@dataclass(frozen=True)
class EqualityDelete:
    path: str
    partition: Partition  # () when global
    sequence_number: int
    keys: frozenset[Key]
    spec_id: int = PARTITIONED_SPEC_ID

    @property
    def is_global(self) -> bool:
        return self.spec_id == UNPARTITIONED_SPEC_ID


@dataclass(frozen=True)
class PositionDelete:
    path: str
    partition: Partition  # the partition of the file it names
    sequence_number: int
    data_file: str
    positions: frozenset[int]
    deletion_vector: bool = False
    spec_id: int = PARTITIONED_SPEC_ID


DeleteFile = EqualityDelete | PositionDelete


def equality_delete_applies(delete: EqualityDelete, data: DataFile) -> bool:
    """d < e, in the delete's partition or, for a global delete, in any."""
    in_scope = delete.is_global or (delete.spec_id == data.spec_id and delete.partition == data.partition)
    return in_scope and data.sequence_number < delete.sequence_number


def position_delete_applies(delete: PositionDelete, data: DataFile) -> bool:
    """d <= x, on the file it names only."""
    return delete.data_file == data.path and data.sequence_number <= delete.sequence_number


class SpecViolation(AssertionError):
    """A table state the spec forbids (a reader would fail or read wrong rows)."""


class CommitConflict(Exception):
    """Iceberg's validation refused a commit."""


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: int
    sequence_number: int
    parent_id: int | None
    operation: str
    data: Mapping[str, DataFile]
    deletes: Mapping[str, DeleteFile]
    key_of: Callable[[Row], Key] = field(repr=False, compare=False)

    @functools.cached_property
    def _deletes_by_scope(self) -> dict[object, list[DeleteFile]]:
        """Delete files by what they may apply to: equality deletes by (spec, partition), global
        ones under None, position deletes by the path of the file they name."""
        scopes: dict[object, list[DeleteFile]] = {}
        for d in self.deletes.values():
            if isinstance(d, PositionDelete):
                scope: object = d.data_file
            else:
                scope = None if d.is_global else (d.spec_id, d.partition)
            scopes.setdefault(scope, []).append(d)
        return scopes

    def equality_deletes_of(self, data: DataFile) -> list[EqualityDelete]:
        scopes = self._deletes_by_scope
        candidates = (*scopes.get((data.spec_id, data.partition), ()), *scopes.get(None, ()))
        return [d for d in candidates if isinstance(d, EqualityDelete) and equality_delete_applies(d, data)]

    def position_deletes_of(self, data: DataFile) -> list[PositionDelete]:
        candidates = self._deletes_by_scope.get(data.path, ())
        return [d for d in candidates if isinstance(d, PositionDelete) and position_delete_applies(d, data)]

    def deleted_positions(self, data: DataFile) -> frozenset[int]:
        """The positions of a data file's rows that this snapshot's deletes remove."""
        keys = frozenset().union(*(d.keys for d in self.equality_deletes_of(data)))
        positions = frozenset().union(*(d.positions for d in self.position_deletes_of(data)))
        return positions | {i for i, row in enumerate(data.rows) if self.key_of(row) in keys}

    def live_rows(self, data: DataFile) -> list[Row]:
        deleted = self.deleted_positions(data)
        return [row for i, row in enumerate(data.rows) if i not in deleted]

    def rows(self) -> list[Row]:
        """What a full scan of this snapshot reads."""
        return [row for data in self.data.values() for row in self.live_rows(data)]

    def holds_data_of_other_specs(self, spec_id: int) -> bool:
        """Whether any live data file was written in a spec other than ``spec_id`` (the table's
        current one): what ``catalog.older_spec_data_live`` reads from the manifest list."""
        return any(f.spec_id != spec_id for f in self.data.values())


@dataclass
class Table:
    key_columns: tuple[str, ...]
    format_version: int = 2
    row_bytes: int = 1024  # the size of a data file is its record count times this
    snapshots: list[Snapshot] = field(default_factory=list)
    _paths: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def key_of(self, row: Row) -> Key:
        return tuple(row[c] for c in self.key_columns)

    @property
    def current(self) -> Snapshot:
        if not self.snapshots:
            return Snapshot(0, 0, None, "empty", {}, {}, self.key_of)
        return self.snapshots[-1]

    def snapshot(self, snapshot_id: int) -> Snapshot:
        return next(s for s in self.snapshots if s.snapshot_id == snapshot_id)

    def _path(self, kind: str) -> str:
        return f"{kind}-{next(self._paths)}"

    def new_data_file(
        self, partition: Partition, rows: Sequence[Row], sequence_number: int, spec_id: int = PARTITIONED_SPEC_ID
    ) -> DataFile:
        return DataFile(self._path("data"), partition, sequence_number, tuple(rows), len(rows) * self.row_bytes, spec_id)

    def new_position_delete(self, data: DataFile, positions: Iterable[int], sequence_number: int) -> PositionDelete:
        v3 = self.format_version >= 3
        return PositionDelete(
            self._path("dv" if v3 else "pos-deletes"),
            data.partition,
            sequence_number,
            data.path,
            frozenset(positions),
            v3,
            data.spec_id,
        )

    def _commit(
        self,
        operation: str,
        added_data: Iterable[DataFile] = (),
        removed_data: Iterable[str] = (),
        added_deletes: Iterable[DeleteFile] = (),
        removed_deletes: Iterable[str] = (),
    ) -> Snapshot:
        parent = self.current
        data = {path: f for path, f in parent.data.items() if path not in set(removed_data)}
        data.update((f.path, f) for f in added_data)
        deletes = {path: d for path, d in parent.deletes.items() if path not in set(removed_deletes)}
        deletes.update((d.path, d) for d in added_deletes)
        snapshot = Snapshot(
            parent.snapshot_id + 1,
            parent.sequence_number + 1,
            parent.snapshot_id or None,
            operation,
            data,
            deletes,
            self.key_of,
        )
        self._check(snapshot)
        self.snapshots.append(snapshot)
        return snapshot

    def _check(self, snapshot: Snapshot) -> None:
        if self.format_version < 3:
            return
        named: dict[str, int] = {}
        for delete in snapshot.deletes.values():
            if isinstance(delete, PositionDelete):
                if not delete.deletion_vector:
                    raise SpecViolation(f"format v3 takes deletion vectors only: {delete}")
                if delete.data_file in snapshot.data:
                    named[delete.data_file] = named.get(delete.data_file, 0) + 1
        if twice := [path for path, n in named.items() if n > 1]:
            raise SpecViolation(f"two deletion vectors for one data file: {twice}")

    def append(
        self,
        data: Mapping[Partition, Sequence[Row]],
        deletes: Mapping[Partition, Iterable[Key]],
        global_keys: Iterable[Key] = (),
        spec_id: int = PARTITIONED_SPEC_ID,
    ) -> Snapshot:
        """The writer's commit of one micro-batch: its data and equality-delete files, all at the
        commit's sequence number; partitioned ones in ``spec_id``, the spec the writer writes."""
        sequence = self.current.sequence_number + 1
        added_deletes: list[DeleteFile] = [
            EqualityDelete(self._path("eq-deletes"), p, sequence, frozenset(keys), spec_id) for p, keys in deletes.items()
        ]
        if global_keys := frozenset(global_keys):
            added_deletes.append(EqualityDelete(self._path("global-deletes"), (), sequence, global_keys, UNPARTITIONED_SPEC_ID))
        added = [self.new_data_file(p, rows, sequence, spec_id) for p, rows in data.items()]
        return self._commit("append", added, added_deletes=added_deletes)

    def _added_since(self, start: Snapshot) -> list[DeleteFile]:
        return [d for d in self.current.deletes.values() if d.sequence_number > start.sequence_number]

    def _require_live(self, data: Iterable[str], deletes: Iterable[str]) -> None:
        current = self.current
        if missing := [p for p in data if p not in current.data] + [p for p in deletes if p not in current.deletes]:
            raise CommitConflict(f"missing files: {missing}")

    def rewrite(
        self,
        start: Snapshot,
        rewritten: Sequence[str],
        added_data: Iterable[tuple[Partition, Sequence[Row]]],
        added_positions: Iterable[tuple[str, Iterable[int]]],
        removed_deletes: Sequence[str],
        starting_sequence_number: bool = True,
        spec_id: int = PARTITIONED_SPEC_ID,
    ) -> Snapshot:
        """A ``RewriteFiles`` validated from ``start``, its new data files at ``start``'s sequence
        number (``use-starting-sequence-number``): equality deletes committed since still apply to
        them, so they do not conflict; a position delete committed since that names a replaced
        file does ("found new position delete for replaced data file"). Without the starting
        sequence number (new files at the commit's), any delete committed since that applies to
        a replaced file conflicts ("found new delete for replaced data file"). The new data files
        are written in ``spec_id`` (Iceberg's ``output-spec-id``), whatever the replaced files' spec."""
        self._require_live(rewritten, removed_deletes)
        added = self._added_since(start)
        for path in rewritten:
            # Iceberg asks which deletes added since apply to the file as if it were as old as the start.
            replaced = dataclasses.replace(start.data[path], sequence_number=start.sequence_number)
            applying = [
                d
                for d in added
                if (isinstance(d, PositionDelete) and position_delete_applies(d, replaced))
                or (not starting_sequence_number and isinstance(d, EqualityDelete) and equality_delete_applies(d, replaced))
            ]
            if applying:
                raise CommitConflict(f"found new deletes for replaced data file {path}: {applying}")
        sequence = self.current.sequence_number + 1
        new_sequence = start.sequence_number if starting_sequence_number else sequence
        data = [self.new_data_file(p, rows, new_sequence, spec_id) for p, rows in added_data]
        positions = [self.new_position_delete(start.data[path], pos, sequence) for path, pos in added_positions]
        return self._commit("replace", data, rewritten, positions, removed_deletes)

    def row_delta(
        self,
        start: Snapshot,
        added_positions: Iterable[tuple[str, Iterable[int]]],
        removed_deletes: Sequence[str],
        examined: Sequence[str],
        paths: Mapping[str, str] | None = None,
    ) -> Snapshot:
        """A conversion's ``RowDelta``: position deletes added at the commit's sequence number,
        delete files removed; validated from ``start`` that every examined data file and every
        removed delete file is still live (no check for files the writer added meanwhile), and on
        format v3 that no deletion vector for a file it adds one for was committed meanwhile.
        ``paths``: where the compactor wrote each data file's new position deletes (default: new
        paths of the model's own)."""
        self._require_live(examined, removed_deletes)
        sequence = self.current.sequence_number + 1
        positions = [self.new_position_delete(start.data[path], pos, sequence) for path, pos in added_positions]
        if paths:
            positions = [dataclasses.replace(d, path=paths[d.data_file]) for d in positions]
        if self.format_version >= 3:
            named = {d.data_file for d in positions}
            if concurrent := [d for d in self._added_since(start) if isinstance(d, PositionDelete) and d.data_file in named]:
                raise CommitConflict(f"found concurrently added deletion vectors: {concurrent}")
        return self._commit("overwrite", added_deletes=positions, removed_deletes=removed_deletes)
