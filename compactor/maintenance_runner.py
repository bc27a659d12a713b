"""Running one kind of maintenance on one table, on the replica that holds the table's
maintenance slot: check cheaply that it would do anything (a run stops the table's compactions
on every replica until it ends, so an idle one must not be announced), confirm the lease,
announce it, wait for the compactions already under way, wait for the writer's quiet window,
run it, and report a maintenance event, metrics and a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from icecdc.compactor.compaction_runner import Leases
from icecdc.coordinator import metrics
from icecdc.coordinator.activity import TableActivity
from icecdc.coordinator.errors import LeaseLost
from icecdc.coordinator.maintenance import EXPIRE, MANIFESTS, ORPHANS, MaintenanceResult, MaintenanceSchedule
from icecdc.coordinator.ownership import maintenance_slot
from icecdc.domain.errors import CatalogOutage, CommitConflict
from icecdc.domain.events import MaintenanceEvent, MaintenanceKind, MaintenanceOutcome
from icecdc.runtime.config import MaintenanceConfig

log = logging.getLogger(__name__)


class Maintenance(Protocol):
    """Maintenance of one table (``coordinator.maintenance.TableMaintenance``)."""

    def worth_running(self, kind: MaintenanceKind, now_ms: int, settings: MaintenanceConfig) -> bool: ...
    def expire(self, now_ms: int, settings: MaintenanceConfig, running_starts: Iterable[int | None]) -> MaintenanceResult: ...
    def remove_orphans(self, now_ms: int, settings: MaintenanceConfig) -> MaintenanceResult: ...
    def rewrite_manifests(self, settings: MaintenanceConfig) -> MaintenanceResult: ...


class QuietGate(Protocol):
    def wait_for_quiet(self, table: str) -> float: ...


class Publisher(Protocol):
    def maintenance(self, event: MaintenanceEvent) -> None: ...


class MaintenanceRunner:
    def __init__(
        self,
        *,
        replica: str,
        settings: MaintenanceConfig,
        schedule: MaintenanceSchedule,
        activity: TableActivity,
        leases: Leases,
        gate: QuietGate,
        maintenance: Callable[[str], Maintenance],
        publisher: Publisher,
        serve: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self._replica = replica
        self._settings = settings
        self._schedule = schedule
        self._activity = activity
        self._leases = leases
        self._gate = gate
        self._maintenance = maintenance
        self._publisher = publisher
        self._serve = serve  # serves the group protocol and reads events for up to the given seconds
        self._clock = clock

    def due(self, tables: Iterable[str], owns: Callable[[str], bool], now: float) -> list[tuple[str, MaintenanceKind]]:
        """(table, kind) pairs due now on the tables whose maintenance slot this replica holds."""
        return [(table, kind) for table in tables if owns(table) for kind in self._schedule.due(table, now)]

    def run(self, table: str, kind: MaintenanceKind) -> MaintenanceEvent | None:
        """Run one kind of maintenance on a table; None when a check found nothing to do (not
        worth an event, a lease check or a quiet window)."""
        started = self._clock()
        started_ms = int(started * 1000)
        self._schedule.done(table, kind, started)
        result: MaintenanceResult | None = None
        reason: str | None = None
        try:
            maintenance = self._maintenance(table)
            if not maintenance.worth_running(kind, started_ms, self._settings):
                return None
            what = f"{kind.value} on {table}"
            self._leases.confirm(maintenance_slot(table, self._leases.ownership.slots), what)
            self._publisher.maintenance(
                MaintenanceEvent(
                    table=table,
                    kind=kind,
                    outcome=MaintenanceOutcome.STARTED,
                    replica=self._replica,
                    started_ms=started_ms,
                    finished_ms=started_ms,
                )
            )
            self._wait_for_compactions(table, what)
            now_ms = int(self._clock() * 1000)
            self._gate.wait_for_quiet(table)  # expiry and manifest rewrites commit metadata too
            if kind is EXPIRE:
                starts = [r.starting_snapshot_id for r in self._activity.running_compactions(table, self._clock())]
                result = maintenance.expire(now_ms, self._settings, starts)
            elif kind is MANIFESTS:
                result = maintenance.rewrite_manifests(self._settings)
            else:
                result = maintenance.remove_orphans(now_ms, self._settings)
            outcome = MaintenanceOutcome.COMMITTED if result.committed else MaintenanceOutcome.NOTHING_TO_DO
        except CatalogOutage:
            raise
        except (LeaseLost, CommitConflict) as exc:
            # It did nothing (its lease moved, or a concurrent commit changed what it worked on):
            # due again at once, on whichever replica holds the slot now.
            self._schedule.due_again(table, kind)
            outcome, reason = MaintenanceOutcome.FAILED, str(exc)
        except Exception as exc:
            log.exception("%s on %s failed", kind.value, table)
            outcome, reason = MaintenanceOutcome.FAILED, f"{type(exc).__name__}: {exc}"
        return self._report(table, kind, started_ms, outcome, reason, result)

    def _wait_for_compactions(self, table: str, what: str) -> None:
        """Wait until no compaction of ``table`` is in flight on any replica. Once the run's
        ``started`` event is out no new one starts, so this lasts at most the longest one under
        way: maintenance never waits for a gap between compactions, which on a busy table may not
        come. The group protocol is served meanwhile, so that the compaction of a replica that
        died is forgotten at the rebalance that evicts it; a rebalance ends the wait with
        LeaseLost, since the other replicas no longer honour an announcement older than it."""
        generation = self._leases.ownership.generation
        while self._activity.running_compactions(table, self._clock()):
            self._serve(0.2)
            if self._leases.ownership.generation != generation:
                raise LeaseLost(f"a rebalance came while {what} waited for the compactions in flight")

    def _report(
        self,
        table: str,
        kind: MaintenanceKind,
        started_ms: int,
        outcome: MaintenanceOutcome,
        reason: str | None,
        result: MaintenanceResult | None,
    ) -> MaintenanceEvent:
        event = MaintenanceEvent.from_result(
            table=table,
            kind=kind,
            outcome=outcome,
            replica=self._replica,
            started_ms=started_ms,
            finished_ms=int(self._clock() * 1000),
            reason=reason,
            result=result,
        )
        self._publisher.maintenance(event)
        metrics.MAINTENANCE.labels(table, kind.value, outcome.value).inc()
        metrics.SNAPSHOTS_EXPIRED.labels(table).inc(event.snapshots_expired)
        if kind is ORPHANS:
            metrics.ORPHANS_REMOVED.labels(table).inc(event.files_deleted)
        metrics.MANIFESTS_REWRITTEN.labels(table).inc(event.manifests_rewritten)
        log.info(
            "%s on %s: %s in %.1fs (%d snapshots expired, %d files deleted, %d manifests rewritten)%s",
            kind.value,
            table,
            outcome.value,
            (event.finished_ms - event.started_ms) / 1000,
            event.snapshots_expired,
            event.files_deleted,
            event.manifests_rewritten,
            f": {reason}" if reason else "",
            extra={"table": table, "kind": kind.value, "outcome": outcome.value, "replica": self._replica},
        )
        return event
