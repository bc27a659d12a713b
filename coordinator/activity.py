"""Which compactions and maintenance runs are in flight on each table, across all replicas, from
the events they publish when they start and when they finish (plain data; the sidecar feeds it).

A replica that dies mid-run never publishes its end. Its entry is dropped at the first rebalance
this replica takes part in after the death (``over_before``: live replicas join a rebalance only
between two pieces of work, so whatever started before it and is still listed was cut off), and in
any case after the longest a run may take (``max_compaction_seconds``), by when its lease is long
gone and a late commit of it would fail its lease check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from icecdc.domain.events import CompactionEvent, CompactionOutcome, MaintenanceEvent, MaintenanceOutcome


@dataclass(frozen=True)
class RunningCompaction:
    replica: str
    partition_path: str
    starting_snapshot_id: int | None
    started: float


@dataclass
class TableActivity:
    max_seconds: float
    compactions: dict[str, dict[tuple[str, str], RunningCompaction]] = field(default_factory=dict)
    maintenance: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Runs that started before this time are over, whoever ran them: this replica has been given
    # slots by a rebalance it joined at that time, and every live replica joined it only after
    # finishing the run it had under way (``PartitionLeases.work_over_before``).
    over_before: float = float("-inf")

    def on_compaction(self, event: CompactionEvent) -> None:
        running = self.compactions.setdefault(event.table, {})
        key = (event.replica, event.partition_path)
        if event.outcome is CompactionOutcome.STARTED:
            running[key] = RunningCompaction(
                event.replica, event.partition_path, event.starting_snapshot_id, event.started_ms / 1000
            )
        else:
            running.pop(key, None)

    def on_maintenance(self, event: MaintenanceEvent) -> None:
        if not event.kind.commits:  # it holds no compaction back
            return
        if event.outcome is MaintenanceOutcome.STARTED:
            self.maintenance[event.table] = (event.replica, event.started_ms / 1000)
        elif self.maintenance.get(event.table, ("", 0.0))[0] == event.replica:
            del self.maintenance[event.table]

    def _under_way(self, started: float, now: float) -> bool:
        return self.over_before <= started and now - started < self.max_seconds

    def running_compactions(self, table: str, now: float) -> list[RunningCompaction]:
        return [r for r in self.compactions.get(table, {}).values() if self._under_way(r.started, now)]

    def maintenance_running(self, table: str, now: float) -> bool:
        entry = self.maintenance.get(table)
        return entry is not None and self._under_way(entry[1], now)
