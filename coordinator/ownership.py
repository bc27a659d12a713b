"""Partition ownership, as plain data.

Every partition of every table hashes to one of a fixed number of slots; the slots are the
partitions of the lease topic, and Kafka's group protocol gives each slot to exactly one live
member of the compactor consumer group. A replica compacts only the partitions of the slots it
holds. The hash must be the same in every replica and every release, hence CRC-32 rather than
Python's salted ``hash``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

# A table's maintenance (expiry, orphans, manifests) is one more "partition" of it.
MAINTENANCE_KEY = "\x00maintenance"


def slot_of(table: str, partition_path: str, slots: int) -> int:
    return zlib.crc32(f"{table}\x00{partition_path}".encode()) % slots


def maintenance_slot(table: str, slots: int) -> int:
    return slot_of(table, MAINTENANCE_KEY, slots)


@dataclass
class Ownership:
    """The slots this replica holds now. ``generation`` counts assignments, so that work started
    under one assignment can tell that it is no longer current."""

    slots: int
    held: frozenset[int] = frozenset()
    generation: int = 0

    def assign(self, held: set[int] | frozenset[int]) -> None:
        self.generation += 1
        self.held = frozenset(held)

    def revoke(self) -> None:
        self.assign(frozenset())

    def owns(self, table: str, partition_path: str) -> bool:
        return slot_of(table, partition_path, self.slots) in self.held

    def owns_maintenance(self, table: str) -> bool:
        return maintenance_slot(table, self.slots) in self.held
