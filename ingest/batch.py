"""The per-batch upsert rule, kept pure: which row version survives a micro-batch, and in which
partitions an equality delete must be written for its key.

Every surviving key gets equality deletes, not only updates and deletes, so that upserts are
idempotent (docs/ingest.md, "Why equality deletes for every surviving key"): a delete committed
with a batch never hits that batch's own data files.

An earlier version of a key may live in the partition of its final after-image or in the one
the row had before each update or delete; where that old partition is unknown,
``SourceRules.unknown_partition`` decides (docs/ingest.md, "Sources as they are: before-images").
Unchanged TOAST values take the key's previous after-image in the batch; the rest stay
``unresolved`` for the driver to read from the table (docs/ingest.md, "Unchanged TOAST values").
A table without a primary key only appends: its creates replace nothing, and its updates and
deletes are rejected (docs/ingest.md, "Tables without a primary key").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.domain.sourcespec import DEFAULT_RULES, BeforeImage, SourceRules, UnknownPartition
from icecdc.ingest.debezium import ChangeEvent, Reason, RejectedEvent, append_only_rejection

# Where a change arrived in its topic: (Kafka partition, offset).
SourceOffset = tuple[int, int]


@dataclass(frozen=True)
class KeyChange:
    """One parsed change as it travels to the reduce stage."""

    op: str
    after: dict[str, Any] | None
    prior_partitions: tuple[PartitionKey, ...]
    global_delete: bool = False  # the row's old partition is unknown: delete the key everywhere
    unavailable: frozenset[str] = frozenset()  # columns whose value the source did not send
    moved_from: tuple[Any, ...] | None = None  # a create of a primary-key change: the old key
    moved_to: tuple[Any, ...] | None = None  # a delete of a primary-key change: the new key
    at: SourceOffset | None = None  # where it arrived, set where a primary-key change needs it


@dataclass(frozen=True)
class Image:
    """A row version as far as the batch knows it: ``unresolved`` columns are None in ``row``,
    their values in the earlier version of ``source`` (a key), or nowhere when ``source`` is None.
    ``moved_at`` is where the primary-key change from ``source`` arrived (its create), which tells
    apart the batch's several moves between the same two keys (``unavailable._Resolver``)."""

    row: dict[str, Any]
    unresolved: frozenset[str] = frozenset()
    source: tuple[Any, ...] | None = None
    moved_at: SourceOffset | None = None

    @property
    def complete(self) -> bool:
        return not self.unresolved


@dataclass(frozen=True)
class Moved:
    """A key's last after-image before a primary-key change moved its row to ``to`` (``at``: where
    the change's delete arrived); None when the batch held none, so that the row moved is the
    table's as the batch found it."""

    to: tuple[Any, ...]
    image: Image | None
    at: SourceOffset | None = None


@dataclass(frozen=True)
class KeyResult:
    """What a batch leaves behind for one key."""

    row: dict[str, Any] | None  # the after-image to write; None when the key ends deleted
    delete_partitions: frozenset[PartitionKey]  # empty when ``global_delete``: it covers them all
    global_delete: bool = False
    unresolved: frozenset[str] = frozenset()  # columns of ``row`` the batch does not hold (None in it)
    source: tuple[Any, ...] | None = None  # the key whose earlier version holds them; None: no such key
    moved: tuple[Moved, ...] = field(default_factory=tuple)  # the images primary-key changes took away
    moved_at: SourceOffset | None = None  # ``Image.moved_at`` of the row


def complete_row(layout: TableLayout, after: dict[str, Any]) -> dict[str, Any]:
    """The after-image with every table column present; columns the event did not carry are null."""
    return {c.name: after.get(c.name) for c in layout.columns}


def old_partition(event: ChangeEvent, layout: TableLayout, before_image: BeforeImage) -> PartitionKey | None:
    """The partition the row lived in before an update or delete, or None when it cannot be known."""
    if before_image is BeforeImage.FULL and event.before is not None:
        partition = layout.partition_of(event.before)
        if partition is not None:
            return partition
    return layout.partition_from_key(event.key)


def to_key_change(event: ChangeEvent, layout: TableLayout, rules: SourceRules = DEFAULT_RULES) -> KeyChange:
    """Attach to a parsed event the partitions where an earlier version of its key may live."""
    if layout.append_only:
        if event.op not in ("c", "r"):
            raise append_only_rejection(layout.table, "a delete" if event.op == "d" else "an update")
        # A row without a key replaces nothing: no equality delete, every create is a new row.
        return KeyChange(event.op, complete_row(layout, event.after or {}), ())
    after = complete_row(layout, event.after) if event.after is not None else None
    new_partition = layout.partition_of(after) if after is not None else None
    if event.op in ("c", "r"):  # no earlier version but a replayed one, in the same partition
        return KeyChange(event.op, after, (new_partition,) if new_partition is not None else ())
    old = old_partition(event, layout, rules.before_image)
    if old is not None:
        partitions = (old,) if new_partition is None or new_partition == old else (old, new_partition)
        return KeyChange(event.op, after, partitions)
    if rules.unknown_partition is UnknownPartition.GLOBAL_DELETE:
        return KeyChange(event.op, after, (), global_delete=True)
    if rules.unknown_partition is UnknownPartition.SAME_PARTITION and new_partition is not None:
        return KeyChange(event.op, after, (new_partition,))
    raise RejectedEvent(Reason.MISSING_PARTITION_VALUE, _unknown_partition_detail(event, layout, rules))


def _unknown_partition_detail(event: ChangeEvent, layout: TableLayout, rules: SourceRules) -> str:
    what = "delete" if event.op == "d" else "update"
    sources = [t.source for t in layout.partition if t.source not in layout.primary_key]
    if rules.before_image is BeforeImage.KEY:
        why = f"before_image is key, and the key does not determine partition column(s) {sources}"
    else:
        missing = [s for s in sources if event.before is None or s not in event.before]
        why = f"its before-image has no value for partition column(s) {missing}"
    return (
        f"{what} of key {list(event.key)}: its old partition is unknown ({why}) and unknown_partition is "
        f"{rules.unknown_partition.value}; unknown_partition: global-delete deletes the key in every partition"
    )


def _next_image(previous: Image | None, change: KeyChange, key: tuple[Any, ...], deleted: bool) -> Image:
    """The after-image of ``change`` with its unavailable columns taken from ``previous``."""
    assert change.after is not None
    if not change.unavailable:
        return Image(change.after)
    row = dict(change.after)
    if previous is not None:
        for column in change.unavailable:
            row[column] = previous.row.get(column)
        unresolved = change.unavailable & previous.unresolved
        return Image(row, unresolved, previous.source, previous.moved_at) if unresolved else Image(row)
    for column in change.unavailable:
        row[column] = None
    if change.moved_from is not None:
        source: tuple[Any, ...] | None = change.moved_from  # the row's value lives under its old key
    elif change.op == "u" and not deleted:
        source = key  # the key's version before the batch
    else:
        source = None  # a create, or an update after a delete, that names no earlier version
    return Image(row, change.unavailable, source, change.at if change.moved_from is not None else None)


def fold_images(changes: Sequence[KeyChange], key: tuple[Any, ...] = ()) -> tuple[Image | None, tuple[Moved, ...]]:
    """One key's changes in source order folded into its last image (None when it ends deleted)
    and the images primary-key changes moved away from it."""
    image: Image | None = None
    moved: list[Moved] = []
    deleted = False
    for change in changes:
        if change.op == "d" or change.after is None:
            # A key deleted earlier in the batch and not written since has nothing to move.
            if change.moved_to is not None and (image is not None or not deleted):
                moved.append(Moved(change.moved_to, image, change.at))
            image, deleted = None, True
        else:
            image = _next_image(image, change, key, deleted)
    return image, tuple(moved)


def reduce_plain(
    last_op: str, last_after: dict[str, Any] | None, prior_partitions: Iterable[PartitionKey], global_delete: bool
) -> KeyResult:
    """``reduce_key`` in the common case, from what it reads of the key's changes: none has
    unavailable values or moves the row to another key, so the last after-image is the row."""
    row = None if last_op == "d" else last_after
    if global_delete:
        return KeyResult(row, frozenset(), True)
    return KeyResult(row, frozenset(prior_partitions), False)


def reduce_key(changes: Sequence[KeyChange], key: tuple[Any, ...] = ()) -> KeyResult:
    """Collapse one key's changes, given in source order, to what the batch commits."""
    if all(not change.unavailable and change.moved_to is None for change in changes):
        last = changes[-1]
        priors = (p for change in changes for p in change.prior_partitions)
        return reduce_plain(last.op, last.after, priors, any(change.global_delete for change in changes))
    image, moved = fold_images(changes, key)
    row = image.row if image is not None else None
    final = image if image is not None else Image({})  # the key ends deleted: nothing to resolve
    if any(change.global_delete for change in changes):
        return KeyResult(row, frozenset(), True, final.unresolved, final.source, moved, final.moved_at)
    partitions = frozenset(p for change in changes for p in change.prior_partitions)
    return KeyResult(row, partitions, False, final.unresolved, final.source, moved, final.moved_at)
