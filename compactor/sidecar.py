"""``icecdc compact``: the sidecar loop. Each turn it serves the group protocol, reads events,
reconciles with table metadata when due, and does one piece of work that ``scheduler`` picks: a
maintenance run due on a table it maintains, or a compaction of the best due partitions it owns.
Orphan removal commits nothing, so the loop only begins it and it runs beside the loop
(``MaintenanceRunner.start``). The parts live in modules of their own (``feed``, ``membership``,
``reconcile``, the runners, ``staging``, ``status``); ``create_sidecar`` wires them to Kafka, the
catalog and Spark.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icecdc.compactor import scheduler
from icecdc.compactor.compaction_runner import CompactionRunner
from icecdc.compactor.feed import EVENT_TAIL, EventFeed, EventTopics
from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.maintenance_runner import MaintenanceRunner
from icecdc.compactor.membership import KAFKA_CHECK, Membership
from icecdc.compactor.policy import Candidate, conversion_margin
from icecdc.compactor.publish import EventPublisher
from icecdc.compactor.reconcile import Reconciler
from icecdc.compactor.rewrite import CompactionJob
from icecdc.compactor.staging import StagedTables
from icecdc.compactor.status import StatusWriter
from icecdc.compactor.tracker import PartitionTracker
from icecdc.compactor.watcher import CommitWatcher
from icecdc.coordinator.activity import TableActivity
from icecdc.coordinator.commits import CommitGate
from icecdc.coordinator.leases import PartitionLeases
from icecdc.coordinator.maintenance import MaintenanceSchedule, TableMaintenance
from icecdc.domain import summary
from icecdc.domain.errors import UserError
from icecdc.domain.events import CompactionEvent, CompactionOutcome, MaintenanceEvent, MaintenanceKind
from icecdc.domain.idle import CatalogWaits, IdleClock
from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import IcebergTable, write_local_files_in_process
from icecdc.runtime import kafka
from icecdc.runtime.catalog import catalog_check, local_warehouse
from icecdc.runtime.config import Config
from icecdc.runtime.health import Health, serving
from icecdc.runtime.outages import CatalogRetry

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# The latest events kept in memory (bounded: the sidecar runs for months).
RECENT_RESULTS = 1000


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class CompactorStats:
    commit_events: int = 0
    bad_commit_events: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    results: deque[CompactionEvent] = field(default_factory=lambda: deque(maxlen=RECENT_RESULTS))
    maintenance: deque[MaintenanceEvent] = field(default_factory=lambda: deque(maxlen=RECENT_RESULTS))

    @property
    def committed(self) -> int:
        return self.outcomes[CompactionOutcome.COMMITTED.value]


class CompactorSidecar:
    def __init__(
        self,
        *,
        config: Config,
        replica: str,
        tracker: PartitionTracker,
        reconciler: Reconciler,
        feed: EventFeed,
        membership: Membership,
        compactions: CompactionRunner,
        maintenance: MaintenanceRunner,
        activity: TableActivity,
        status: StatusWriter,
        publisher: EventPublisher,
        health: Health,
        staging: StagedTables,
        watcher: CommitWatcher | None = None,
        clock: Callable[[], float] = time.time,
        catalog_waits: Callable[[], CatalogWaits] = CatalogWaits,
    ) -> None:
        self.config = config
        self.replica = replica
        self.tracker = tracker
        self.reconciler = reconciler
        self.feed = feed
        self.membership = membership
        self.compactions = compactions
        self.maintenance = maintenance
        self.activity = activity
        self.status = status
        self.publisher = publisher
        self.health = health
        self.staging = staging
        self.watcher = watcher  # the kept tables' commits, found in the catalog
        self._clock = clock
        self._catalog_waits = catalog_waits
        self._quiet = IdleClock(clock(), catalog_waits())
        self.stats = CompactorStats()
        self._maintenance_deferred = False  # the last turn put a conversion ahead of due maintenance
        self.pace = scheduler.RewritePace()  # how fast this replica's rewrites go (``scheduler.convert_first``)
        self._converted_ahead = False  # the last turn put coming conversions ahead of a rewrite
        # How long each maintenance run last took, by (table, kind) (``scheduler.holding_seconds``).
        self._maintenance_seconds: dict[tuple[str, MaintenanceKind], float] = {}
        self._keyless: set[str] = set()  # tables whose equality deletes have no key, told once

    @property
    def layouts(self) -> dict[str, TableLayout]:
        return self.reconciler.layouts

    def candidates(self, now: float) -> list[Candidate]:
        return self._owned(self.tracker.candidates(now), now)

    def _owned(self, candidates: list[Candidate], now: float) -> list[Candidate]:
        owned = scheduler.owned_candidates(
            candidates, self.membership.owns, lambda table: self.activity.maintenance_running(table, now)
        )
        return [c for c in owned if self._keyed(c)]

    def _keyed(self, candidate: Candidate) -> bool:
        """Whether the candidate's equality deletes, if any, have a key to be applied by: a kept
        table with neither a configured key nor identifier fields keeps them, said once."""
        layout, partition = self.layouts.get(candidate.table), self.tracker.get(candidate.table, candidate.partition_path)
        if layout is None or layout.primary_key or partition is None or not partition.stats.equality_delete_files:
            return True
        if candidate.table not in self._keyless:
            self._keyless.add(candidate.table)
            log.warning(
                "table %s has equality deletes but no key (no primary_key configured, no identifier fields): "
                "the sidecar leaves its partitions with equality deletes as they are",
                candidate.table,
                extra={"table": candidate.table},
            )
        return False

    def run_once(self, poll_timeout: float = 0.0) -> list[CompactionEvent]:
        """One turn; returns the compaction it made, one event per partition (none: it made none)."""
        self.health.beat()
        self.membership.serve()
        self.feed.poll(poll_timeout)
        if self.watcher is not None and self.watcher.due(self._clock()):
            self.watcher.poll_all()
        if self.reconciler.due(self._clock()):
            self.reconciler.reconcile_all()
        for table in self.tracker.take_unlisted():
            self.reconciler.reconcile(table)
        events: list[CompactionEvent] = []
        self.stats.maintenance.extend(self.maintenance.finished())
        while True:  # a maintenance check that finds nothing to do hands the turn on (it is no longer due)
            now = self._clock()
            due = self.maintenance.due(
                (t.name for t in self.config.tables if t.name in self.layouts), self.membership.owns_maintenance, now
            )
            settings = self.config.compactor
            step = scheduler.next_step(
                due,
                self.candidates(now),
                settings.partitions_per_job,
                settings.target_file_size_bytes,
                self._maintenance_deferred,
            )
            coming = self._owned(self.tracker.coming_conversions(now), now)
            holding = scheduler.holding_seconds(step, self.pace, self._maintenance_seconds)
            margin, per_job = conversion_margin(settings), settings.partitions_per_job
            ahead = scheduler.convert_first(step, coming, holding, now, margin, per_job, self._converted_ahead)
            self._converted_ahead, step = ahead is not step, ahead
            self._maintenance_deferred = bool(due) and isinstance(step, scheduler.Compact)
            if isinstance(step, scheduler.Maintain) and not step.kind.commits:
                # Begun here and run beside the loop: the turn goes on.
                self.maintenance.start(step.table, step.kind)
                continue
            if isinstance(step, scheduler.Maintain):
                began = self._clock()
                done = self.maintenance.run(step.table, step.kind)
                self._maintenance_seconds[step.table, step.kind] = self._clock() - began
                if done is None:
                    continue
                self.stats.maintenance.append(done)
            elif isinstance(step, scheduler.Compact):
                events = self._compact(step.candidates)
            break
        committed = next((e.table for e in events if e.outcome is CompactionOutcome.COMMITTED), None)
        self.staging.follow(committed_to=committed)
        self.stats.commit_events, self.stats.bad_commit_events = self.feed.commit_events, self.feed.bad_commit_events
        self.status.write()
        return events

    def _compact(self, candidates: Sequence[Candidate]) -> list[CompactionEvent]:
        table = candidates[0].table
        tracked = [self.tracker.get(c.table, c.partition_path) for c in candidates]
        job = [(c, p) for c, p in zip(candidates, tracked, strict=True) if p is not None]
        layout = self.layouts.get(table)
        if not job or layout is None:  # forgotten by a reconcile since they were ranked
            return []
        # A partition of an older spec has a job of its own, listed through that spec.
        layout = layout.for_path(candidates[0].partition_path)
        events = self.compactions.run(job, layout)  # it re-reads the table before reporting the end
        for event in events:
            self.stats.outcomes[event.outcome.value] += 1
            self.stats.results.append(event)
        rewrote = [e for e in events if e.outcome is CompactionOutcome.COMMITTED and e.bytes_rewritten]
        if rewrote:  # conversions rewrite nothing: their pace is not a rewrite's
            seconds = (rewrote[0].finished_ms - rewrote[0].started_ms) / 1000
            self.pace.observe(sum(e.bytes_rewritten for e in rewrote), len(rewrote), seconds)
        self.status.write(force=True)  # no longer "compacting", with the new file counts
        return events

    def idle(self, until_idle: float) -> bool:
        """Whether ``--until-idle`` may stop the sidecar now (``scheduler.idle``): no commit event and no
        wait on the catalog for ``until_idle`` seconds (``icecdc.domain.idle``), nothing to do."""
        now = self._clock()
        self._quiet.activity(self.feed.last_commit_event)
        self._quiet.catalog(self._catalog_waits(), now)
        waiting = any(self.membership.owns(s.table, s.path) for s in self.tracker.waiting(now))
        # Asked from another thread while a job runs: its partition is neither due nor waiting,
        # and what lands meanwhile is answered after it.
        waiting = waiting or any(p.compacting for p in self.tracker) or self.maintenance.running_beside
        waiting = waiting or self.staging.pending
        return scheduler.idle(
            joined=self.membership.joined,
            quiet_seconds=self._quiet.quiet_seconds(now),
            until_idle=until_idle,
            has_candidates=bool(self.candidates(now)),
            waiting=waiting,
        )

    def idle_after_reconcile(self, until_idle: float) -> bool:
        """``idle``, asked again after reading every table's metadata: a catalog that does not
        answer then holds the stop back (the reads wait for it, and the quiet starts again when it
        answers, since the writers were blocked too and have a backlog to commit), and commits
        whose events were lost show up as work."""
        self.reconciler.reconcile_all()
        if self.watcher is not None:
            self.watcher.poll_all()
        return self.idle(until_idle)

    def run(self, until_idle: float | None = None, stop: threading.Event | None = None) -> CompactorStats:
        stop = stop or threading.Event()
        log.info("compactor %s watching %s", self.replica, ", ".join(t.name for t in self.config.tables))
        while not stop.is_set():
            now = self._clock()
            events = self.run_once(poll_timeout=scheduler.poll_timeout(bool(self.candidates(now)), self.tracker.next_due(), now))
            if not events and until_idle is not None and self.idle(until_idle) and self.idle_after_reconcile(until_idle):
                log.info("no commit event for %.0fs and nothing left to do: stopping", until_idle)
                break
        return self.stats

    def close(self) -> None:
        self.maintenance.close()  # a run beside the loop reports its end through the publisher
        self.stats.maintenance.extend(self.maintenance.finished())
        self.status.write(force=True)
        self.feed.close()
        self.membership.close()
        self.publisher.close()


@dataclass(frozen=True)
class _Coordination:
    """What the replicas share through Kafka: who runs what on which table (``activity``), the
    group's leases (``membership``), every replica's events in and out, and the commit gate."""

    activity: TableActivity
    membership: Membership
    feed: EventFeed
    publisher: EventPublisher
    gate: CommitGate


def create_sidecar(
    config: Config, spark: SparkSession, health: Health | None = None, clock: Callable[[], float] = time.time
) -> CompactorSidecar:
    """A sidecar wired to Kafka, the catalog and Spark; it has joined its consumer group (or
    waited three session timeouts for it) when this returns."""
    replica = config.compactor.replica_id or default_replica_id()
    health = health or Health(float("inf"))
    retry = CatalogRetry(config.catalog.retry, "compact", health)
    tracker = PartitionTracker(config.compactor)
    reconciler = Reconciler(config, tracker, retry, clock)
    shared = _coordination(config, replica, tracker, reconciler, health, clock)
    watcher = CommitWatcher(config, tracker, reconciler, shared.feed.found, retry, clock)
    table = _catalog_tables(config, spark, retry)
    staged = [t.name for t in config.tables if t.staging_branch]
    staging = StagedTables(staged, table, shared.membership.owns_maintenance, clock)
    status = StatusWriter(config, replica, tracker, shared.membership.owns, clock, lambda: staging.mains)
    compactions = _compaction_runner(config, replica, spark, table, shared, tracker, reconciler, status, watcher, clock)
    maintenance = _maintenance_runner(config, replica, table, shared, clock)
    sidecar = CompactorSidecar(
        config=config,
        replica=replica,
        tracker=tracker,
        reconciler=reconciler,
        feed=shared.feed,
        membership=shared.membership,
        compactions=compactions,
        maintenance=maintenance,
        activity=shared.activity,
        status=status,
        publisher=shared.publisher,
        health=health,
        staging=staging,
        watcher=watcher,
        clock=clock,
        catalog_waits=retry.waits,
    )
    _wait_joined(config, replica, shared.membership)
    return sidecar


def _coordination(
    config: Config, replica: str, tracker: PartitionTracker, reconciler: Reconciler, health: Health, clock: Callable[[], float]
) -> _Coordination:
    """Creates the event topics, then joins the group, reads the events and opens the gate."""
    topics = EventTopics(config.commit_topic, config.compaction_topic, config.maintenance_topic)
    kafka.ensure_topics(config.kafka, [topics.commits, topics.compactions, topics.maintenance])
    activity = TableActivity(config.coordinator.max_compaction_seconds)
    leases = PartitionLeases(config, replica)
    membership = Membership(leases, activity, config.compactor.consumer_group, health, reconciler.force)
    feed = _event_feed(config, topics, tracker, activity, clock)
    publisher = EventPublisher(kafka.producer(config.kafka), topics, activity)
    gate = CommitGate(config.coordinator, feed.writer, feed.poll, clock=clock)
    return _Coordination(activity, membership, feed, publisher, gate)


def _event_feed(
    config: Config, topics: EventTopics, tracker: PartitionTracker, activity: TableActivity, clock: Callable[[], float]
) -> EventFeed:
    """The feed of every replica's events and the ingester's commit events, read from the
    latest ``EVENT_TAIL`` of each topic partition."""
    consumer = kafka.tail_consumer(
        config.kafka,
        f"{config.compactor.consumer_group}.events",
        [topics.commits, topics.compactions, topics.maintenance],
        EVENT_TAIL,
    )
    return EventFeed(consumer, topics, [t.name for t in config.tables], tracker, activity, clock)


def _catalog_tables(config: Config, spark: SparkSession, retry: CatalogRetry) -> Callable[[str], IcebergTable]:
    """The tables by name through one Java bridge, each opened once and shared by both runners."""
    bridge = JavaBridge(spark)
    if local_warehouse(config.catalog.properties):
        write_local_files_in_process(bridge)

    @functools.cache
    def table(name: str) -> IcebergTable:
        return IcebergTable(bridge, config.table_ref(name), retry)

    return table


def _compaction_runner(
    config: Config,
    replica: str,
    spark: SparkSession,
    table: Callable[[str], IcebergTable],
    shared: _Coordination,
    tracker: PartitionTracker,
    reconciler: Reconciler,
    status: StatusWriter,
    watcher: CommitWatcher,
    clock: Callable[[], float],
) -> CompactionRunner:
    """The runner of compaction jobs on Spark's executors, with the key index they share."""
    settings = config.compactor
    key_index = KeyIndex(settings.key_index_max_bytes) if settings.key_index_max_bytes else None

    def compaction(name: str, layout: TableLayout, partitions: Sequence[PartitionKey] | None) -> CompactionJob:
        return CompactionJob(
            spark,
            table(name),
            layout,
            partitions,
            config.catalog.properties,
            settings.target_file_size_bytes,
            settings.rewrite_engine,
            key_index,
            merge_manifests=settings.merge_manifests,
        )

    return CompactionRunner(
        replica=replica,
        settings=settings,
        tracker=tracker,
        leases=shared.membership,
        gate=shared.gate,
        compactions=compaction,
        publisher=shared.publisher,
        clock=clock,
        on_start=lambda: status.write(force=True),
        key_index=key_index,
        on_finish=reconciler.reconcile,
        writer_guard=watcher.guard,
    )


def _maintenance_runner(
    config: Config, replica: str, table: Callable[[str], IcebergTable], shared: _Coordination, clock: Callable[[], float]
) -> MaintenanceRunner:
    """The runner of table maintenance, on the schedule that starts now."""
    settings = config.coordinator.maintenance

    def serve(seconds: float) -> None:
        shared.membership.serve()
        shared.feed.poll(seconds)

    return MaintenanceRunner(
        replica=replica,
        settings=settings,
        schedule=MaintenanceSchedule(settings, started=clock()),
        activity=shared.activity,
        leases=shared.membership,
        gate=shared.gate,
        publisher=shared.publisher,
        serve=serve,
        clock=clock,
        maintenance=lambda name: TableMaintenance(table(name), {summary.COMPACTOR: replica}),
    )


def _wait_joined(config: Config, replica: str, membership: Membership) -> None:
    """Waits up to three session timeouts for the group's first assignment; a replica that has
    none yet goes on, and compacts nothing until it has one."""
    if not membership.wait_joined(config.coordinator.session_timeout_seconds * 3):
        group = config.compactor.consumer_group
        log.warning("replica %s has not joined consumer group %s yet; it compacts nothing until it has", replica, group)


def run_compactor(
    config: Config, until_idle: float | None = None, spark: SparkSession | None = None, stop: threading.Event | None = None
) -> CompactorStats:
    """Run the sidecar until stopped (SIGTERM/SIGINT finish the current compaction first) or idle."""
    from icecdc.runtime.lifecycle import stop_on_signals, stop_reason
    from icecdc.runtime.spark import spark_session

    if not config.tables:
        raise UserError("the configuration lists no tables to compact")
    pending = {KAFKA_CHECK: f"joining consumer group {config.compactor.consumer_group}"}
    with (
        serving(config.compactor.http, {"catalog": catalog_check(config)}, pending=pending) as health,
        spark_session(config, "icecdc-compactor", spark) as session,
    ):
        sidecar = create_sidecar(config, session, health)
        stop = stop or stop_on_signals()
        try:
            stats = sidecar.run(until_idle, stop)
        finally:
            sidecar.close()
    log.info(
        "compactor finished (%s): %d commit events, compactions %s",
        stop_reason(stop),
        stats.commit_events,
        dict(stats.outcomes) or "none",
    )
    return stats
