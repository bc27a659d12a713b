"""``icecdc compact``: the sidecar loop. It consumes commit events, reconciles with table
metadata, and compacts the most worthwhile due partition, one at a time; every attempt ends in a
compaction event, metrics and a log line. Decisions live in ``tracker`` and ``policy``; Kafka,
pyiceberg and Spark are reached only from here and from ``rewrite``/``metadata``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from icecdc import kafka
from icecdc.catalog import catalog_check, pyiceberg_catalog, qualified
from icecdc.compactor import metrics
from icecdc.compactor.metadata import load_table_partitions
from icecdc.compactor.policy import Candidate, plan_rewrite
from icecdc.compactor.rewrite import COMPACTOR_PROPERTY, CompactionConflict, CompactionResult, PartitionCompaction
from icecdc.compactor.settle import WriteCadence, settles_at
from icecdc.compactor.tracker import PartitionState, PartitionTracker
from icecdc.config import Config, TableConfig
from icecdc.coordinator import metrics as coordination_metrics
from icecdc.coordinator.activity import STARTED, TableActivity
from icecdc.coordinator.commits import CommitGate, CommitGaveUp
from icecdc.coordinator.leases import LeaseLost, PartitionLeases
from icecdc.coordinator.maintenance import EXPIRE, MANIFESTS, MaintenanceResult, MaintenanceSchedule, TableMaintenance
from icecdc.coordinator.ownership import maintenance_slot, slot_of
from icecdc.events import CommitEvent, CompactionEvent, MaintenanceEvent
from icecdc.health import Health, serving
from icecdc.ingest.layout import TableLayout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

STATUS_FILE = "compactor-status.json"
RECENT_RESULTS = 1000

# The status file is rewritten at most this often; `icecdc status` trusts it while it is fresh.
STATUS_INTERVAL = 1.0
# On start, a replica reads this many of the latest events of each topic partition: the writers'
# cadences and the compactions and maintenance runs in flight.
EVENT_TAIL = 10_000


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def status_path(config: Config) -> Path:
    return config.state_dir / "compactor" / STATUS_FILE


@dataclass
class CompactorStats:
    commit_events: int = 0
    bad_commit_events: int = 0
    maintenance: deque[MaintenanceEvent] = field(default_factory=lambda: deque(maxlen=RECENT_RESULTS))
    outcomes: dict[str, int] = field(default_factory=dict)
    # The latest compaction events, newest last (bounded: the sidecar runs for months).
    results: deque[CompactionEvent] = field(default_factory=lambda: deque(maxlen=RECENT_RESULTS))

    @property
    def committed(self) -> int:
        return self.outcomes.get("committed", 0)


class CompactorSidecar:
    def __init__(self, config: Config, spark: SparkSession, clock: Callable[[], float] = time.time,
                 health: Health | None = None) -> None:
        self.config = config
        self.settings = config.compactor
        self.replica = self.settings.replica_id or default_replica_id()
        self._spark = spark
        self._clock = clock
        self._catalog = pyiceberg_catalog(config)
        # Each configured table's layout as last read from its metadata.
        self.layouts: dict[str, TableLayout] = {}
        self.tracker = PartitionTracker(self.settings)
        self.stats = CompactorStats()
        coordination = config.coordinator
        self.writers: dict[str, WriteCadence] = {}
        self.activity = TableActivity(coordination.max_compaction_seconds)
        self.schedule = MaintenanceSchedule(coordination.maintenance, started=clock())
        topics = [config.commit_topic, config.compaction_topic, config.maintenance_topic]
        kafka.ensure_topics(config.kafka, topics)
        self.health = health or Health(float("inf"))
        self.health.mark("kafka", False, f"joining consumer group {self.settings.consumer_group}")
        self.leases = PartitionLeases(config, self.replica)
        self._generation = self.leases.ownership.generation
        # Every replica reads every event (the writers' cadences, the others' compactions), so this
        # consumer is outside the group; ownership comes from the group (``self.leases``).
        self._consumer = kafka.tail_consumer(config.kafka, f"{self.settings.consumer_group}.events", topics, EVENT_TAIL)
        self._producer = kafka.producer(config.kafka)
        self.gate = CommitGate(coordination, self.writer, self.poll_events, clock=clock)
        self._last_reconcile = float("-inf")
        self._last_status = float("-inf")
        self.last_event = clock()
        if not self.wait_for_leases(coordination.session_timeout_seconds * 3):
            log.warning("replica %s has not joined consumer group %s yet; it compacts nothing until it has",
                        self.replica, self.settings.consumer_group)

    # ---- inputs ----

    def writer(self, table: str) -> WriteCadence:
        return self.writers.setdefault(table, WriteCadence())

    def poll_leases(self) -> None:
        """Serve the group protocol; on a new assignment, re-read the tables (another replica
        may have compacted the partitions this one now holds)."""
        self.leases.poll()
        ownership = self.leases.ownership
        if ownership.generation != self._generation:
            self._generation = ownership.generation
            self.activity.over_before = self.leases.work_over_before
            coordination_metrics.SLOTS_HELD.set(len(ownership.held))
            if self.leases.joined:
                self.health.mark("kafka", True, f"in consumer group {self.settings.consumer_group}, "
                                                f"holding {len(ownership.held)} of {ownership.slots} slots")
                self._last_reconcile = float("-inf")

    def wait_for_leases(self, timeout: float = 60.0) -> bool:
        """Block until the group has given this replica its first assignment (possibly empty)."""
        deadline = time.monotonic() + timeout
        while not self.leases.joined and time.monotonic() < deadline:
            self.poll_leases()
            time.sleep(0.05)
        self.poll_leases()
        return self.leases.joined

    def _table_config(self, name: str) -> TableConfig | None:
        return next((t for t in self.config.tables if t.name == name), None)

    def reconcile(self, table_name: str) -> None:
        """Replace the tracker's view of one table with its metadata now."""
        table_config = self._table_config(table_name)
        try:
            loaded = load_table_partitions(self._catalog, table_config, self.settings) if table_config else None
        except Exception as exc:  # noqa: BLE001 - a catalog hiccup is retried at the next reconcile
            log.warning("could not read the metadata of %s (retried at the next reconcile): %s", table_name, exc,
                        extra={"table": table_name})
            return
        if loaded is None:
            log.info("table %s does not exist yet; the ingester creates it", table_name)
            return
        self.layouts[table_name] = loaded.layout
        self.tracker.on_metadata(table_name, loaded.sequence_number, loaded.partitions)

    def reconcile_all(self) -> None:
        for table in self.config.tables:
            self.reconcile(table.name)
        self._last_reconcile = self._clock()

    def poll_events(self, timeout: float) -> int:
        """Apply the events that arrive within ``timeout``; returns how many commit events."""
        count = 0
        for message in self._consumer.consume(500, timeout):
            if message.error() is not None:
                log.warning("event topics: %s", message.error())
                continue
            topic = message.topic()
            try:
                if topic == self.config.commit_topic:
                    count += self._on_commit(CommitEvent.from_json(message.value()))
                elif topic == self.config.compaction_topic:
                    self.activity.on_compaction(CompactionEvent.from_json(message.value()))
                else:
                    self.activity.on_maintenance(MaintenanceEvent.from_json(message.value()))
            except Exception as exc:  # noqa: BLE001 - a bad event must not stop the sidecar
                if topic == self.config.commit_topic:
                    self.stats.bad_commit_events += 1
                    metrics.COMMIT_EVENTS.labels("invalid").inc()
                log.warning("ignoring an invalid event at %s[%d]@%d: %s", topic, message.partition(), message.offset(), exc)
        if count:
            self.last_event = self._clock()
        return count

    def _on_commit(self, event: CommitEvent) -> int:
        if self._table_config(event.table) is None:
            return 0
        self.tracker.on_commit(event)
        self.writer(event.table).record(event.commit_time_ms / 1000)
        self.stats.commit_events += 1
        metrics.COMMIT_EVENTS.labels("applied").inc()
        return 1

    # ---- work ----

    def compact(self, candidate: Candidate) -> CompactionEvent:
        state = self.tracker.get(candidate.table, candidate.partition_path)
        assert state is not None
        layout = self.layouts[candidate.table]
        started = self._clock()
        self.tracker.started(state)
        self.write_status(force=True)
        metrics.STARTED.labels(candidate.table, candidate.work.value).inc()
        attempt = state.failures + 1
        result: CompactionResult | None = None
        reason = candidate.reason
        kind = candidate.work.value
        slot = slot_of(candidate.table, candidate.partition_path, self.leases.ownership.slots)
        what = f"compacting {candidate.table} {candidate.partition_path or '(unpartitioned)'}"
        try:
            self.leases.confirm(slot, what)
            partition = tuple(state.partition.get(term.name) for term in layout.partition)
            compaction = PartitionCompaction(self._spark, qualified(self.config, self._table_config(candidate.table)),
                                             layout, partition, self.config.catalog.properties, self.settings.target_file_size_bytes)
            files = compaction.files()
            plan = plan_rewrite(files, candidate.work, self.settings) if files is not None else None
            if plan is None or plan.empty:
                outcome = "skipped"
                reason = f"{reason}; nothing to rewrite at the current snapshot"
            else:
                kind = plan.work.value
                self._publish_compaction(self._event(state, kind, STARTED, reason, attempt, started, started,
                                                     CompactionResult(plan.work, *compaction.starting_snapshot)))
                result = compaction.run(plan, {COMPACTOR_PROPERTY: self.replica}, lambda commit: self.gate.commit(
                    candidate.table, commit, before_attempt=lambda: self.leases.confirm(slot, what)))
                outcome = "committed"
        except LeaseLost as exc:
            self.gate.lease_lost(candidate.table)
            outcome, reason = "fenced", str(exc)
        except (CompactionConflict, CommitGaveUp) as exc:
            outcome, reason = "conflict", str(exc)
        except Exception as exc:
            log.exception("compaction of %s %s failed", candidate.table, candidate.partition_path)
            outcome, reason = "failed", f"{type(exc).__name__}: {exc}"
        now = self._clock()
        if outcome == "fenced":
            self.tracker.released(state)
        elif outcome in ("committed", "skipped"):
            settled = settles_at(state.cadence, self.settings.settle)
            self.tracker.finished(state, now, committed=outcome == "committed")
            if outcome == "committed" and settled is not None and settled <= started:
                metrics.SETTLE_TO_COMPACTED.labels(candidate.table).observe(now - settled)
        elif not self.tracker.failed(state, now):
            outcome, reason = "abandoned", f"{reason} (gave up after {self.settings.max_attempts} attempts, until the next write)"
        event = self._event(state, kind, outcome, reason, attempt, started, now, result)
        self._record(event)
        self.reconcile(candidate.table)
        self.write_status(force=True)  # no longer "compacting", with the new file counts
        return event

    def _event(self, state: PartitionState, kind: str, outcome: str, reason: str, attempt: int,
               started: float, finished: float, result: CompactionResult | None) -> CompactionEvent:
        counts: dict[str, Any] = {}
        if result is not None:
            counts = {
                "starting_snapshot_id": result.starting_snapshot_id,
                "starting_sequence_number": result.starting_sequence_number,
                "snapshot_id": result.committed.snapshot_id if result.committed else None,
                "sequence_number": result.committed.sequence_number if result.committed else None,
                "data_files_rewritten": result.data_files_rewritten, "data_files_added": result.data_files_added,
                "bytes_rewritten": result.bytes_rewritten, "bytes_added": result.bytes_added,
                "delete_files_removed": result.delete_files_removed,
                "position_delete_files_added": result.position_delete_files_added,
            }
        return CompactionEvent(
            table=state.table, partition=dict(state.partition), partition_path=state.path, kind=kind, outcome=outcome,
            replica=self.replica, reason=reason, attempt=attempt, started_ms=int(started * 1000),
            finished_ms=int(finished * 1000), **{"starting_snapshot_id": None, **counts},
        )

    def _record(self, event: CompactionEvent) -> None:
        table = event.table
        metrics.FINISHED.labels(table, event.kind, event.outcome).inc()
        metrics.BYTES_READ.labels(table).inc(event.bytes_rewritten)
        metrics.BYTES_WRITTEN.labels(table).inc(event.bytes_added)
        metrics.DATA_FILES_REMOVED.labels(table).inc(event.data_files_rewritten)
        metrics.DATA_FILES_ADDED.labels(table).inc(event.data_files_added)
        metrics.DELETE_FILES_REMOVED.labels(table).inc(event.delete_files_removed)
        metrics.POSITION_DELETE_FILES_ADDED.labels(table).inc(event.position_delete_files_added)
        self.stats.outcomes[event.outcome] = self.stats.outcomes.get(event.outcome, 0) + 1
        self.stats.results.append(event)
        self._publish_compaction(event)
        seconds = (event.finished_ms - event.started_ms) / 1000
        log.info("%s %s %s: %s in %.1fs (%s; %d data files -> %d, %d delete files removed, %d position-delete files added)",
                 event.kind, table, event.partition_path or "(unpartitioned)", event.outcome, seconds, event.reason,
                 event.data_files_rewritten, event.data_files_added, event.delete_files_removed, event.position_delete_files_added,
                 extra={"table": table, "partition": event.partition_path, "snapshot_id": event.snapshot_id,
                        "sequence_number": event.sequence_number, "kind": event.kind, "outcome": event.outcome,
                        "replica": self.replica})

    def _publish_compaction(self, event: CompactionEvent) -> None:
        self.activity.on_compaction(event)  # this replica's own view, before the topic echoes it
        self._producer.produce(self.config.compaction_topic, key=event.table.encode(), value=event.to_json())
        # A started event must be out before the commit it announces (maintenance reads it).
        self._producer.flush(10) if event.outcome == STARTED else self._producer.poll(0)

    # ---- maintenance ----

    def maintenance_due(self, now: float) -> list[tuple[str, str]]:
        """(table, kind) pairs this replica should run now: those due on the tables whose
        maintenance slot it holds."""
        return [(table.name, kind) for table in self.config.tables
                if table.name in self.layouts and self.leases.owns_maintenance(table.name)
                for kind in self.schedule.due(table.name, now)]

    def wait_for_compactions(self, table: str, what: str) -> None:
        """Wait until no compaction of ``table`` is in flight on any replica. Once the maintenance
        run's "started" event is out no new one starts, so this lasts at most the longest one
        under way: maintenance never waits for a gap between compactions, which on a busy table
        may not come. The group protocol is served meanwhile, so that the compaction of a replica
        that died is forgotten at the rebalance that evicts it; a rebalance ends the wait with
        LeaseLost, since the other replicas no longer honour an announcement older than it."""
        generation = self.leases.ownership.generation
        while self.activity.running_compactions(table, self._clock()):
            self.poll_leases()
            if self.leases.ownership.generation != generation:
                raise LeaseLost(f"a rebalance came while {what} waited for the compactions in flight")
            self.poll_events(0.2)

    def maintain(self, table_name: str, kind: str) -> MaintenanceEvent | None:
        """Run one kind of maintenance on a table; None when a manifest check found nothing to
        merge (checked every minute: not worth an event, a lease check or a quiet window)."""
        settings = self.config.coordinator.maintenance
        slot = maintenance_slot(table_name, self.leases.ownership.slots)
        started = self._clock()
        self.schedule.done(table_name, kind, started)
        base = {"table": table_name, "kind": kind, "replica": self.replica, "started_ms": int(started * 1000)}
        result: MaintenanceResult | None = None
        reason: str | None = None
        try:
            maintenance = TableMaintenance(self._spark, qualified(self.config, self._table_config(table_name)),
                                           {COMPACTOR_PROPERTY: self.replica})
            if kind == MANIFESTS and not maintenance.manifests_due(settings):
                return None
            what = f"{kind} on {table_name}"
            self.leases.confirm(slot, what)
            self._publish_maintenance(MaintenanceEvent(**base, outcome=STARTED, finished_ms=int(started * 1000)))
            self.wait_for_compactions(table_name, what)
            now_ms = int(self._clock() * 1000)
            self.gate.wait_for_quiet(table_name)  # expiry and manifest rewrites commit metadata too
            if kind == EXPIRE:
                starts = [r.starting_snapshot_id for r in self.activity.running_compactions(table_name, self._clock())]
                result = maintenance.expire(now_ms, settings, starts)
            elif kind == MANIFESTS:
                result = maintenance.rewrite_manifests(settings)
            else:
                result = maintenance.remove_orphans(now_ms, settings)
            outcome = "committed" if result.committed else "nothing-to-do"
        except LeaseLost as exc:
            # It did nothing: due again at once, on whichever replica holds the slot now.
            self.schedule.due_again(table_name, kind)
            outcome, reason = "failed", str(exc)
        except Exception as exc:
            log.exception("%s on %s failed", kind, table_name)
            outcome, reason = "failed", f"{type(exc).__name__}: {exc}"
        counts: dict[str, Any] = {}
        if result is not None:
            counts = {"cutoff_ms": result.cutoff_ms, "protected_snapshot_ids": list(result.protected_snapshot_ids),
                      "snapshots_expired": result.snapshots_expired, "files_deleted": result.files_deleted,
                      "manifests_rewritten": result.manifests_rewritten, "manifests_added": result.manifests_added}
        event = MaintenanceEvent(**base, outcome=outcome, finished_ms=int(self._clock() * 1000), reason=reason, **counts)
        self._publish_maintenance(event)
        self.stats.maintenance.append(event)
        coordination_metrics.MAINTENANCE.labels(table_name, kind, outcome).inc()
        coordination_metrics.SNAPSHOTS_EXPIRED.labels(table_name).inc(event.snapshots_expired)
        if kind == "remove-orphans":
            coordination_metrics.ORPHANS_REMOVED.labels(table_name).inc(event.files_deleted)
        coordination_metrics.MANIFESTS_REWRITTEN.labels(table_name).inc(event.manifests_rewritten)
        log.info("%s on %s: %s in %.1fs (%d snapshots expired, %d files deleted, %d manifests rewritten)%s",
                 kind, table_name, outcome, (event.finished_ms - event.started_ms) / 1000, event.snapshots_expired,
                 event.files_deleted, event.manifests_rewritten, f": {reason}" if reason else "",
                 extra={"table": table_name, "kind": kind, "outcome": outcome, "replica": self.replica})
        return event

    def _publish_maintenance(self, event: MaintenanceEvent) -> None:
        self.activity.on_maintenance(event)
        self._producer.produce(self.config.maintenance_topic, key=event.table.encode(), value=event.to_json())
        self._producer.flush(10) if event.outcome == STARTED else self._producer.poll(0)

    # ---- the loop ----

    def due_candidates(self, now: float) -> list[Candidate]:
        """The tracker's candidates in the partitions this replica holds, on tables no
        maintenance run is touching."""
        return [c for c in self.tracker.candidates(now)
                if self.leases.owns(c.table, c.partition_path) and not self.activity.maintenance_running(c.table, now)]

    def run_once(self, poll_timeout: float = 0.0) -> CompactionEvent | None:
        """One turn: read events, reconcile when due, then one piece of work: the maintenance
        run due if any, else a compaction of the best due partition if any. One per turn, so that
        the group protocol is served between two (a rebalance waits for whatever this replica is
        doing). Maintenance goes first because a busy replica always has a partition to compact
        (found by the two-replica test: no maintenance ran in a whole run), and it comes due
        seldom: expiry every ``interval_seconds``, a manifest merge at most once a minute."""
        self.health.beat()
        self.poll_leases()
        self.poll_events(poll_timeout)
        now = self._clock()
        if now - self._last_reconcile >= self.settings.reconcile_seconds:
            self.reconcile_all()
        if (due := self.maintenance_due(now)) and self.maintain(*due[0]) is not None:
            event = None
        else:  # nothing due, or a manifest check that found nothing to merge
            candidates = self.due_candidates(self._clock())
            event = self.compact(candidates[0]) if candidates else None
        self.write_status()
        return event

    def idle(self, until_idle: float) -> bool:
        now = self._clock()
        waiting = [s for s in self.tracker.waiting(now) if self.leases.owns(s.table, s.path)]
        return (self.leases.joined and now - self.last_event >= until_idle and not self.due_candidates(now)
                and not waiting)

    def run(self, until_idle: float | None = None, stop: threading.Event | None = None) -> CompactorStats:
        stop = stop or threading.Event()
        log.info("compactor %s watching %s on %s", self.replica, ", ".join(t.name for t in self.config.tables), self.config.commit_topic)
        while not stop.is_set():
            event = self.run_once(poll_timeout=0.0 if self.due_candidates(self._clock()) else 1.0)
            if event is None and until_idle is not None and self.idle(until_idle):
                break
        return self.stats

    def write_status(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last_status < STATUS_INTERVAL:
            return
        self._last_status = now
        rows = self.tracker.report(now, owned=self.leases.owns)
        for table in self.config.tables:
            counts: dict[str, int] = {}
            for row in rows:
                if row["table"] == table.name:
                    counts[row["state"]] = counts.get(row["state"], 0) + 1
            for state in ("hot", "settling", "settled", "compacting"):
                metrics.PARTITIONS.labels(table.name, state).set(counts.get(state, 0))
        path = status_path(self.config)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps({"replica": self.replica, "updated": now, "partitions": rows}, option=orjson.OPT_INDENT_2))
        temporary.replace(path)

    def close(self) -> None:
        self.write_status(force=True)
        self._consumer.close()
        self.leases.close()  # leaves the group at once: the others take the slots without waiting out a session
        self._producer.flush(30)


def run_compactor(config: Config, until_idle: float | None = None, spark: SparkSession | None = None,
                  stop: threading.Event | None = None) -> CompactorStats:
    """Run the sidecar until stopped (SIGTERM/SIGINT finish the current compaction first) or idle."""
    from icecdc.lifecycle import stop_on_signals
    from icecdc.spark import create_spark_session

    if not config.tables:
        raise ValueError("the configuration lists no tables to compact")
    with serving(config.compactor.http, {"catalog": catalog_check(config)}) as health:
        spark = spark or create_spark_session(config, "icecdc-compactor")
        sidecar = CompactorSidecar(config, spark, health=health)
        try:
            stats = sidecar.run(until_idle, stop or stop_on_signals())
        finally:
            sidecar.close()
    log.info("compactor finished: %d commit events, compactions %s", stats.commit_events, stats.outcomes or "none")
    return stats
