"""What a table's change source promises, as configured per table: how much of a row's old
values its updates and deletes carry, what to do with a change whose row's old partition cannot
be known, and what to do with a truncate. Plain values, shipped to the executors with each batch.

Why it matters (docs/ingest.md, "Sources as they are"): an update or delete must delete the old
row where it lives, and on a table partitioned by anything the key does not determine
(``days(created_at)``, ``region``) only the old values say where that is. PostgreSQL's default
``REPLICA IDENTITY DEFAULT`` sends the key alone, and with Kafka Connect's schema wrapper the
other columns of the before-image still appear, as nulls or as Debezium's fallback values (``""``,
``0``), which look like real values. So the default trusts before-images for the key only, and a
change whose old partition is then unknown deletes its key in every partition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BeforeImage(str, enum.Enum):
    """What a source's update and delete events carry as the row's old values."""

    # Every column, or at least the key and the partition source columns: MySQL's default
    # (binlog_row_image=FULL), PostgreSQL with REPLICA IDENTITY FULL, or REPLICA IDENTITY USING
    # INDEX on a unique index over the key and the partition source columns.
    FULL = "full"
    # The primary key only, whatever else the event shows: PostgreSQL's REPLICA IDENTITY DEFAULT.
    KEY = "key"


class UnknownPartition(str, enum.Enum):
    """What the ingester does with an update or delete whose row's old partition it cannot know."""

    # An equality delete of the key that applies to every partition (an unpartitioned delete
    # file, Iceberg's "global" delete), in the batch's own commit: exact, at a cost to readers
    # until the compactor resolves it into partition-scoped deletes.
    GLOBAL_DELETE = "global-delete"
    # The change goes to the dead-letter topic.
    DEAD_LETTER = "dead-letter"
    # The row is taken not to have moved: an update deletes its key in the new row's partition
    # only (a row that did move stays behind in its old partition), and a delete, having no new
    # row, goes to the dead-letter topic.
    SAME_PARTITION = "same-partition"


class TruncateMode(str, enum.Enum):
    """What a truncate (Debezium ``op: t``) does."""

    APPLY = "apply"  # the table is emptied in one commit at the truncate's offset
    DEAD_LETTER = "dead-letter"  # the truncate goes to the dead-letter topic; the table keeps its rows


class UnavailableValues(str, enum.Enum):
    """What the ingester does with a value the source did not send: Debezium's placeholder
    (``unavailable.value.placeholder``, ``__debezium_unavailable_value``) for an out-of-line
    (TOAST) value an update left alone, under PostgreSQL's default REPLICA IDENTITY."""

    # The row keeps the value it had: taken from the key's earlier change in the same batch, or
    # read from the table for the few keys that need it; a key with no earlier version anywhere
    # goes to the dead-letter topic.
    RESOLVE = "resolve"
    # A change that carries the placeholder goes to the dead-letter topic.
    DEAD_LETTER = "dead-letter"
    # The placeholder is written as the value, as a writer that does not know of it would.
    KEEP_PLACEHOLDER = "keep-placeholder"


@dataclass(frozen=True)
class SourceRules:
    before_image: BeforeImage = BeforeImage.KEY
    unknown_partition: UnknownPartition = UnknownPartition.GLOBAL_DELETE
    truncate: TruncateMode = TruncateMode.APPLY
    # The table follows the source's columns (new ones added, types widened as Iceberg allows);
    # off, they are counted and logged only.
    evolve_schema: bool = True
    # Without the Connect schema wrapper, a new field's column type is taken from its JSON value.
    infer_new_columns: bool = False
    unavailable_values: UnavailableValues = UnavailableValues.RESOLVE


DEFAULT_RULES = SourceRules()
