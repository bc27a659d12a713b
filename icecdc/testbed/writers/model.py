"""An independent model of a foreign writer's table: rows by key, batches of changes, a seeded
generator of batches, and a diff against the rows read back. Nothing here touches Spark."""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

COLUMNS = ("id", "region", "amount", "status", "updated_at")
# The table every foreign writer writes: region-partitioned, ``updated_at`` in microseconds (UTC).
DDL_COLUMNS = "id BIGINT, region STRING, amount BIGINT, status STRING, updated_at TIMESTAMP"
REGIONS = ("eu", "us", "apac")
STATUSES = ("new", "paid", "shipped", "returned")
BASE_MICROS = 1_767_225_600_000_000  # the generator's clock starts here and only moves forward


@dataclass(frozen=True)
class Row:
    id: int
    region: str
    amount: int
    status: str
    updated_at: int  # microseconds since the epoch, UTC

    def values(self) -> tuple[int, str, int, str, int]:
        return (self.id, self.region, self.amount, self.status, self.updated_at)


class Op(enum.Enum):
    """A change's ``op`` column, as the MERGE source carries it (Debezium's letters)."""

    INSERT = "c"
    UPDATE = "u"
    DELETE = "d"


class BatchKind(enum.Enum):
    """The statement one batch becomes: one commit of the writer each."""

    MERGE = "merge"  # MERGE INTO from the micro-batch
    UPDATE = "update"  # UPDATE ... SET status, updated_at WHERE id IN (...)
    DELETE = "delete"  # DELETE FROM ... WHERE id IN (...)
    APPEND = "append"  # DataFrame append, inserts only


@dataclass(frozen=True)
class Change:
    op: Op
    row: Row  # a delete carries the row it removes


@dataclass(frozen=True)
class Batch:
    seq: int  # the batch's place in the writer's feed, from 0
    kind: BatchKind
    changes: tuple[Change, ...]

    @property
    def keys(self) -> list[int]:
        return [change.row.id for change in self.changes]


@dataclass
class TableModel:
    """The rows a table holds after a sequence of batches, keyed by ``id``."""

    rows: dict[int, Row] = field(default_factory=dict)

    def apply(self, batch: Batch) -> None:
        if len(set(batch.keys)) != len(batch.keys):
            raise ValueError(f"batch {batch.seq} changes a key twice (a MERGE would refuse it)")
        for change in batch.changes:
            key = change.row.id
            if change.op is Op.DELETE:
                self.rows.pop(key, None)
            elif change.op is Op.INSERT and batch.kind is BatchKind.APPEND and key in self.rows:
                raise ValueError(f"batch {batch.seq} appends key {key}, which exists")
            else:
                self.rows[key] = change.row

    @classmethod
    def replay(cls, batches: Iterable[Batch]) -> TableModel:
        model = cls()
        for batch in batches:
            model.apply(batch)
        return model


@dataclass(frozen=True)
class Mix:
    """The shares of a MERGE batch's changes; the rest of the batch are plain updates."""

    inserts: float = 0.3
    deletes: float = 0.15
    moves: float = 0.2  # updates that move the row to another region (partition)


@dataclass(frozen=True)
class Locality:
    """Changes placed as a CDC stream of orders places them: new rows land in the current
    partition, which moves on every ``batches_per_partition`` batches (as a day does), and updates
    and deletes touch rows inserted in the last ``reach_back`` batches. Rows never move partition.
    Without a locality, every batch touches random rows of every partition."""

    batches_per_partition: int = 10
    reach_back: int = 3

    def region(self, seq: int) -> str:
        """The partition new rows of batch ``seq`` land in."""
        return f"p{seq // self.batches_per_partition:03d}"

    def reaches(self, born: int, seq: int) -> bool:
        """Whether batch ``seq`` may change a row inserted by batch ``born``."""
        return seq - born <= self.reach_back


class ChangeGenerator:
    """Seeded batches over its own model of every batch it made, so updates, moves and deletes
    always name keys that exist, and inserts new ones."""

    def __init__(self, seed: int, regions: Sequence[str] = REGIONS, locality: Locality | None = None) -> None:
        self.random = random.Random(seed)
        self.regions = tuple(regions)
        self.locality = locality
        self.model = TableModel()
        self.next_key = 1
        self.clock = BASE_MICROS
        self.seq = 0
        self.born: dict[int, int] = {}  # key -> the batch that inserted it

    def _tick(self) -> int:
        self.clock += self.random.randint(1, 5_000_000)
        return self.clock

    def _new_row(self) -> Row:
        key, self.next_key = self.next_key, self.next_key + 1
        self.born[key] = self.seq
        region = self.locality.region(self.seq) if self.locality else self.random.choice(self.regions)
        return Row(key, region, self.random.randint(100, 100_000), STATUSES[0], self._tick())

    def _existing(self, count: int) -> list[Row]:
        keys = sorted(self.model.rows)
        if self.locality is not None:
            keys = [key for key in keys if self.locality.reaches(self.born[key], self.seq)]
        return [self.model.rows[key] for key in self.random.sample(keys, min(count, len(keys)))]

    def _emit(self, kind: BatchKind, changes: list[Change]) -> Batch:
        batch = Batch(self.seq, kind, tuple(changes))
        self.seq += 1
        self.model.apply(batch)
        return batch

    def inserts(self, size: int, kind: BatchKind = BatchKind.MERGE) -> Batch:
        return self._emit(kind, [Change(Op.INSERT, self._new_row()) for _ in range(size)])

    def merge(self, size: int, mix: Mix = Mix()) -> Batch:
        """Inserts, updates (some moving region) and deletes, each key at most once."""
        inserts = round(size * mix.inserts)
        touched = self._existing(size - inserts)
        deletes = round(size * mix.deletes)
        moves = round(size * mix.moves)
        changes = [Change(Op.DELETE, row) for row in touched[:deletes]]
        for index, row in enumerate(touched[deletes:]):
            region = row.region
            if index < moves and len(self.regions) > 1 and self.locality is None:
                region = self.random.choice([r for r in self.regions if r != row.region])
            amount = self.random.randint(100, 100_000)
            status = self.random.choice(STATUSES)
            changes.append(Change(Op.UPDATE, Row(row.id, region, amount, status, self._tick())))
        changes += [Change(Op.INSERT, self._new_row()) for _ in range(size - len(changes))]
        self.random.shuffle(changes)
        return self._emit(BatchKind.MERGE, changes)

    def update(self, size: int) -> Batch:
        """One ``UPDATE ... WHERE id IN (...)``: one new status and timestamp for every key."""
        status, stamp = self.random.choice(STATUSES), self._tick()
        rows = self._existing(size)
        return self._emit(BatchKind.UPDATE, [Change(Op.UPDATE, Row(r.id, r.region, r.amount, status, stamp)) for r in rows])

    def delete(self, size: int) -> Batch:
        """One ``DELETE FROM ... WHERE id IN (...)``."""
        return self._emit(BatchKind.DELETE, [Change(Op.DELETE, row) for row in self._existing(size)])


def diff(expected: Mapping[int, Row], actual: Sequence[Row], limit: int = 10) -> list[str]:
    """What differs between the model and the rows read back, one line each (empty: equal)."""
    counts = Counter(row.id for row in actual)
    found = {row.id: row for row in actual}
    lines = [f"key {key} appears {n} times" for key, n in sorted(counts.items()) if n > 1]
    lines += [f"missing {expected[key]}" for key in sorted(expected.keys() - found.keys())]
    lines += [f"unexpected {found[key]}" for key in sorted(found.keys() - expected.keys())]
    lines += [
        f"key {key}: expected {expected[key]}, found {found[key]}"
        for key in sorted(expected.keys() & found.keys())
        if expected[key] != found[key]
    ]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more"]
    return lines
