"""The per-batch upsert rule, kept pure: which row version survives a micro-batch, and in which
partitions an equality delete must be written for its key.

Why every surviving key gets equality deletes (not only updates and deletes): Iceberg applies an
equality delete to data files with a strictly lower sequence number, so a delete committed with a
batch never hits that batch's own data files, and a key that did not exist costs one harmless
delete row (the compactor drops it). In exchange, upserts are idempotent: a re-delivered insert
or a Debezium re-snapshot (op ``r``) of an existing key replaces the row instead of duplicating it.

Where an earlier version of a key may live: the partition of every before-image seen for it in the
batch (the first one is the state before the batch; later ones are harmless), and the partition of
its final after-image. An update without a before-image (e.g. PostgreSQL without REPLICA IDENTITY
FULL) is assumed not to have moved partitions; a delete whose before-image lacks the partition
columns is rejected unless those columns are part of the primary key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from icecdc.ingest.debezium import ChangeEvent, Reason, RejectedEvent
from icecdc.layout import PartitionKey, TableLayout


@dataclass(frozen=True)
class KeyChange:
    """One parsed change as it travels to the reduce stage."""

    op: str
    after: dict[str, Any] | None
    prior_partitions: tuple[PartitionKey, ...]


@dataclass(frozen=True)
class KeyResult:
    """What a batch leaves behind for one key."""

    row: dict[str, Any] | None  # the after-image to write; None when the key ends deleted
    delete_partitions: frozenset[PartitionKey]


def complete_row(layout: TableLayout, after: dict[str, Any]) -> dict[str, Any]:
    """The after-image with every table column present; columns the event did not carry are null."""
    return {c.name: after.get(c.name) for c in layout.columns}


def to_key_change(event: ChangeEvent, layout: TableLayout) -> KeyChange:
    """Attach to a parsed event the partitions where an earlier version of its key may live."""
    partitions: list[PartitionKey] = []
    if event.before is not None:
        before = layout.partition_of(event.before)
        if before is None:
            before = layout.partition_from_key(event.key)
        if before is not None:
            partitions.append(before)
    after = complete_row(layout, event.after) if event.after is not None else None
    if after is not None:
        partitions.append(layout.partition_of(after))  # type: ignore[arg-type]  # complete row
    if not partitions:
        missing = [t.source for t in layout.partition if event.before is None or t.source not in event.before]
        raise RejectedEvent(
            Reason.MISSING_PARTITION_VALUE,
            f"delete of key {list(event.key)} has no before-image value for partition column(s) {missing}; "
            "enable full before-images (PostgreSQL: REPLICA IDENTITY FULL) or partition by key columns",
        )
    return KeyChange(event.op, after, tuple(dict.fromkeys(partitions)))


def reduce_key(changes: Sequence[KeyChange]) -> KeyResult:
    """Collapse one key's changes, given in source order, to what the batch commits."""
    last = changes[-1]
    deletes = frozenset(p for change in changes for p in change.prior_partitions)
    return KeyResult(None if last.op == "d" else last.after, deletes)
