"""What a Flink-style upsert sink writes for a checkpoint of changes, and the rows those changes
imply: plain data, no Spark, so the plan and the model are checked apart from the files.

The plan follows Flink's ``BaseDeltaTaskWriter`` in upsert mode. Every upsert deletes its key
first: with a position delete if the key was written earlier in the same checkpoint (Flink's
``insertedRowMap``), otherwise with an equality delete on ``id``, then writes the new row. A
delete does the same without the new row. The equality delete goes to the partition of the key's
committed row, which this writer knows from its model (Flink itself needs the partition column in
the key for that), and to the new row's partition for a key it has never seen.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from icecdc.testbed.writers.model import BASE_MICROS, REGIONS, STATUSES, Locality, Row


class ChangeKind(enum.Enum):
    UPSERT = "upsert"
    DELETE = "delete"


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    id: int
    row: Row | None = None  # the new row of an upsert

    @classmethod
    def upsert(cls, row: Row) -> Change:
        return cls(ChangeKind.UPSERT, row.id, row)

    @classmethod
    def delete(cls, key: int) -> Change:
        return cls(ChangeKind.DELETE, key)


@dataclass
class PartitionFiles:
    """One partition's files of a checkpoint: new rows (one data file), keys to delete (one
    equality-delete file) and positions in this checkpoint's data file to delete (one file-scoped
    position-delete file)."""

    region: str
    rows: list[Row] = field(default_factory=list)
    equality_deletes: list[int] = field(default_factory=list)
    position_deletes: list[int] = field(default_factory=list)


def plan_checkpoint(committed: Mapping[int, Row], changes: Iterable[Change]) -> list[PartitionFiles]:
    """The files for one checkpoint of ``changes`` on a table holding ``committed``."""
    partitions: dict[str, PartitionFiles] = {}
    written: dict[int, tuple[str, int]] = {}  # key -> (partition, position) in this checkpoint

    def files(region: str) -> PartitionFiles:
        return partitions.setdefault(region, PartitionFiles(region))

    for change in changes:
        if change.id in written:
            region, position = written.pop(change.id)
            files(region).position_deletes.append(position)
        elif change.id in committed:
            files(committed[change.id].region).equality_deletes.append(change.id)
        elif change.row is not None:
            files(change.row.region).equality_deletes.append(change.id)
        else:
            raise ValueError(f"delete of key {change.id}, which is neither committed nor in this checkpoint")
        if change.row is not None:
            rows = files(change.row.region).rows
            written[change.id] = (change.row.region, len(rows))
            rows.append(change.row)
    for partition in partitions.values():
        partition.position_deletes.sort()  # a position-delete file is sorted by position
    return [partitions[region] for region in sorted(partitions)]


def apply_changes(model: Mapping[int, Row], changes: Iterable[Change]) -> dict[int, Row]:
    """The rows after ``changes``: the model the table is compared with."""
    rows = dict(model)
    for change in changes:
        if change.row is None:
            del rows[change.id]
        else:
            rows[change.id] = change.row
    return rows


@dataclass
class ChangeGenerator:
    """Seeded random checkpoints over a region-partitioned table: inserts, updates (some moving
    region), deletes of existing keys, and keys changed twice in one checkpoint (which give
    position deletes). ``twice`` is the share of changes that change a key a second time (0 on
    format v3: Flink's sink in Iceberg 1.10.2 cannot write deletion vectors); a ``locality``
    places changes as a CDC stream does (``Locality``)."""

    seed: int
    twice: float = 0.15
    locality: Locality | None = None
    next_id: int = 1
    clock: int = BASE_MICROS  # ``updated_at`` only moves forward
    seq: int = 0  # checkpoints made
    born: dict[int, int] = field(default_factory=dict)  # key -> the checkpoint that inserted it
    _random: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def _row(self, key: int, region: str | None = None) -> Row:
        pick = self._random
        self.clock += pick.randint(1, 5_000_000)
        if region is None:
            region = self.locality.region(self.seq) if self.locality else pick.choice(REGIONS)
        return Row(key, region, pick.randint(100, 100_000), pick.choice(STATUSES), self.clock)

    def checkpoint(self, model: Mapping[int, Row], size: int) -> list[Change]:
        """``size`` changes to the rows in ``model``, the committed ones."""
        changes = self._changes(model, size)
        self.seq += 1
        return changes

    def _changes(self, model: Mapping[int, Row], size: int) -> list[Change]:
        pick = self._random
        keys = sorted(model)
        if self.locality is not None:
            keys = [key for key in keys if self.locality.reaches(self.born.get(key, 0), self.seq)]
        rows = dict(model)
        touched: set[int] = set()
        changes: list[Change] = []
        for _ in range(size):
            roll = pick.random()
            committed = self._untouched(keys, touched)
            if touched and roll < self.twice:
                key = pick.choice(changes).id  # a second change in this checkpoint
                region = rows[key].region if key in rows and self.locality else None
                change = (
                    Change.upsert(self._row(key, region)) if key not in rows or roll < self.twice * 2 / 3 else Change.delete(key)
                )
            elif committed is not None and roll < 0.55:
                moves = pick.random() < 0.3 and self.locality is None
                change = Change.upsert(self._row(committed, None if moves else rows[committed].region))
            elif committed is not None and roll < 0.65:
                change = Change.delete(committed)
            else:
                change = Change.upsert(self._row(self.next_id))
                self.born[self.next_id] = self.seq
                self.next_id += 1
            if change.row is None:
                del rows[change.id]
            else:
                rows[change.id] = change.row
            touched.add(change.id)
            changes.append(change)
        return changes

    def _untouched(self, keys: Sequence[int], touched: set[int]) -> int | None:
        """A committed key this checkpoint has not changed yet, if a few draws find one."""
        for _ in range(8):
            key = self._random.choice(keys) if keys else None
            if key is not None and key not in touched:
                return key
        return None


def counts(plan: Sequence[PartitionFiles]) -> tuple[int, int, int]:
    """Rows, equality deletes and position deletes of a plan."""
    return (
        sum(len(p.rows) for p in plan),
        sum(len(p.equality_deletes) for p in plan),
        sum(len(p.position_deletes) for p in plan),
    )
