"""The sidecar's key index of one table: for each data file of the partitions it keeps portable,
the file's key columns, its data sequence number and the positions its position deletes already
remove, so that converting a batch's equality deletes reads the new files' keys and the delete
files, not every data file of the partition (docs/compactor.md, "The key index"). It follows the
table's live files (``reconcile``), not its own idea of them, and its memory is bounded
(``max_bytes``). Free of I/O: the caller lists the live files and reads the key columns it lacks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from icecdc.compactor.positions import matched_positions, not_yet_deleted
from icecdc.domain.files import LiveDataFile

Partition = Hashable


@dataclass
class IndexedFile:
    path: str
    partition: Partition
    data_sequence_number: int
    keys: pa.Table  # the key columns, named by field id, in row order
    # Positions the file's position deletes remove, and the paths of those delete files.
    deleted_by: frozenset[str] = frozenset()
    deleted: pa.Array = field(default_factory=lambda: pa.array([], pa.int64()))
    # Measured once: the keys never change, and a table's nbytes walks every buffer (the sidecar
    # spent 7% of its time there, asking at every conversion whether to evict).
    keys_nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.keys_nbytes = int(self.keys.nbytes)

    @property
    def nbytes(self) -> int:
        return self.keys_nbytes + int(self.deleted.nbytes)


@dataclass(frozen=True)
class DeleteKeys:
    """The keys of one equality-delete file, and its data sequence number."""

    data_sequence_number: int
    keys: pa.Table


@dataclass(frozen=True)
class Removed:
    """What a conversion learns of one data file from the index: the positions its equality
    deletes remove that its position deletes do not, and (when the index knows them for the
    file's current position deletes) the positions those already remove."""

    data_file: str
    new: pa.Array
    earlier: pa.Array | None  # None: not known for the file's current position deletes; read them


class KeyIndex:
    """The key index of one table (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._files: dict[str, IndexedFile] = {}
        self._partitions: OrderedDict[Partition, set[str]] = OrderedDict()  # least recently used first
        self.evictions = 0

    # --- what it holds ---

    def __contains__(self, path: object) -> bool:
        return path in self._files

    @property
    def partitions(self) -> list[Partition]:
        """Held partitions, least recently used first."""
        return list(self._partitions)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self._files.values())

    @property
    def keys(self) -> int:
        return sum(f.keys.num_rows for f in self._files.values())

    def usage(self, group_of: Callable[[Partition], Hashable]) -> dict[Hashable, tuple[int, int]]:
        """(bytes, keys) held, by a grouping of the partitions (the sidecar's: by table)."""
        out: dict[Hashable, tuple[int, int]] = {}
        for file in self._files.values():
            group = group_of(file.partition)
            held, keys = out.get(group, (0, 0))
            out[group] = (held + file.nbytes, keys + file.keys.num_rows)
        return out

    def bytes_per_key(self) -> float:
        keys = self.keys
        return self.nbytes / keys if keys else 0.0

    # --- following the table ---

    def reconcile(self, partition: Partition, live: Iterable[LiveDataFile]) -> list[LiveDataFile]:
        """Bring a partition in line with its live data files at a snapshot: forget the files no
        longer live, and return the live ones the index lacks (whose keys the caller reads and
        ``add``s). Marks the partition as just used."""
        live = list(live)
        paths = {f.path for f in live}
        held = self._partitions.setdefault(partition, set())
        self._partitions.move_to_end(partition)
        for gone in held - paths:
            held.discard(gone)
            del self._files[gone]
        return [f for f in live if f.path not in held]

    def add(self, partition: Partition, path: str, data_sequence_number: int, keys: pa.Table) -> None:
        """A data file's key columns, as read from it, in row order."""
        old = self._files.get(path)
        if old is not None and old.partition != partition:
            self._partitions[old.partition].discard(path)
        self._files[path] = IndexedFile(path, partition, data_sequence_number, keys)
        self._partitions.setdefault(partition, set()).add(path)

    def drop(self, partition: Partition) -> None:
        """Forget a partition (it settled and was merged: its files are rewritten)."""
        for path in self._partitions.pop(partition, set()):
            del self._files[path]

    def evict(self, keep: Partition | None = None) -> list[Partition]:
        """Drop least recently used partitions until the index is within its bound; ``keep``
        last of all (the partition being converted). Returns the partitions dropped."""
        dropped = []
        total = self.nbytes
        for partition in [p for p in self._partitions if p != keep] + ([keep] if keep in self._partitions else []):
            if total <= self.max_bytes:
                break
            total -= sum(self._files[p].nbytes for p in self._partitions[partition])
            self.drop(partition)
            dropped.append(partition)
        self.evictions += len(dropped)
        return dropped

    def record_deleted(self, path: str, deleted_by: Iterable[str], positions: pa.Array) -> None:
        """The positions a data file's position deletes ``deleted_by`` remove (read from them, or
        written by a conversion into a new one)."""
        if (file := self._files.get(path)) is not None:
            file.deleted_by, file.deleted = frozenset(deleted_by), positions

    # --- answering conversions ---

    def partitions_holding(self, keys: pa.Table) -> set[Partition]:
        """The key -> partition view: the held partitions with a row (live or not) of one of the
        keys, so a global delete's keys are looked up without reading any partition."""
        files = list(self._files.values())
        if not files:
            return set()
        found = matched_positions([f.keys for f in files], [keys])
        return {f.partition for f, positions in zip(files, found, strict=True) if len(positions)}

    def removed(self, data_files: Sequence[tuple[str, int, Iterable[str]]], deletes: Sequence[DeleteKeys]) -> list[Removed]:
        """The rows the equality ``deletes`` remove from the held ``data_files``, each given as
        (path, data sequence number, paths of the position deletes that apply to it now), by the
        sequence-number rules; only the files with a row not deleted yet are returned. Files
        with the same applying deletes are matched together."""
        by_applying: dict[tuple[int, ...], list[tuple[IndexedFile, frozenset[str]]]] = {}
        for path, sequence_number, position_deletes in data_files:
            applying = tuple(i for i, d in enumerate(deletes) if d.data_sequence_number > sequence_number)
            if applying:
                by_applying.setdefault(applying, []).append((self._files[path], frozenset(position_deletes)))
        out = []
        for applying, files in by_applying.items():
            found = matched_positions([f.keys for f, _ in files], [deletes[i].keys for i in applying])
            for (file, position_deletes), positions in zip(files, found, strict=True):
                if not len(positions):
                    continue
                known = file.deleted if file.deleted_by == position_deletes else None
                new = not_yet_deleted([positions], file.deleted if known is not None else pa.array([], pa.int64()))
                if len(new):
                    out.append(Removed(file.path, new, known))
        return out
