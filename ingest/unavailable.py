"""Values the source did not send, resolved on the driver (pure). A key's row whose unchanged
TOAST values no change of the batch holds (``batch.Image.unresolved``) takes them from the key's
earlier version: the table's current row of that key, or, after a primary-key change, the old
key's last image before the change (``batch.Moved``, of this batch or of an earlier one whose
create had not come yet: ``PendingMoves``) or else the old key's row in the table as the batch
that moved it found it. The writer reads just those rows (``rows_to_read``) and writes the
completed rows as a data file of the batch's own commit; a row whose earlier version exists
nowhere is dead-lettered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from icecdc.domain.layout import PartitionKey
from icecdc.ingest.batch import Image, SourceOffset
from icecdc.ingest.debezium import UNAVAILABLE_PLACEHOLDER

Key = tuple[Any, ...]
# The table version a key's earlier row is read from: None, the snapshot the batch found (its
# current one); else the id of the snapshot an earlier batch found, for a key change it held.
Version = int | None
NO_SNAPSHOT = -1  # the earlier batch found the table without a snapshot: nothing to read
# (key, version) -> that row's values of the columns asked for
FoundRows = Mapping[tuple[Key, Version], Mapping[str, Any]]
# one primary-key change a resolution followed: (old key, new key, where its delete arrived)
Hop = tuple[Key, Key, SourceOffset | None]
# Batches a key change's image is kept for its create. Debezium sends a key change's delete,
# tombstone and create one after the other, and each batch reads every partition up to its end,
# so the create comes in the batch of the delete or one or two after it; a create later than
# this reads the old key's current row, which is gone, and is dead-lettered (unless a new row
# has taken the old key since: then it takes that row's values, as it did before this store).
KEEP_MOVES_BATCHES = 10


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
    """A key's row the batch could not complete (``stage_rows.Tag.UNRESOLVED``)."""

    key: Key
    image: Image
    partitions: tuple[PartitionKey, ...]  # where the key's earlier version may live (empty: anywhere)
    everywhere: bool  # the key's old partition is unknown
    last: SourceRecord  # its last change


@dataclass(frozen=True)
class MovedImage:
    """A key's last image before a primary-key change moved its row to ``to`` (``stage_rows.Tag.MOVED``);
    ``image`` None: the batch held none, and the row is the table's at ``before``. ``at``: where
    the change's delete arrived."""

    key: Key
    to: Key
    image: Image | None
    at: SourceOffset | None = None
    before: Version = None  # the table as the batch that held the change found it


@dataclass(frozen=True)
class Resolution:
    rows: list[dict[str, Any]]  # the completed rows, to write
    unresolvable: list[UnresolvedRow]  # no earlier version anywhere: dead-lettered
    followed: list[MovedImage]  # the key changes whose images went into ``rows``: their creates came


class _Resolver:
    def __init__(self, moved: Iterable[MovedImage], found: FoundRows) -> None:
        self._moved: dict[tuple[Key, Key], list[MovedImage]] = defaultdict(list)
        for m in moved:
            self._moved[m.key, m.to].append(m)
        self._found = found
        self.wanted: set[tuple[Key, Version]] = set()  # the table rows the resolutions looked for
        self.followed: list[MovedImage] = []

    def _move(self, source: Key, key: Key, moved_at: SourceOffset | None) -> MovedImage | None:
        """The change from ``source`` to ``key`` whose create arrived as ``moved_at``; None when
        none is known (the earlier version is the table's). Rows may move between the same two
        keys more than once (1 -> 0, 0 -> 2, then a new 1 -> 0): the change's delete and create
        share a Kafka partition when both keys do, and there the move is the last delete before
        the create. Across partitions the order is unknown and the last such move is taken."""
        moves = self._moved.get((source, key), [])
        if moved_at is not None:
            partition, offset = moved_at
            same = [m for m in moves if m.at is not None and m.at[0] == partition]
            if same:
                before = [m for m in same if m.at is not None and m.at[1] < offset]
                return max(before, key=lambda m: m.at or moved_at) if before else None
        return moves[-1] if moves else None

    def _read(self, key: Key, version: Version) -> Mapping[str, Any] | None:
        if version == NO_SNAPSHOT:
            return None
        self.wanted.add((key, version))
        return self._found.get((key, version))

    def earlier(
        self,
        source: Key | None,
        key: Key,
        moved_at: SourceOffset | None,
        version: Version,
        seen: frozenset[Hop] = frozenset(),
    ) -> Mapping[str, Any] | None:
        """The earlier version of the row now under ``key``, which lived under ``source``, in
        the table at ``version`` when the batches since hold none."""
        if source is None:
            return None
        move = self._move(source, key, moved_at) if source != key else None
        if move is None:
            return self._read(source, version)
        # A row moved back and forth (2 -> 0, 0 -> 2, 2 -> 0) takes each move once when their
        # order is known; where it is not, the same hop twice means no version outside the batch.
        hop = (source, key, move.at)
        if hop in seen:
            return None
        self.followed.append(move)
        if move.image is None:
            return self._read(source, move.before)
        if move.image.complete:
            return move.image.row
        return self.complete(move.image, source, move.before, seen | {hop})

    def complete(
        self, image: Image, key: Key, version: Version = None, seen: frozenset[Hop] = frozenset()
    ) -> dict[str, Any] | None:
        base = self.earlier(image.source, key, image.moved_at, version, seen)
        if base is None:
            return None
        return {**image.row, **{column: base.get(column) for column in image.unresolved}}


def rows_to_read(rows: Sequence[UnresolvedRow], moved: Sequence[MovedImage]) -> set[tuple[Key, Version]]:
    """The (key, table version) rows the resolution of ``rows`` needs from the table."""
    resolver = _Resolver(moved, {})
    for row in rows:
        resolver.complete(row.image, row.key)
    return resolver.wanted


def columns_to_read(rows: Sequence[UnresolvedRow], moved: Sequence[MovedImage]) -> list[str]:
    """The columns that resolution may take from the table."""
    columns = {c for row in rows for c in row.image.unresolved}
    columns |= {c for m in moved if m.image is not None for c in m.image.unresolved}
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
    return Resolution(completed, unresolvable, resolver.followed)


class PendingMoves:
    """One table's key changes of earlier batches whose create may not have come yet. A batch
    boundary may fall between a key change's delete and its create, with a batch holding only
    the tombstone between them; the create then needs the image the delete took away, or the
    old key's row as the delete's batch found it (its own table read would find the key gone).
    A change leaves once a create took its image, or after ``keep_batches`` batches: a create
    needing no values (no placeholder) is never seen here."""

    def __init__(self, keep_batches: int = KEEP_MOVES_BATCHES) -> None:
        self._keep_batches = keep_batches
        self._batches = 0
        self._moves: list[tuple[int, MovedImage]] = []  # (the batch it came in, the change)

    def __len__(self) -> int:
        return len(self._moves)

    def with_batch(self, moved: Sequence[MovedImage]) -> list[MovedImage]:
        """The changes a batch's creates may take their values from: the pending ones, then its own."""
        return [m for _, m in self._moves] + list(moved)

    def advance(self, moved: Sequence[MovedImage], before: Version, followed: Collection[MovedImage]) -> None:
        """After a batch committed on top of snapshot ``before``: its changes ``moved`` join,
        those whose images ``followed`` took leave, and so do those kept long enough."""
        self._batches += 1
        taken = {id(m) for m in followed}
        kept = [(n, m) for n, m in self._moves if id(m) not in taken and self._batches - n < self._keep_batches]
        kept += [(self._batches, replace(m, before=before)) for m in moved if id(m) not in taken]
        self._moves = kept


def unavailable_detail(key: Any, columns: Iterable[str], why: str) -> str:
    """The dead-letter detail of a change whose columns hold Debezium's placeholder."""
    return (
        f"key {list(key)}: column(s) {sorted(columns)} hold {UNAVAILABLE_PLACEHOLDER!r} (a value the source did not send: "
        f"an unchanged TOAST value; REPLICA IDENTITY FULL sends it) and {why}"
    )
