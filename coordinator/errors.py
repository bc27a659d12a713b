"""What the coordinator refuses a compaction, as exceptions the compactor tells apart (pure: no
Kafka, no catalog, so decisions about them stay testable without either)."""

from __future__ import annotations

from icecdc.domain.errors import CommitConflict


class LeaseLost(RuntimeError):
    """This replica no longer holds the slot; whatever it was doing there must not commit."""


class CommitGaveUp(RuntimeError):
    """The compaction lost every commit attempt; nothing was committed."""


class WriterWroteThere(CommitConflict):
    """A writer that deletes rows in place or replaces files committed to the compaction's
    partitions since its starting snapshot: its next commit may name the files the compaction
    replaces, so the compaction gives this attempt up (the sidecar's conflict, never the writer's)."""
