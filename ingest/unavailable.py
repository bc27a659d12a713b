"""Values the source did not send, resolved on the driver (pure). A key's row whose unchanged
TOAST values no change of the batch holds (``batch.Image.unresolved``) takes them from the key's
earlier version: the table's current row of that key, or, after a primary-key change, the old
key's last image in the same batch (``batch.Moved``) or else the old key's row in the table. The
writer reads just those keys (``keys_to_read``) and writes the completed rows as a data file of
the batch's own commit; a row whose earlier version exists nowhere is dead-lettered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icecdc.domain.layout import PartitionKey
from icecdc.ingest.batch import Image
from icecdc.ingest.debezium import UNAVAILABLE_PLACEHOLDER

Key = tuple[Any, ...]
# key -> the table's current values of the columns asked for
FoundRows = Mapping[Key, Mapping[str, Any]]


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
    """A key's last image before a primary-key change moved its row to ``to`` (``stages.Tag.MOVED``)."""

    key: Key
    to: Key
    image: Image


@dataclass(frozen=True)
class Resolution:
    rows: list[dict[str, Any]]  # the completed rows, to write
    unresolvable: list[UnresolvedRow]  # no earlier version anywhere: dead-lettered


class _Resolver:
    def __init__(self, moved: Iterable[MovedImage], found: FoundRows) -> None:
        self._moved = {(m.key, m.to): m.image for m in moved}
        self._found = found
        self.wanted: set[Key] = set()  # the table keys the resolutions looked for

    def earlier(self, source: Key | None, key: Key, seen: frozenset[tuple[Key, Key]] = frozenset()) -> Mapping[str, Any] | None:
        """The earlier version of the row now under ``key``, which lived under ``source``."""
        if source is None:
            return None
        image = self._moved.get((source, key)) if source != key else None
        if image is None:
            self.wanted.add(source)
            return self._found.get(source)
        if (source, key) in seen:  # keys swapped back and forth in the batch: no version outside it
            return None
        if image.complete:
            return image.row
        return self.complete(image, source, seen | {(source, key)})

    def complete(self, image: Image, key: Key, seen: frozenset[tuple[Key, Key]] = frozenset()) -> dict[str, Any] | None:
        base = self.earlier(image.source, key, seen)
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
