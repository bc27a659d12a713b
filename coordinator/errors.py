"""What the coordinator refuses a compaction, as exceptions the compactor tells apart (pure: no
Kafka, no catalog, so decisions about them stay testable without either)."""

from __future__ import annotations


class LeaseLost(RuntimeError):
    """This replica no longer holds the slot; whatever it was doing there must not commit."""


class CommitGaveUp(RuntimeError):
    """The compaction lost every commit attempt; nothing was committed."""
