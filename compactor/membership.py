"""This replica's place in the compactor group: it serves the group protocol, and when an
assignment changes it makes what the replica knows current again (runs started before the
rebalance are over, and the partitions it now holds are re-read from metadata, since another
replica may have compacted them)."""

from __future__ import annotations

import time
from collections.abc import Callable

from icecdc.coordinator import metrics
from icecdc.coordinator.activity import TableActivity
from icecdc.coordinator.leases import PartitionLeases
from icecdc.coordinator.ownership import Ownership
from icecdc.runtime.health import Health

KAFKA_CHECK = "kafka"


class Membership:
    def __init__(
        self, leases: PartitionLeases, activity: TableActivity, group: str, health: Health, on_new_assignment: Callable[[], None]
    ) -> None:
        self._leases = leases
        self._activity = activity
        self._group = group
        self._health = health
        self._on_new_assignment = on_new_assignment
        self._generation = leases.ownership.generation
        health.mark(KAFKA_CHECK, False, f"joining consumer group {group}")

    @property
    def ownership(self) -> Ownership:
        return self._leases.ownership

    @property
    def joined(self) -> bool:
        return self._leases.joined

    def owns(self, table: str, partition_path: str) -> bool:
        return self._leases.owns(table, partition_path)

    def owns_maintenance(self, table: str) -> bool:
        return self._leases.owns_maintenance(table)

    def confirm(self, slot: int, what: str) -> None:
        self._leases.confirm(slot, what)

    def serve(self) -> None:
        """Serve the group protocol (rebalance callbacks run only from here)."""
        self._leases.poll()
        ownership = self._leases.ownership
        if ownership.generation == self._generation:
            return
        self._generation = ownership.generation
        self._activity.over_before = self._leases.work_over_before
        metrics.SLOTS_HELD.set(len(ownership.held))
        if self._leases.joined:
            self._health.mark(
                KAFKA_CHECK, True, f"in consumer group {self._group}, holding {len(ownership.held)} of {ownership.slots} slots"
            )
            self._on_new_assignment()

    def wait_joined(self, timeout: float) -> bool:
        """Block until the group has given this replica its first assignment (possibly empty)."""
        deadline = time.monotonic() + timeout
        while not self._leases.joined and time.monotonic() < deadline:
            self.serve()
            time.sleep(0.05)
        self.serve()
        return self._leases.joined

    def close(self) -> None:
        self._leases.close()  # leaves the group at once: the others take the slots without waiting out a session
