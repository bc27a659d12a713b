"""The compactor's loop without Spark, Kafka or a catalog: every outcome an attempt can end in,
driven through the compaction runner with fakes for the lease, the gate, the compaction and the
event publisher; the maintenance runner; the turn decision; the event feed."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
import pytest

from icecdc.compactor import metrics, scheduler
from icecdc.compactor.compaction_runner import CompactionRunner
from icecdc.compactor.feed import EventFeed, EventTopics
from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.maintenance_runner import MaintenanceRunner
from icecdc.compactor.outcomes import Answered, BackingOff, Idle, Outcome
from icecdc.compactor.plans import PartitionFiles, RewritePlan
from icecdc.compactor.policy import Candidate, PartitionStats, Work
from icecdc.compactor.rewrite import CompactionResult
from icecdc.compactor.tracker import PartitionTracker, TrackedPartition
from icecdc.coordinator.activity import TableActivity
from icecdc.coordinator.errors import CommitGaveUp, LeaseLost
from icecdc.coordinator.maintenance import EXPIRE, MANIFESTS, ORPHANS, MaintenanceResult, MaintenanceSchedule
from icecdc.coordinator.ownership import Ownership, slot_of
from icecdc.domain.errors import CatalogOutage, CommitConflict, CompareAndSetLost
from icecdc.domain.events import (
    CommitEvent,
    CompactionCounts,
    CompactionEvent,
    CompactionKind,
    CompactionOutcome,
    MaintenanceEvent,
    MaintenanceKind,
    MaintenanceOutcome,
    PartitionDelta,
)
from icecdc.domain.files import LiveDataFile
from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.jvm.tables import CommittedSnapshot, Snapshot
from icecdc.runtime.config import CompactorConfig, MaintenanceConfig, SettleConfig

SETTINGS = CompactorConfig(
    max_attempts=3,
    retry_base_seconds=10,
    retry_max_seconds=100,
    settle=SettleConfig(min_seconds=1, initial_seconds=1, max_seconds=10),
)
LAYOUT = TableLayout(
    "db.t",
    "topic",
    (Column("id", "long", True), Column("p", "string")),
    {"id": 1, "p": 2},
    ("id",),
    (PartitionTerm("p", "p", "identity", "string", 1000),),
    0,
    "/warehouse/db/t/data",
)
SNAPSHOT = CommittedSnapshot(9, 8, 5, 0, "replace")


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeLeases:
    ownership: Ownership = field(default_factory=lambda: Ownership(4, frozenset(range(4))))
    lost: bool = False
    confirmed: list[str] = field(default_factory=list)

    def confirm(self, slot: int, what: str) -> None:
        if self.lost:
            raise LeaseLost(f"slot {slot} moved")
        self.confirmed.append(what)


class FakeGate:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.leases_lost: list[str] = []
        self.commit_by: list[float | None] = []  # each commit's deadline, as the runner gave it

    def commit(self, table, attempt, before_attempt=lambda: None, commit_by=None):
        self.commit_by.append(commit_by)
        before_attempt()
        if self.error is not None:
            raise self.error
        return attempt()

    def lease_lost(self, table: str) -> None:
        self.leases_lost.append(table)

    def wait_for_quiet(self, table: str) -> float:
        return 0.0


class FakeCompaction:
    """A job that lists the given files for each of its partitions; ``run`` commits through the
    gate, or raises ``error``."""

    def __init__(self, files: PartitionFiles | None, error: Exception | None = None) -> None:
        self._files = files
        self._error = error
        self.partitions: list | None = None
        self.plans: list[RewritePlan] = []

    def files(self) -> list[PartitionFiles] | None:
        if isinstance(self._error, CatalogOutage):
            raise self._error
        if self._files is None:
            return None
        return [self._files for _ in self.partitions or [None]]

    @property
    def starting_snapshot(self) -> Snapshot:
        return Snapshot(8, 7, 4, 0, "append", {})

    def run(self, plans, tags, commit) -> list[CompactionResult]:
        self.plans = list(plans)
        if self._error is not None:
            raise self._error
        committed = commit(lambda: SNAPSHOT)
        return [
            CompactionResult(
                p.work,
                CompactionCounts(8, 4, committed.snapshot_id, committed.sequence_number, len(p.rewrite), delete_files_removed=1),
                committed,
            )
            for p in plans
        ]


class Published(list):
    def compaction(self, event: CompactionEvent) -> None:
        self.append(event)

    def maintenance(self, event: MaintenanceEvent) -> None:
        self.append(event)


SMALL_FILES = PartitionFiles.of([LiveDataFile(f"f{i}", 100, 10, 1) for i in range(3)], ())


def runner(
    compaction: FakeCompaction,
    gate: FakeGate | None = None,
    leases: FakeLeases | None = None,
    clock: Clock | None = None,
    key_index: KeyIndex | None = None,
) -> tuple[CompactionRunner, Published]:
    published = Published()
    settings = SETTINGS.model_copy(update={"min_small_files": 2})
    return CompactionRunner(
        replica="r1",
        settings=settings,
        tracker=PartitionTracker(settings),
        leases=leases or FakeLeases(),
        gate=gate or FakeGate(),
        compactions=lambda table, layout, partitions: setattr(compaction, "partitions", partitions) or compaction,
        publisher=published,
        clock=clock or Clock(),
        rng=random.Random(0),
        key_index=key_index,
    ), published


def state(region: str = "eu") -> TrackedPartition:
    s = TrackedPartition("db.t", f"p={region}", {"p": region}, PartitionStats(data_files=3, small_files=3))
    s.cadence.record(900.0)
    return s


CANDIDATE = Candidate("db.t", "p=eu", Work.MINOR, "3 small files", 1.0, 1.0)


def run_one(run: CompactionRunner, s: TrackedPartition) -> CompactionEvent:
    [event] = run.run([(CANDIDATE, s)], LAYOUT)
    return event


def test_a_commit_is_announced_then_reported_and_answers_the_partition():
    s = state()
    run, published = runner(FakeCompaction(SMALL_FILES))
    event = run_one(run, s)
    assert [e.outcome for e in published] == [Outcome.STARTED, Outcome.COMMITTED]
    assert published[0].starting_snapshot_id == 8 and published[0].snapshot_id is None
    assert (event.snapshot_id, event.sequence_number, event.data_files_rewritten, event.kind) == (9, 5, 3, "minor")
    assert s.state == Answered(900.0) and s.answered(settled=True) and s.last_compaction == 1000.0


@pytest.mark.parametrize("hot", [False, True])
def test_a_settled_partition_whose_files_a_job_rewrote_leaves_the_key_index(hot):
    s = state()
    key = tuple(s.partition.get(t.name) for t in LAYOUT.partition)
    index = KeyIndex(1 << 20)
    index.add(("db.t", key), "f0", 1, pa.table({"1": pa.array([1, 2], pa.int64())}))
    index.add(("db.t", ("us",)), "g0", 1, pa.table({"1": pa.array([3], pa.int64())}))
    run, _ = runner(FakeCompaction(SMALL_FILES), key_index=index)
    [event] = run.run([(dataclasses.replace(CANDIDATE, hot=hot), s)], LAYOUT)
    assert event.outcome is Outcome.COMMITTED
    # A hot partition's pack leaves the rest of its files indexed (the next reconcile drops the packed ones).
    assert index.partitions == ([("db.t", key), ("db.t", ("us",))] if hot else [("db.t", ("us",))])
    assert metrics.KEY_INDEX_KEYS.labels("db.t")._value.get() == (3 if hot else 1)


@pytest.mark.parametrize("files", [None, PartitionFiles((), ())], ids=["empty table", "nothing to rewrite"])
def test_nothing_to_rewrite_is_skipped_and_answered_without_an_announcement(files):
    s = state()
    run, published = runner(FakeCompaction(files))
    event = run_one(run, s)
    assert [e.outcome for e in published] == [Outcome.SKIPPED] and event.outcome is Outcome.SKIPPED
    assert "nothing to rewrite" in (event.reason or "") and s.answered(settled=True) and s.last_compaction is None


@pytest.mark.parametrize("error", [CommitConflict("files changed"), CompareAndSetLost("lost"), CommitGaveUp("gave up")])
def test_losing_to_a_concurrent_change_is_a_conflict_retried_with_backoff(error):
    s = state()
    run, _ = runner(FakeCompaction(SMALL_FILES), gate=FakeGate(error))
    event = run_one(run, s)
    assert event.outcome is Outcome.CONFLICT
    assert isinstance(s.state, BackingOff) and s.state.failures == 1 and 1005 <= s.state.retry_at <= 1010
    assert not s.answered(settled=True)


def test_any_other_error_fails_and_is_retried_then_abandoned_until_the_next_write():
    s = state()
    clock = Clock()
    run, _ = runner(FakeCompaction(SMALL_FILES, RuntimeError("disk full")), clock=clock)
    assert run_one(run, s).outcome is Outcome.FAILED
    assert run_one(run, s).outcome is Outcome.FAILED
    last = run_one(run, s)
    assert last.outcome is Outcome.ABANDONED and "gave up after 3 attempts" in (last.reason or "")
    assert last.attempt == 3 and s.state == Answered(900.0) and s.answered(settled=True)


def test_a_lost_lease_fences_the_attempt_without_backoff_or_answer():
    s = state()
    gate = FakeGate()
    run, published = runner(FakeCompaction(SMALL_FILES), gate=gate, leases=FakeLeases(lost=True))
    event = run_one(run, s)
    assert event.outcome is Outcome.FENCED and gate.leases_lost == ["db.t"]
    assert [e.outcome for e in published] == [Outcome.FENCED]
    assert s.state == Idle() and not s.answered(settled=True)


def test_a_catalog_outage_stops_the_command_instead_of_counting_as_a_failure():
    run, published = runner(FakeCompaction(SMALL_FILES, CatalogOutage("gone for 600s")))
    with pytest.raises(CatalogOutage):
        run_one(run, state())
    assert published == []


def test_a_job_of_several_partitions_commits_once_and_reports_each_partition():
    states = [state("eu"), state("us"), state("ap")]
    files = {"eu": SMALL_FILES, "us": PartitionFiles((), ()), "ap": SMALL_FILES}

    class ThreePartitions(FakeCompaction):
        def files(self):
            return [files[key[0]] for key in self.partitions or []]

    compaction = ThreePartitions(SMALL_FILES)
    run, published = runner(compaction)
    job = [(Candidate("db.t", s.path, Work.MINOR, "3 small files", 1.0, 1.0), s) for s in states]
    events = run.run(job, LAYOUT)
    assert compaction.partitions == [("eu",), ("us",), ("ap",)]
    assert [len(p.rewrite) for p in compaction.plans] == [3, 0, 3]  # one plan a partition, in order
    # The partition with nothing to do at the starting snapshot is skipped on its own, unannounced.
    assert [(e.partition_path, e.outcome) for e in published] == [
        ("p=eu", Outcome.STARTED),
        ("p=ap", Outcome.STARTED),
        ("p=eu", Outcome.COMMITTED),
        ("p=us", Outcome.SKIPPED),
        ("p=ap", Outcome.COMMITTED),
    ]
    assert [e.snapshot_id for e in events] == [9, None, 9]
    assert all(not s.compacting and s.answered(settled=True) for s in states)


def test_a_failed_job_fails_every_partition_it_had_work_for():
    states = [state("eu"), state("us")]
    run, _ = runner(FakeCompaction(SMALL_FILES), gate=FakeGate(CommitConflict("files changed")))
    events = run.run([(CANDIDATE, states[0]), (Candidate("db.t", "p=us", Work.MINOR, "", 1.0, 1.0), states[1])], LAYOUT)
    assert [e.outcome for e in events] == [Outcome.CONFLICT, Outcome.CONFLICT]
    assert all(isinstance(s.state, BackingOff) and s.state.failures == 1 for s in states)


def test_a_job_checks_the_lease_of_every_partition_it_commits():
    leases = FakeLeases(ownership=Ownership(64, frozenset(range(64))))
    run, _ = runner(FakeCompaction(SMALL_FILES), leases=leases)
    job = [(Candidate("db.t", s.path, Work.MINOR, "", 1.0, 1.0), s) for s in (state("eu"), state("us"), state("ap"))]
    run.run(job, LAYOUT)
    slots = {slot_of("db.t", path, 64) for path in ("p=eu", "p=us", "p=ap")}
    # Once before the job starts and once before the commit attempt, every slot.
    assert len(leases.confirmed) == 2 * len(slots)


def test_outcomes_that_do_not_end_an_attempt_are_refused():
    tracker, s = PartitionTracker(SETTINGS), state()
    tracker.begin(s)
    with pytest.raises(ValueError):
        tracker.resolve(s, Outcome.STARTED, "", started=0, now=1, rng=random.Random(0))


def test_a_committed_compaction_of_a_settled_partition_reports_how_long_after_settling():
    tracker, s = PartitionTracker(SETTINGS), state()  # written at 900, settles at 901 (min window 1 s, one write seen)
    tracker.begin(s)
    resolution = tracker.resolve(s, Outcome.COMMITTED, "", started=950, now=960, rng=random.Random(0))
    assert resolution.settled_for == pytest.approx(59)


# ---- maintenance ----


class FakeMaintenance:
    def __init__(self, worth: bool = True, error: Exception | None = None) -> None:
        self.worth, self.error, self.ran = worth, error, []
        self.listed = threading.Event()  # lets an orphan listing end

    def worth_running(self, kind, now_ms, settings) -> bool:
        return self.worth

    def expire(self, now_ms, settings, running_starts) -> MaintenanceResult:
        self.ran.append(("expire", list(running_starts)))
        if self.error:
            raise self.error
        return MaintenanceResult(EXPIRE, True, cutoff_ms=5, protected_snapshot_ids=(3,), snapshots_expired=2, files_deleted=4)

    def rewrite_manifests(self, settings) -> MaintenanceResult:
        self.ran.append(("manifests", []))
        return MaintenanceResult(MANIFESTS, False)

    def remove_orphans(self, now_ms, settings) -> MaintenanceResult:
        self.ran.append(("orphans", []))
        if not self.listed.wait(30):
            raise AssertionError("the listing was never let go")
        return MaintenanceResult(ORPHANS, True, cutoff_ms=5, files_deleted=3)


def never_served(seconds: float) -> None:
    raise AssertionError("waited for the compactions in flight")


def maintenance_runner(
    maintenance: FakeMaintenance, leases: FakeLeases | None = None, serve: Callable[[float], None] = lambda seconds: None
) -> tuple[MaintenanceRunner, Published, MaintenanceSchedule]:
    published = Published()
    settings = MaintenanceConfig()
    schedule = MaintenanceSchedule(settings, started=0)
    activity = TableActivity(max_seconds=60)
    return (
        MaintenanceRunner(
            replica="r1",
            settings=settings,
            schedule=schedule,
            activity=activity,
            leases=leases or FakeLeases(),
            gate=FakeGate(),
            maintenance=lambda table: maintenance,
            publisher=published,
            serve=serve,
            clock=Clock(),
        ),
        published,
        schedule,
    )


def test_maintenance_with_nothing_to_do_announces_nothing_and_hands_the_turn_on():
    run, published, schedule = maintenance_runner(FakeMaintenance(worth=False))
    assert run.run("db.t", EXPIRE) is None
    assert published == [] and EXPIRE not in schedule.due("db.t", 1000.0)


def test_maintenance_is_announced_then_reported_with_its_counts():
    maintenance = FakeMaintenance()
    run, published, _ = maintenance_runner(maintenance)
    event = run.run("db.t", EXPIRE)
    assert [e.outcome for e in published] == [MaintenanceOutcome.STARTED, MaintenanceOutcome.COMMITTED]
    assert event is not None and (event.snapshots_expired, event.files_deleted, event.protected_snapshot_ids) == (2, 4, [3])
    assert run.run("db.t", MANIFESTS).outcome is MaintenanceOutcome.NOTHING_TO_DO


@pytest.mark.parametrize("error", [LeaseLost("moved"), CommitConflict("manifest gone")], ids=["lease", "conflict"])
def test_maintenance_that_did_nothing_is_due_again_at_once(error):
    leases = FakeLeases(lost=isinstance(error, LeaseLost))
    run, _, schedule = maintenance_runner(FakeMaintenance(error=error), leases)
    event = run.run("db.t", EXPIRE)
    assert event is not None and event.outcome is MaintenanceOutcome.FAILED
    assert EXPIRE in schedule.due("db.t", 1000.0)


def test_orphan_removal_is_begun_in_the_loop_and_runs_beside_it():
    maintenance = FakeMaintenance()
    run, published, schedule = maintenance_runner(maintenance, serve=never_served)
    in_flight = CompactionEvent(
        table="db.t",
        partition={},
        partition_path="p",
        kind=CompactionKind.CONVERT,
        outcome=CompactionOutcome.STARTED,
        replica="r2",
        started_ms=999_000,
        finished_ms=999_000,
    )
    run._activity.on_compaction(in_flight)
    # Started with a compaction in flight on another replica: nothing waits for it.
    assert run.start("db.t", ORPHANS) and run.running_beside
    assert [e.outcome for e in published] == [MaintenanceOutcome.STARTED]
    assert run.finished() == [] and ORPHANS not in schedule.due("db.t", 1.0)
    assert not run.start("db.t", ORPHANS)  # its last run still going: not a second one
    maintenance.listed.set()
    for _ in range(3000):  # bounded: the fake listing ends as soon as it is let go
        if events := run.finished():
            break
        time.sleep(0.01)
    assert [(e.kind, e.outcome, e.files_deleted) for e in events] == [(ORPHANS, MaintenanceOutcome.COMMITTED, 3)]
    assert not run.running_beside and maintenance.ran == [("orphans", [])]
    with pytest.raises(ValueError, match="commits"):
        run.start("db.t", EXPIRE)
    run.close()


# ---- the turn ----


def test_maintenance_goes_first_then_the_best_candidate_then_nothing():
    due = [("db.t", MaintenanceKind.MANIFESTS)]
    assert scheduler.next_step(due, [CANDIDATE]) == scheduler.Maintain("db.t", MaintenanceKind.MANIFESTS)
    assert scheduler.next_step([], [CANDIDATE]) == scheduler.Compact((CANDIDATE,))
    assert scheduler.next_step([], []) is None


def test_a_conversion_the_portability_target_asks_for_goes_ahead_of_maintenance_once_then_they_take_turns():
    due = [("db.t", MaintenanceKind.MANIFESTS)]
    conversion = dataclasses.replace(CANDIDATE, work=Work.CONVERT, hot=True, due_by=5.0)
    ranked = [conversion, CANDIDATE]
    assert scheduler.next_step(due, ranked) == scheduler.Compact((conversion,))
    assert scheduler.next_step(due, ranked, maintenance_deferred=True) == scheduler.Maintain("db.t", MaintenanceKind.MANIFESTS)
    # With no maintenance due, the conversions go on one after another.
    assert scheduler.next_step([], ranked, maintenance_deferred=True) == scheduler.Compact((conversion,))
    # Work for reads and file counts never goes ahead of maintenance.
    assert scheduler.next_step(due, [CANDIDATE]) == scheduler.Maintain("db.t", MaintenanceKind.MANIFESTS)


MB = 1024 * 1024


def test_coming_conversions_go_ahead_of_a_rewrite_that_would_hold_them_past_their_due_time():
    pace = scheduler.RewritePace(bytes_per_second=10 * MB, measured=True)
    merge = dataclasses.replace(job_candidate("big", 96 * MB), cost=96 * MB)
    coming = [
        dataclasses.replace(job_candidate(p, 10, hot=True, work=Work.CONVERT), due_by=due_by, reason="r")
        for p, due_by in (("a", 112.0), ("b", 115.0))
    ]
    margin = 5.0  # due at 107 and 110
    step = scheduler.Compact((merge,))
    seconds = scheduler.holding_seconds(step, pace, {})
    assert seconds == pytest.approx(9.6)  # at that pace
    converted = scheduler.convert_first(step, coming, seconds, 100.0, margin, 16)
    assert isinstance(converted, scheduler.Compact)
    assert [c.partition_path for c in converted.candidates] == ["a", "b"]  # both, in one job
    assert "ahead of a rewrite expected to take 9.6s" in converted.candidates[0].reason
    # A rewrite that ends before the first comes due, no conversion coming, or a conversion
    # already the step: left as it is.
    assert scheduler.convert_first(step, coming, seconds, 96.0, margin, 16) == step
    assert scheduler.convert_first(step, [], seconds, 100.0, margin, 16) == step
    due = scheduler.Compact((dataclasses.replace(coming[0], due_by=101.0),))
    assert scheduler.convert_first(due, coming, seconds, 100.0, margin, 16) == due
    assert scheduler.convert_first(None, coming, seconds, 100.0, margin, 16) is None
    # Once: right after such a conversion the rewrite goes, whatever has landed meanwhile.
    assert scheduler.convert_first(step, coming, seconds, 100.0, margin, 16, converted_ahead=True) == step


def test_coming_conversions_go_ahead_of_a_maintenance_run_as_long_as_its_last():
    coming = [dataclasses.replace(job_candidate("a", 10, hot=True, work=Work.CONVERT), due_by=112.0, reason="r")]
    merge = scheduler.Maintain("db.t", MaintenanceKind.MANIFESTS)
    never_timed = scheduler.holding_seconds(merge, scheduler.RewritePace(), {})
    assert never_timed == scheduler.UNTIMED_MAINTENANCE_SECONDS
    converted = scheduler.convert_first(merge, coming, never_timed, 100.0, 5.0)
    assert (
        isinstance(converted, scheduler.Compact)
        and "ahead of a rewrite-manifests expected to take 60.0s" in converted.candidates[0].reason
    )
    # Only conversions coming due within it: a target of days converts nothing early.
    far = [dataclasses.replace(coming[0], due_by=100.0 + 86_400)]
    assert scheduler.convert_first(merge, far, never_timed, 100.0, 43_200.0) == merge
    quick = scheduler.holding_seconds(merge, scheduler.RewritePace(), {("db.t", MaintenanceKind.MANIFESTS): 0.2})
    assert scheduler.convert_first(merge, coming, quick, 100.0, 5.0) == merge


def test_orphan_removal_holds_neither_the_loop_nor_the_compactions():
    """It commits nothing and spares every file younger than an hour: it runs beside the loop,
    so no conversion goes ahead of it, and its started event pauses no compaction."""
    orphans = scheduler.Maintain("db.t", MaintenanceKind.ORPHANS)
    assert scheduler.holding_seconds(orphans, scheduler.RewritePace(), {("db.t", MaintenanceKind.ORPHANS): 20.0}) == 0.0
    assert not MaintenanceKind.ORPHANS.commits and MaintenanceKind.EXPIRE.commits and MaintenanceKind.MANIFESTS.commits
    activity = TableActivity(max_seconds=600)
    started = MaintenanceEvent("db.t", MaintenanceKind.ORPHANS, MaintenanceOutcome.STARTED, "r1", 1_000, 1_000)
    activity.on_maintenance(started)
    assert not activity.maintenance_running("db.t", 2.0)
    activity.on_maintenance(dataclasses.replace(started, kind=MaintenanceKind.EXPIRE))
    assert activity.maintenance_running("db.t", 2.0)


def test_the_rewrite_pace_is_what_this_replicas_jobs_measured():
    pace = scheduler.RewritePace()
    assert pace.bytes_per_second == scheduler.DEFAULT_REWRITE_BYTES_PER_SECOND and not pace.measured
    pace.observe(96 * MB, 1, 5.0)  # the first measurement replaces the assumption
    assert pace.bytes_per_second == pytest.approx(20 * MB)
    pace.observe(36 * MB, 1, 5.0)  # 8 MB/s: a weighted mean moves toward it
    assert pace.bytes_per_second == pytest.approx(20 * MB + scheduler.PACE_WEIGHT * (8 * MB - 20 * MB))
    pace.observe(MB, 1, 0.0)  # no time measured: nothing learned
    assert pace.seconds_for([dataclasses.replace(CANDIDATE, cost=pace.bytes_per_second * 2)]) == pytest.approx(2.0)


def job_candidate(path: str, data_bytes: int, table: str = "db.t", work: Work = Work.DELETE_MERGE, hot: bool = False):
    return Candidate(table, path, work, "", 1.0, 1.0, hot, data_bytes)


def test_small_settled_partitions_of_a_table_share_a_job_up_to_its_limits():
    best, other_table, hot, big = (
        job_candidate("a", 10),
        job_candidate("b", 10, "db.u"),
        job_candidate("c", 10, hot=True),
        job_candidate("d", 95),
    )
    fits = [job_candidate(p, 20, work=Work.MINOR) for p in "efgh"]
    ranked = [best, other_table, hot, big, *fits]
    assert scheduler.job_partitions(ranked, 16, 100) == (best, *fits)  # 10 + 4 x 20 fit in 100
    assert scheduler.job_partitions(ranked, 3, 100) == (best, *fits[:2])
    assert scheduler.job_partitions(ranked, 16, 60) == (best, *fits[:2])  # the third would not fit
    assert scheduler.job_partitions(ranked, 1, 100) == (best,)
    assert scheduler.next_step([], ranked, 16, 100) == scheduler.Compact((best, *fits))


def test_the_portability_targets_conversions_due_together_share_one_job_whatever_their_bytes():
    due = [
        dataclasses.replace(job_candidate(p, 10**9, hot=p != "c", work=Work.CONVERT), due_by=100.0 + i)
        for i, p in enumerate("abcd")
    ]
    for_budget = job_candidate("e", 10, hot=True, work=Work.CONVERT)  # the read budget's: planned on its own
    other_table = dataclasses.replace(job_candidate("f", 10, "db.u", work=Work.CONVERT), due_by=100.0)
    settled = job_candidate("g", 10)
    ranked = [*due[:2], other_table, *due[2:], for_budget, settled]
    assert scheduler.job_partitions(ranked, 16, 100) == tuple(due)
    assert scheduler.job_partitions(ranked, 3, 100) == tuple(due[:3])
    assert scheduler.job_partitions([settled, *due], 16, 100) == (settled,)  # a settled job takes no conversion along


@pytest.mark.parametrize(
    "best",
    [job_candidate("a", 10, hot=True), job_candidate("a", 10, work=Work.CONVERT), job_candidate("a", 101)],
    ids=["hot", "conversion", "larger than a job"],
)
def test_a_hot_partition_a_conversion_or_a_large_partition_gets_a_job_of_its_own(best):
    assert scheduler.job_partitions([best, job_candidate("b", 10), job_candidate("c", 10)], 16, 100) == (best,)


def test_only_owned_candidates_on_tables_without_running_maintenance():
    other = Candidate("db.u", "p=us", Work.MINOR, "", 1.0, 1.0)
    owned = scheduler.owned_candidates([CANDIDATE, other], lambda table, path: path != "p=us", lambda table: False)
    assert owned == [CANDIDATE]
    assert scheduler.owned_candidates([CANDIDATE], lambda t, p: True, lambda table: table == "db.t") == []


def test_idle_needs_the_group_silence_and_nothing_due_or_waiting():
    quiet = {"joined": True, "quiet_seconds": 10.0, "until_idle": 5.0, "has_candidates": False, "waiting": False}
    assert scheduler.idle(**quiet)
    for key, value in (("joined", False), ("quiet_seconds", 1.0), ("has_candidates", True), ("waiting", True)):
        assert not scheduler.idle(**{**quiet, key: value}), key


# ---- the event feed ----


@dataclass
class Message:
    topic_name: str
    payload: bytes

    def error(self):
        return None

    def topic(self) -> str:
        return self.topic_name

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 0

    def value(self) -> bytes:
        return self.payload


class FakeConsumer:
    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        out, self.messages = self.messages, []
        return out

    def close(self) -> None:
        pass


def test_the_feed_applies_commits_of_known_tables_and_counts_bad_ones():
    topics = EventTopics("commits", "compactions", "maintenance")
    commit = CommitEvent(
        "db.t",
        1,
        None,
        1,
        5_000,
        "overwrite",
        "w",
        None,
        {},
        [PartitionDelta({"p": "eu"}, "p=eu", 0, data_files=1, data_bytes=10, data_records=1)],
    )
    other = CommitEvent("db.other", 2, None, 1, 5_000, "overwrite", "w", None, {}, [])
    tracker = PartitionTracker(SETTINGS)
    activity = TableActivity(max_seconds=60)
    started = CompactionEvent.from_result(
        table="db.t",
        partition={"p": "eu"},
        partition_path="p=eu",
        kind=Work.MINOR,
        outcome=Outcome.STARTED,
        replica="r2",
        reason=None,
        attempt=1,
        started=6.0,
        finished=6.0,
        counts=None,
    )
    feed = EventFeed(
        FakeConsumer(
            [
                Message("commits", commit.to_json()),
                Message("commits", other.to_json()),
                Message("commits", b"{broken"),
                Message("compactions", started.to_json()),
                Message("commits", orjson.dumps({"version": 1})),
            ]
        ),
        topics,
        ["db.t"],
        tracker,
        activity,
        clock=Clock(),
    )
    assert feed.poll(0.0) == 1
    assert tracker.get("db.t", "p=eu") is not None and feed.writer("db.t").last_write == 5.0
    assert feed.bad_commit_events == 2 and feed.commit_events == 1
    assert [r.replica for r in activity.running_compactions("db.t", 10.0)] == ["r2"]


def test_a_commit_event_too_large_for_kafka_lists_no_partitions_and_sends_the_compactor_to_the_metadata():
    deltas = [
        PartitionDelta({"p": f"p{i:05d}"}, f"p=p{i:05d}", 0, data_files=1, data_bytes=10, data_records=1) for i in range(10_000)
    ]
    commit = CommitEvent("db.t", 1, None, 1, 5_000, "overwrite", "w", None, {}, deltas)
    small = CommitEvent("db.t", 2, 1, 2, 6_000, "overwrite", "w", None, {}, deltas[:10])

    encoded = commit.to_json()
    assert len(orjson.dumps([d.__dict__ for d in deltas])) > 1_000_000  # would not fit a 1 MB Kafka message
    assert len(encoded) <= 512 * 1024
    elided = CommitEvent.from_json(encoded)
    assert elided.partitions == [] and elided.partitions_omitted == 10_000
    assert CommitEvent.from_json(small.to_json()) == small  # a usual event lists every partition

    tracker = PartitionTracker(SETTINGS)
    tracker.on_commit(small)
    assert tracker.take_unlisted() == set()
    tracker.on_commit(elided)
    assert tracker.take_unlisted() == {"db.t"} and tracker.take_unlisted() == set()
    tracker.on_commit(elided)
    tracker.on_metadata("db.t", 1, {})  # a read that saw the commit answers it
    assert tracker.take_unlisted() == set()
    tracker.on_commit(elided)  # replayed after the read: already counted
    assert tracker.take_unlisted() == set()
