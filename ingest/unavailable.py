"""Values the source did not send, resolved on the driver (pure). A key's row whose unchanged
TOAST values no change of the batch holds (``batch.Image.unresolved``) takes them from the key's
earlier version: the table's current row of that key, or, after a primary-key change, the old
key's last image in the same batch (``batch.Moved``) or else the old key's row in the table. The
writer reads just those keys (``keys_to_read``) and writes the completed rows as a data file of
the batch's own commit; a row whose earlier version exists nowhere is dead-lettered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icecdc.domain.layout import PartitionKey
from icecdc.ingest.batch import Image, SourceOffset
from icecdc.ingest.debezium import UNAVAILABLE_PLACEHOLDER

Key = tuple[Any, ...]
# key -> the table's current values of the columns asked for
FoundRows = Mapping[Key, Mapping[str, Any]]
# one primary-key change a resolution followed: (old key, new key, where its delete arrived)
Hop = tuple[Key, Key, SourceOffset | None]


@dataclass(frozen=True)
class SourceRecord:
    """Where a change came from, and its bytes (a dead letter's content)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class UnresolvedRow:
    """A key's row the batch could not complete (``stages.Tag.UNRESOLVED``)."""

    key: Key
    image: Image
    partitions: tuple[PartitionKey, ...]  # where the key's earlier version may live (empty: anywhere)
    everywhere: bool  # the key's old partition is unknown
    last: SourceRecord  # its last change


@dataclass(frozen=True)
class MovedImage:
    """A key's last image before a primary-key change moved its row to ``to`` (``stages.Tag.MOVED``);
    ``at``: where that change's delete arrived."""

    key: Key
    to: Key
    image: Image
    at: SourceOffset | None = None


@dataclass(frozen=True)
class Resolution:
    rows: list[dict[str, Any]]  # the completed rows, to write
    unresolvable: list[UnresolvedRow]  # no earlier version anywhere: dead-lettered


class _Resolver:
    def __init__(self, moved: Iterable[MovedImage], found: FoundRows) -> None:
        self._moved: dict[tuple[Key, Key], list[MovedImage]] = defaultdict(list)
        for m in moved:
            self._moved[m.key, m.to].append(m)
        self._found = found
        self.wanted: set[Key] = set()  # the table keys the resolutions looked for

    def _move(self, source: Key, key: Key, moved_at: SourceOffset | None) -> MovedImage | None:
        """The batch's change from ``source`` to ``key`` whose create arrived as ``moved_at``;
        None when the batch holds none (the earlier version is the table's). A batch may move
        rows between the same two keys more than once (1 -> 0, 0 -> 2, then a new 1 -> 0): the
        change's delete and create share a Kafka partition when both keys do, and there the move
        is the last delete before the create. Across partitions the order is unknown and the
        batch's last such move is taken."""
        moves = self._moved.get((source, key), [])
        if moved_at is not None:
            partition, offset = moved_at
            same = [m for m in moves if m.at is not None and m.at[0] == partition]
            if same:
                before = [m for m in same if m.at is not None and m.at[1] < offset]
                return max(before, key=lambda m: m.at or moved_at) if before else None
        return moves[-1] if moves else None

    def earlier(
        self, source: Key | None, key: Key, moved_at: SourceOffset | None, seen: frozenset[Hop] = frozenset()
    ) -> Mapping[str, Any] | None:
        """The earlier version of the row now under ``key``, which lived under ``source``."""
        if source is None:
            return None
        move = self._move(source, key, moved_at) if source != key else None
        if move is None:
            self.wanted.add(source)
            return self._found.get(source)
        # A row moved back and forth (2 -> 0, 0 -> 2, 2 -> 0) takes each move once when their
        # order is known; where it is not, the same hop twice means no version outside the batch.
        hop = (source, key, move.at)
        if hop in seen:
            return None
        if move.image.complete:
            return move.image.row
        return self.complete(move.image, source, seen | {hop})

    def complete(self, image: Image, key: Key, seen: frozenset[Hop] = frozenset()) -> dict[str, Any] | None:
        base = self.earlier(image.source, key, image.moved_at, seen)
        if base is None:
            return None
        return {**image.row, **{column: base.get(column) for column in image.unresolved}}


def keys_to_read(rows: Sequence[UnresolvedRow], moved: Sequence[MovedImage]) -> set[Key]:
    """The keys whose rows in the table the resolution of ``rows`` needs."""
    resolver = _Resolver(moved, {})
    for row in rows:
        resolver.complete(row.image, row.key)
    return resolver.wanted


def columns_to_read(rows: Sequence[UnresolvedRow], moved: Sequence[MovedImage]) -> list[str]:
    """The columns that resolution may take from the table."""
    columns = {c for row in rows for c in row.image.unresolved} | {c for m in moved for c in m.image.unresolved}
    return sorted(columns)


def resolve(rows: Sequence[UnresolvedRow], moved: Sequence[MovedImage], found: FoundRows) -> Resolution:
    """Every row completed from its key's earlier version, or unresolvable."""
    resolver = _Resolver(moved, found)
    completed, unresolvable = [], []
    for row in rows:
        done = resolver.complete(row.image, row.key)
        if done is None:
            unresolvable.append(row)
        else:
            completed.append(done)
    return Resolution(completed, unresolvable)


def unavailable_detail(key: Any, columns: Iterable[str], why: str) -> str:
    """The dead-letter detail of a change whose columns hold Debezium's placeholder."""
    return (
        f"key {list(key)}: column(s) {sorted(columns)} hold {UNAVAILABLE_PLACEHOLDER!r} (a value the source did not send: "
        f"an unchanged TOAST value; REPLICA IDENTITY FULL sends it) and {why}"
    )
