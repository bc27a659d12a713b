"""The coordinator's decisions without Kafka, Spark or a catalog: slot ownership, the writer's
quiet windows, the commit gate's retry and give-up rules, in-flight activity and what
maintenance must spare."""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace

import pytest

from icecdc.coordinator.activity import TableActivity
from icecdc.coordinator.commits import CommitGate
from icecdc.coordinator.errors import CommitGaveUp, LeaseLost, WriterWroteThere
from icecdc.coordinator.maintenance import (
    EXPIRE,
    MANIFESTS,
    ORPHANS,
    MaintenanceSchedule,
    TableMaintenance,
    anything_to_expire,
    expiry_cutoff,
    is_small_manifest,
    manifest_target_size,
    manifests_to_merge,
)
from icecdc.coordinator.ownership import Ownership, slot_of
from icecdc.coordinator.quiet import quiet_delay
from icecdc.domain import summary
from icecdc.domain.cadence import WriteCadence
from icecdc.domain.errors import CommitConflict, CompareAndSetLost
from icecdc.domain.events import CompactionEvent, CompactionOutcome, MaintenanceEvent, MaintenanceOutcome
from icecdc.domain.tableref import TableRef
from icecdc.jvm import actions
from icecdc.jvm.actions import ManifestFacts
from icecdc.jvm.tables import CommittedSnapshot
from icecdc.runtime.config import CoordinatorConfig, MaintenanceConfig

# ---- ownership ----


def test_slots_are_stable_across_processes_and_releases():
    # CRC-32, not Python's salted hash: every replica and every release must agree.
    assert slot_of("lake.db.orders", "day=2025-01-01", 32) == 6


def test_partitions_spread_over_slots_and_replicas():
    slots = 32
    counts = Counter(slot_of("lake.db.orders", f"day=2025-{m:02d}-{d:02d}", slots) for m in range(1, 13) for d in range(1, 29))
    assert len(counts) == slots  # 336 partitions touch every slot
    assert max(counts.values()) < 3 * min(counts.values())
    # Round-robin gives two replicas 16 slots each: each owns roughly half the partitions.
    a, b = Ownership(slots), Ownership(slots)
    a.assign(set(range(0, slots, 2)))
    b.assign(set(range(1, slots, 2)))
    paths = [f"day=2025-01-{d:02d}" for d in range(1, 29)]
    owned_a = [p for p in paths if a.owns("t", p)]
    owned_b = [p for p in paths if b.owns("t", p)]
    assert sorted(owned_a + owned_b) == paths and not set(owned_a) & set(owned_b)
    assert owned_a and owned_b
    assert a.owns_maintenance("t") != b.owns_maintenance("t")


def test_ownership_generation_moves_on_every_assignment():
    ownership = Ownership(4)
    ownership.assign({0, 1})
    first = ownership.generation
    ownership.revoke()
    assert ownership.generation == first + 1 and not ownership.held
    assert not any(ownership.owns("t", f"p={i}") for i in range(20))


# ---- quiet windows ----


def writer(*times: float) -> WriteCadence:
    cadence = WriteCadence()
    for t in times:
        cadence.record(t)
    return cadence


def test_unknown_or_stopped_writer_is_quiet():
    assert quiet_delay(WriteCadence(), 100.0, 0.5) == 0
    assert quiet_delay(writer(10, 12), 13.0, 0.5) == 0  # two commits: no cadence yet
    assert quiet_delay(writer(0, 2, 4, 6), 6 + 4 * 2 + 0.1, 0.5) == 0  # silent for 4 gaps


def test_commit_waits_for_the_writer_when_its_next_commit_is_close():
    cadence = writer(0, 2, 4, 6)  # a commit every 2 s, the last at 6
    assert quiet_delay(cadence, 6.1, 0.5) == 0  # just after its commit
    assert quiet_delay(cadence, 6.8, 0.5) == 0  # 0.8 + 0.5 + 0.5 guard <= 2
    wait = quiet_delay(cadence, 7.5, 0.5)  # 1.5 + 0.5 + 0.5 > 2: too close to 8
    assert 0.5 <= wait <= 0.5 + 0.25 + 1e-9
    assert 0 < quiet_delay(cadence, 8.3, 0.5) <= 0.25  # the writer is late: look again shortly
    # Half a gap late: a slow batch or a writer that has stopped; no moment is quieter than now.
    assert quiet_delay(cadence, 9.0, 0.5) == 0


def test_a_commit_too_slow_for_any_window_goes_right_after_the_writer():
    cadence = writer(0, 2, 4, 6)
    assert quiet_delay(cadence, 6.1, 3.0) == 0
    assert quiet_delay(cadence, 6.5, 3.0) > 0


# ---- the commit gate ----


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


SNAPSHOT = CommittedSnapshot(1, 0, 1, 0, "replace")


def gate(clock: Clock, cadence: WriteCadence | None = None, **settings: object) -> tuple[CommitGate, list[float]]:
    polls: list[float] = []

    def poll(seconds: float) -> None:
        polls.append(seconds)
        clock.sleep(seconds)

    config = CoordinatorConfig(**{"commit_backoff_seconds": 0.1, "commit_backoff_max_seconds": 1.0, **settings})
    return CommitGate(config, lambda _table: cadence or WriteCadence(), poll, clock=clock, sleep=clock.sleep), polls


def test_gate_retries_a_lost_compare_and_set_then_commits():
    clock = Clock()
    commit_gate, _ = gate(clock)
    outcomes = [CompareAndSetLost("lost"), CompareAndSetLost("lost"), None]
    checks = []

    def attempt(checked_through: int | None = None) -> CommittedSnapshot:
        error = outcomes.pop(0)
        if error:
            raise error
        return CommittedSnapshot(1, 0, 1, 0, "replace", interleaved=1)

    assert commit_gate.commit("t", attempt, before_attempt=lambda: checks.append(clock.now)).snapshot_id == 1
    assert len(checks) == 3  # the lease is checked before every attempt
    stats = commit_gate.stats
    # two failed attempts, then one that Iceberg itself retried once (one commit landed meanwhile)
    assert (stats.attempts, stats.conflicts, stats.retries, stats.gave_up) == (4, 3, 2, 0)


def test_gate_gives_up_rather_than_keep_racing_the_writer():
    clock = Clock()
    commit_gate, _ = gate(clock, commit_attempts=3)
    calls = []

    def attempt(checked_through: int | None = None) -> CommittedSnapshot:
        calls.append(clock.now)
        raise CompareAndSetLost("lost")

    with pytest.raises(CommitGaveUp):
        commit_gate.commit("t", attempt)
    assert len(calls) == 3 and commit_gate.stats.gave_up == 1
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(0 <= g <= 1.0 for g in gaps)  # jittered exponential backoff, capped


@pytest.mark.parametrize("error", [CommitConflict("stale"), LeaseLost("moved"), RuntimeError("disk full")])
def test_gate_never_retries_a_stale_plan_or_a_lost_lease(error):
    clock = Clock()
    commit_gate, _ = gate(clock)
    calls = []

    def attempt(checked_through: int | None = None) -> CommittedSnapshot:
        calls.append(1)
        raise error

    def lease() -> None:
        if isinstance(error, LeaseLost):
            raise error

    with pytest.raises(type(error)):
        commit_gate.commit("t", attempt, before_attempt=lease)
    assert len(calls) == (0 if isinstance(error, LeaseLost) else 1)
    assert commit_gate.stats.retries == 0


def test_gate_counts_a_writer_that_wrote_the_partitions_again_as_its_own_conflict():
    clock = Clock()
    commit_gate, _ = gate(clock)
    calls = []

    def guard() -> None:
        raise WriterWroteThere("the writer committed to region=eu")

    with pytest.raises(WriterWroteThere):
        commit_gate.commit("t", lambda checked_through=None: calls.append(1) or SNAPSHOT, before_attempt=guard)
    assert calls == []  # nothing committed, and not tried again at once
    assert (commit_gate.stats.attempts, commit_gate.stats.conflicts, commit_gate.stats.retries) == (1, 1, 0)


def test_gate_hands_each_attempt_the_snapshot_its_check_went_through():
    clock = Clock()
    commit_gate, _ = gate(clock)
    checked = iter([41, 42])
    outcomes = [CompareAndSetLost("lost"), None]
    got = []

    def attempt(checked_through: int | None = None) -> CommittedSnapshot:
        got.append(checked_through)
        error = outcomes.pop(0)
        if error:
            raise error
        return SNAPSHOT

    commit_gate.commit("t", attempt, before_attempt=lambda: next(checked))
    assert got == [41, 42]  # checked again before the second attempt, and validated from there


def test_gate_waits_for_the_quiet_window_and_no_longer_than_allowed():
    clock = Clock()
    cadence = writer(990, 992, 994, 996, 998)  # due again at 1000 = now
    clock.now = 999.6
    commit_gate, polls = gate(clock, cadence)
    assert commit_gate.commit("t", lambda checked_through=None: SNAPSHOT) == SNAPSHOT
    assert polls and commit_gate.stats.quiet_wait_seconds[0] > 0

    # A writer that stops being predictable delays a commit by max_quiet_wait_seconds at most.
    late = Clock()
    late.now = 999.6
    commit_gate, polls = gate(late, writer(990, 992, 994, 996, 998), max_quiet_wait_seconds=0.3)
    commit_gate.commit("t", lambda checked_through=None: SNAPSHOT)
    assert commit_gate.stats.quiet_wait_seconds[0] == pytest.approx(0.3, abs=0.01)

    off = Clock()
    off.now = 999.6
    commit_gate, polls = gate(off, writer(990, 992, 994, 996, 998), quiet_windows=False)
    commit_gate.commit("t", lambda checked_through=None: SNAPSHOT)
    assert not polls


def test_gate_does_not_wait_for_a_window_it_could_not_commit_in_before_the_deadline():
    # The writer is due again at 1000; the window opens just after it. A conversion that must have
    # committed by 1000.5 (the portability target) commits now instead of after the writer.
    for commit_by, waits in ((1000.5, False), (1005.0, True), (None, True)):
        clock = Clock()
        clock.now = 999.6
        commit_gate, _ = gate(clock, writer(990, 992, 994, 996, 998))
        commit_gate.commit("t", lambda checked_through=None: SNAPSHOT, commit_by=commit_by)
        assert (commit_gate.stats.quiet_wait_seconds[0] > 0) is waits


def test_gate_catches_up_on_events_before_judging_the_window():
    # After a long compaction the last commit it has seen is old: the writer looks stopped. The
    # commit that is waiting in the consumer says it is not, and due again in 0.4 s.
    clock = Clock()
    cadence = writer(980, 982, 984)
    pending = [998.4]

    def poll(seconds: float) -> None:
        if pending:
            cadence.record(pending.pop())
        clock.sleep(seconds)

    commit_gate = CommitGate(CoordinatorConfig(), lambda _table: cadence, poll, clock=clock, sleep=clock.sleep)
    commit_gate.commit("t", lambda checked_through=None: SNAPSHOT)
    assert commit_gate.stats.quiet_wait_seconds[0] > 0.3


# ---- activity across replicas ----


def compaction(
    outcome: str, replica: str = "a", path: str = "p=1", started_ms: int = 1_000_000, snapshot: int = 7
) -> CompactionEvent:
    return CompactionEvent(
        table="t",
        partition={"p": 1},
        partition_path=path,
        kind="minor",
        outcome=CompactionOutcome(outcome),
        replica=replica,
        starting_snapshot_id=snapshot,
        started_ms=started_ms,
        finished_ms=started_ms,
    )


def test_activity_tracks_running_compactions_until_they_end_or_time_out():
    activity = TableActivity(max_seconds=60)
    activity.on_compaction(compaction("started", "a", "p=1", snapshot=7))
    activity.on_compaction(compaction("started", "b", "p=2", snapshot=8))
    assert sorted(r.starting_snapshot_id for r in activity.running_compactions("t", 1010)) == [7, 8]
    activity.on_compaction(compaction("committed", "a", "p=1"))
    assert [r.replica for r in activity.running_compactions("t", 1010)] == ["b"]
    assert activity.running_compactions("t", 1000 + 61) == []  # b died: forgotten after the longest run
    assert activity.running_compactions("other", 1010) == []


def test_activity_tracks_maintenance():
    activity = TableActivity(max_seconds=60)
    event = MaintenanceEvent(
        table="t", kind=EXPIRE, outcome=MaintenanceOutcome.STARTED, replica="a", started_ms=1_000_000, finished_ms=1_000_000
    )
    activity.on_maintenance(event)
    assert activity.maintenance_running("t", 1001)
    activity.on_maintenance(
        MaintenanceEvent(table="t", kind=EXPIRE, outcome=MaintenanceOutcome.COMMITTED, replica="b", started_ms=0, finished_ms=0)
    )
    assert activity.maintenance_running("t", 1001)  # another replica's end does not end a's run
    activity.on_maintenance(
        MaintenanceEvent(table="t", kind=EXPIRE, outcome=MaintenanceOutcome.COMMITTED, replica="a", started_ms=0, finished_ms=0)
    )
    assert not activity.maintenance_running("t", 1001)


def test_a_rebalance_ends_every_run_that_started_before_this_replica_joined_it():
    activity = TableActivity(max_seconds=1800)
    activity.on_compaction(compaction("started", "dead", "p=1", started_ms=1_000_000))
    activity.on_maintenance(
        MaintenanceEvent(
            table="t",
            kind=EXPIRE,
            outcome=MaintenanceOutcome.STARTED,
            replica="dead",
            started_ms=1_000_000,
            finished_ms=1_000_000,
        )
    )
    assert activity.running_compactions("t", 1020) and activity.maintenance_running("t", 1020)
    activity.over_before = 1015.0  # given slots by a rebalance it asked to join at 1015
    assert activity.running_compactions("t", 1020) == [] and not activity.maintenance_running("t", 1020)
    activity.on_compaction(compaction("started", "live", "p=2", started_ms=1_016_000, snapshot=9))
    assert [r.starting_snapshot_id for r in activity.running_compactions("t", 1020)] == [9]


# ---- maintenance ----


def test_expiry_is_worth_running_only_past_the_retention_and_the_kept_snapshots():
    assert not anything_to_expire([], 100, retain_last=1)
    assert not anything_to_expire([50, 60], 100, retain_last=2)  # old, but all kept
    assert not anything_to_expire([150, 160, 170], 100, retain_last=1)  # none older than the cutoff
    assert anything_to_expire([50, 160], 100, retain_last=1)


def test_expiry_cutoff_spares_protected_snapshots():
    now = 10_000_000
    assert expiry_cutoff(now, 3600, []) == now - 3_600_000
    # a running compaction started from a snapshot 2 h old, the ingester's offsets 30 min old
    assert expiry_cutoff(now, 3600, [now - 7_200_000, now - 1_800_000]) == now - 7_200_000
    assert expiry_cutoff(now, 0, [now - 5]) == now - 5


def test_maintenance_schedule():
    settings = MaintenanceConfig(interval_seconds=60, manifest_interval_seconds=20, orphan_interval_seconds=3600)
    schedule = MaintenanceSchedule(settings, started=0)
    assert schedule.due("t", 0) == [EXPIRE, MANIFESTS]  # orphans: not on every (re)start
    for kind in (EXPIRE, MANIFESTS):
        schedule.done("t", kind, 0)
    assert schedule.due("t", 19) == []
    assert schedule.due("t", 20) == [MANIFESTS]  # a manifest check is a manifest-list read
    schedule.done("t", MANIFESTS, 45)
    assert schedule.due("t", 60) == [EXPIRE, ORPHANS]  # the manifest check ran at 45
    for kind in (EXPIRE, MANIFESTS, ORPHANS):
        schedule.done("t", kind, 60)
    assert schedule.due("t", 120) == [EXPIRE, MANIFESTS]
    assert schedule.due("t", 3660) == [EXPIRE, MANIFESTS, ORPHANS]
    for kind in (EXPIRE, MANIFESTS, ORPHANS):
        schedule.done("t", kind, 3660)
        schedule.due_again("t", kind)  # it lost its lease before doing anything
    assert schedule.due("t", 3661) == [EXPIRE, MANIFESTS, ORPHANS]
    assert MaintenanceSchedule(MaintenanceConfig(enabled=False)).due("t", 0) == []


def test_small_manifests_are_under_half_the_target_size():
    assert manifest_target_size({}) == 8 * 1024 * 1024  # Iceberg's default
    assert manifest_target_size({"commit.manifest.target-size-bytes": "1000"}) == 1000
    assert is_small_manifest(499, 1000) and not is_small_manifest(500, 1000)


def test_past_the_bound_data_manifests_are_merged_and_delete_manifests_only_when_they_alone_are_past_it():
    def small(data: int, deletes: int) -> list[ManifestFacts]:
        return [ManifestFacts(f"d{n}", 10) for n in range(data)] + [ManifestFacts(f"x{n}", 10, True) for n in range(deletes)]

    assert manifests_to_merge(small(4, 4), 8) == (set(), set())  # within the bound
    assert manifests_to_merge(small(5, 4), 8) == ({f"d{n}" for n in range(5)}, set())
    assert manifests_to_merge(small(1, 9), 8) == (set(), {f"x{n}" for n in range(9)})
    # One data manifest merges with nothing, and 8 delete manifests are the writer's to merge.
    assert manifests_to_merge(small(1, 8), 8) == (set(), set())


def test_orphan_age_below_an_hour_is_refused():
    with pytest.raises(ValueError, match="orphan_age_seconds"):
        MaintenanceConfig(orphan_age_seconds=60)


def test_maintenance_event_round_trip():
    event = MaintenanceEvent(
        table="t",
        kind=ORPHANS,
        outcome=MaintenanceOutcome.COMMITTED,
        replica="a",
        started_ms=1,
        finished_ms=2,
        cutoff_ms=0,
        protected_snapshot_ids=[1, 2],
        files_deleted=3,
    )
    assert MaintenanceEvent.from_json(event.to_json()) == event


def test_expiry_spares_a_staged_tables_snapshots_from_main_to_the_branchs_head(monkeypatch):
    """Main lags its staging branch; expiring the branch's snapshots after main would cut the
    history main moves forward along (``decide_main`` would find main off the branch)."""

    class StagedTable:
        ref = TableRef("lake", ("db",), "t", "icecdc-staged")

        def refresh(self) -> None: ...

        def snapshot_times_ms(self) -> dict[int, int]:
            return {1: 1_000, 2: 2_000, 3: 3_000, 4: 4_000}  # main at 2, the branch's head at 4

        def newest_recovery_snapshots(self) -> dict:
            return {"icecdc": SimpleNamespace(snapshot_id=4, timestamp_ms=4_000)}

        def main_snapshot_id(self) -> int:
            return 2

    cutoffs: list[int] = []
    monkeypatch.setattr(actions, "expire_snapshots", lambda table, cutoff, retain_last: cutoffs.append(cutoff) or 0)
    settings = MaintenanceConfig(snapshot_retention_seconds=0, retain_last=1)
    result = TableMaintenance(StagedTable(), {}).expire(10_000, settings, [])
    assert result.cutoff_ms == 2_000 and 2 in result.protected_snapshot_ids
    assert cutoffs == [2_000]  # only snapshot 1, before main, may go


def test_expiry_keeps_every_writers_newest_exactly_once_marker_and_what_follows(monkeypatch):
    """The ingester's offsets, a Flink job's checkpoint id and a Kafka Connect sink's offsets: the
    cutoff moves back to the oldest of their newest snapshots."""

    class KeptTable:
        ref = TableRef("lake", ("db",), "t")

        def refresh(self) -> None: ...

        def snapshot_times_ms(self) -> dict[int, int]:
            return {1: 1_000, 2: 2_000, 3: 3_000, 4: 4_000}

        def newest_recovery_snapshots(self) -> dict:
            return {
                "flink": SimpleNamespace(snapshot_id=2, timestamp_ms=2_000),
                "kafka-connect": SimpleNamespace(snapshot_id=3, timestamp_ms=3_000),
            }

    cutoffs: list[int] = []
    monkeypatch.setattr(actions, "expire_snapshots", lambda table, cutoff, retain_last: cutoffs.append(cutoff) or 0)
    result = TableMaintenance(KeptTable(), {}).expire(10_000, MaintenanceConfig(snapshot_retention_seconds=0, retain_last=1), [])
    assert cutoffs == [2_000] and set(result.protected_snapshot_ids) == {2, 3}


def test_recovery_markers_name_their_writer():
    assert summary.recovery_marker(summary.OFFSETS) == "icecdc"
    assert summary.recovery_marker(summary.FLINK_CHECKPOINT) == "flink"
    assert summary.recovery_marker("kafka.connect.offsets.control-iceberg.cg") == "kafka-connect"
    assert summary.recovery_marker("flink.job-id") is None and summary.recovery_marker("kafka.connect.commit-id") is None
