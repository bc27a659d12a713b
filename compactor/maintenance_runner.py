"""Running one kind of maintenance on one table, on the replica that holds the table's
maintenance slot: check cheaply that it would do anything (a run that commits stops the table's
compactions on every replica until it ends, so an idle one must not be announced), confirm the
lease, announce it, wait for the compactions already under way and for the writer's quiet window
(a run that commits), run it, and report a maintenance event, metrics and a log line.

A run that does not commit (orphan removal) waits for nothing and holds nothing back: the sidecar
begins it in its loop and runs it beside the loop (``start``), so the daily listing of a large
table's location does not hold the portability conversions, and equality deletes do not live as
long as the listing takes (docs/BENCHMARKS.md, row "Portability age").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
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
        # Runs beside the loop (``start``): one at a time, on a thread of their own.
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="icecdc-maintenance")
        self._in_flight: dict[tuple[str, MaintenanceKind], Future[MaintenanceEvent | None]] = {}

    def due(self, tables: Iterable[str], owns: Callable[[str], bool], now: float) -> list[tuple[str, MaintenanceKind]]:
        """(table, kind) pairs due now on the tables whose maintenance slot this replica holds."""
        return [(table, kind) for table in tables if owns(table) for kind in self._schedule.due(table, now)]

    def run(self, table: str, kind: MaintenanceKind) -> MaintenanceEvent | None:
        """Run one kind of maintenance on a table; None when a check found nothing to do (not
        worth an event, a lease check or a quiet window)."""
        started = self._clock()
        self._schedule.done(table, kind, started)
        try:
            maintenance = self._begin(table, kind, started)
            if maintenance is None:
                return None
        except CatalogOutage:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed run, reported and logged by _failed; the loop goes on
            return self._failed(table, kind, started, exc)
        return self._run(table, kind, started, maintenance)

    def start(self, table: str, kind: MaintenanceKind) -> bool:
        """Begin a run of a kind that does not commit (``MaintenanceKind.commits``) here (its
        check, lease and started event, which use this thread's Kafka clients) and run it beside
        the loop, on a thread of its own; ``finished`` hands over its event. Returns whether it
        started (not when the check found nothing to do, or the last run of it is still going:
        then it is due again an interval later). A catalog that stays out past the retries fails
        the run, reported as such; it is due again an interval later, as a run the outage cut
        off in the loop is (the loop meets the outage on its own calls and waits there)."""
        if kind.commits:
            raise ValueError(f"{kind.value} commits: it runs in the loop (run)")
        started = self._clock()
        self._schedule.done(table, kind, started)
        if (table, kind) in self._in_flight:
            return False
        try:
            maintenance = self._begin(table, kind, started)
        except CatalogOutage:
            raise
        except Exception as exc:  # noqa: BLE001 - as in run
            self._failed(table, kind, started, exc)
            return False
        if maintenance is None:
            return False

        def beside() -> MaintenanceEvent | None:
            try:
                return self._run(table, kind, started, maintenance)
            except CatalogOutage as exc:
                return self._report(table, kind, int(started * 1000), MaintenanceOutcome.FAILED, str(exc), None)

        self._in_flight[table, kind] = self._beside.submit(beside)
        return True

    def finished(self) -> list[MaintenanceEvent]:
        """The events of the runs beside the loop that ended since the last call."""
        done = [key for key, future in self._in_flight.items() if future.done()]
        events = [self._in_flight.pop(key).result() for key in done]
        return [event for event in events if event is not None]

    @property
    def running_beside(self) -> bool:
        return bool(self._in_flight)

    def close(self) -> None:
        """Wait for the runs beside the loop (the session they run on stops after this)."""
        self._beside.shutdown(wait=True)

    def _begin(self, table: str, kind: MaintenanceKind, started: float) -> Maintenance | None:
        """The cheap check, the lease and the started event; None when there is nothing to do."""
        maintenance = self._maintenance(table)
        if not maintenance.worth_running(kind, int(started * 1000), self._settings):
            return None
        what = f"{kind.value} on {table}"
        self._leases.confirm(maintenance_slot(table, self._leases.ownership.slots), what)
        started_ms = int(started * 1000)
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
        if kind.commits:
            self._wait_for_compactions(table, what)
            self._gate.wait_for_quiet(table)  # expiry and manifest rewrites commit metadata too
        return maintenance

    def _run(self, table: str, kind: MaintenanceKind, started: float, maintenance: Maintenance) -> MaintenanceEvent:
        result: MaintenanceResult
        try:
            now_ms = int(self._clock() * 1000)
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
        except Exception as exc:  # noqa: BLE001 - as in run
            return self._failed(table, kind, started, exc)
        return self._report(table, kind, int(started * 1000), outcome, None, result)

    def _failed(self, table: str, kind: MaintenanceKind, started: float, exc: Exception) -> MaintenanceEvent:
        if isinstance(exc, (LeaseLost, CommitConflict)):
            # It did nothing (its lease moved, or a concurrent commit changed what it worked on):
            # due again at once, on whichever replica holds the slot now.
            self._schedule.due_again(table, kind)
            reason = str(exc)
        else:
            log.exception("%s on %s failed", kind.value, table)
            reason = f"{type(exc).__name__}: {exc}"
        return self._report(table, kind, int(started * 1000), MaintenanceOutcome.FAILED, reason, None)

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
