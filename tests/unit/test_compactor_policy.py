"""The compactor's decisions, without Spark, Kafka or a catalog: settle detection, the hot
ceiling, benefit/cost ordering, file-level planning and its fixed point."""

from __future__ import annotations

import dataclasses
import random

import hypothesis.strategies as st
import pytest
from hypothesis import given

from icecdc.compactor import outcomes, status
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import DataFileFacts, PartitionFiles, applying_deletes, plan_rewrite
from icecdc.compactor.policy import (
    FIXED_COST_BYTES,
    PartitionStats,
    Work,
    benefit_and_cost,
    hot_work,
    ideal_read_cost,
    last_pack,
    medium_files_pack,
    needed_work,
    read_budget,
    read_cost,
)
from icecdc.compactor.row_merge import bins
from icecdc.compactor.settle import Phase, phase, settle_window
from icecdc.compactor.tracker import PartitionMetadata, PartitionTracker
from icecdc.domain.cadence import WriteCadence
from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.runtime.config import CompactorConfig, SettleConfig

EQUALITY, POSITION = DataFileContent.EQUALITY_DELETES, DataFileContent.POSITION_DELETES

KB, MB = 1024, 1024 * 1024
SETTINGS = CompactorConfig(target_file_size_bytes=128 * MB, min_small_files=4)
SETTLE = SettleConfig(cadence_multiple=3, min_seconds=10, max_seconds=600, initial_seconds=60)


def cadence(*times: float) -> WriteCadence:
    c = WriteCadence()
    for t in times:
        c.record(t)
    return c


# ---- settle detection ----


def test_window_adapts_to_each_partitions_cadence():
    fast = cadence(*range(0, 50, 5))  # every 5 s
    slow = cadence(*range(0, 6000, 600))  # every 10 min
    assert settle_window(fast, SETTLE) == 15
    assert settle_window(slow, SETTLE) == 600  # 1800 clamped to max_seconds
    assert phase(fast, 45 + 16, SETTLE) is Phase.SETTLED
    assert phase(slow, 5400 + 16, SETTLE) is Phase.HOT


def test_window_is_clamped_and_starts_at_the_initial_value():
    assert settle_window(cadence(0, 1, 2), SETTLE) == 10  # 3 s clamped up to min_seconds
    assert settle_window(cadence(100), SETTLE) == 60
    assert phase(WriteCadence(), 1e9, SETTLE) is Phase.SETTLED  # never written: nothing writes it


def test_hot_then_settling_then_settled():
    c = cadence(*range(0, 100, 10))  # gap 10 s, window 30 s, last write at 90
    assert phase(c, 95, SETTLE) is Phase.HOT
    assert phase(c, 90 + 16, SETTLE) is Phase.SETTLING  # more than 1.5 gaps late
    assert phase(c, 90 + 30, SETTLE) is Phase.SETTLED


def test_one_long_pause_does_not_stretch_a_busy_partitions_window():
    c = cadence(0, 5, 10, 15, 20, 3600, 3605, 3610)
    assert settle_window(c, SETTLE) == 15


def test_out_of_order_and_repeated_writes_are_kept_sorted_once():
    c = cadence(10, 30, 20, 30)
    assert list(c.times) == [10, 20, 30]
    assert c.last_write == 30


# ---- what a partition needs ----


def test_equality_deletes_need_a_delete_merge():
    assert needed_work(PartitionStats(data_files=1, equality_delete_files=1), SETTINGS)[0] is Work.DELETE_MERGE


def test_small_files_need_a_minor_compaction_from_the_minimum_count():
    assert needed_work(PartitionStats(data_files=3, small_files=3), SETTINGS) is None
    assert needed_work(PartitionStats(data_files=4, small_files=4), SETTINGS)[0] is Work.MINOR


def test_medium_files_that_make_fewer_target_files_need_a_pack():
    # A bulk load's 18 MB files, 1 GB of them: packed once the partition settles, deletes or not.
    load = PartitionStats(data_files=55, data_bytes=990 * MB, medium_files=55, medium_bytes=990 * MB)
    work, reason = needed_work(load, SETTINGS)
    assert work is Work.MINOR and reason == "55 medium files (990 MiB) to pack"
    benefit, cost = benefit_and_cost(load, Work.MINOR, SETTINGS)
    assert benefit == 55 - 8 and cost == 990 * MB + 4 * MB
    # Not enough for one target file; two that do not fit together; one alone.
    assert needed_work(PartitionStats(data_files=3, medium_files=3, medium_bytes=90 * MB), SETTINGS) is None
    assert needed_work(PartitionStats(data_files=2, medium_files=2, medium_bytes=180 * MB), SETTINGS) is None
    assert not medium_files_pack(1, 200 * MB, SETTINGS)


def test_a_minor_compaction_of_small_files_names_the_medium_files_it_packs_along():
    both = PartitionStats(data_files=9, small_files=4, small_bytes=4 * MB, medium_files=5, medium_bytes=200 * MB)
    assert needed_work(both, SETTINGS) == (Work.MINOR, "4 small files and 5 medium files (200 MiB) to pack")
    benefit, cost = benefit_and_cost(both, Work.MINOR, SETTINGS)
    assert cost == 204 * MB + FIXED_COST_BYTES and benefit == 9 - 2  # all 204 MB packed into two files


def test_a_pack_takes_the_medium_files_with_the_small_ones_and_a_delete_merge_takes_them_too():
    files = PartitionFiles(
        data=(
            data("small", 1, 3, pos=("pos",)),
            *(data(f"m{i}", 40, 1) for i in range(4)),
            data("large", 120, 1),
        ),
        deletes=(LiveDeleteFile("pos", POSITION, 5, 10),),
    )
    assert set(plan_rewrite(files, Work.MINOR, SETTINGS).rewrite) == {"small", "m0", "m1", "m2", "m3"}
    assert set(plan_rewrite(files, Work.DELETE_MERGE, SETTINGS).rewrite) == {"small", "m0", "m1", "m2", "m3"}
    unpackable = PartitionFiles(data=(data("m0", 90, 1), data("m1", 80, 1)), deletes=())
    assert plan_rewrite(unpackable, Work.MINOR, SETTINGS).empty


@given(st.lists(st.integers(SETTINGS.small_file_bytes, SETTINGS.large_file_bytes - 1), min_size=2, max_size=60))
def test_packs_of_medium_files_make_fewer_files_each_time_and_end(sizes):
    # Each pack's outputs (a run's bytes, at most the target) are packed again while the rule
    # asks: every round makes fewer files, so the rounds end.
    medium, large = list(sizes), 0
    for _ in range(len(sizes)):
        if not medium_files_pack(len(medium), sum(medium), SETTINGS):
            return
        runs = bins([(str(i), size) for i, size in enumerate(medium)], SETTINGS.target_file_size_bytes)
        assert len(runs) < len(medium)
        packed = [sum(medium[int(p)] for p in run) for run in runs]
        medium = [size for size in packed if size < SETTINGS.large_file_bytes]
        large += len(packed) - len(medium)
    raise AssertionError(f"packs did not end: {medium}, {large} large")


def test_position_deletes_on_few_rows_are_healthy():
    stats = PartitionStats(data_files=1, records=1000, position_delete_files=1, position_delete_records=10)
    assert needed_work(stats, SETTINGS) is None
    heavy = PartitionStats(data_files=1, records=1000, position_delete_files=1, position_delete_records=200)
    assert needed_work(heavy, SETTINGS)[0] is Work.DELETE_MERGE


def test_a_settled_partition_with_position_deletes_on_small_files_is_merged():
    # What hot-partition conversions leave: small files, each with a position-delete file.
    converted = PartitionStats(data_files=3, data_bytes=3 * MB, records=3000, small_files=3, small_bytes=3 * MB)
    converted = dataclasses.replace(converted, position_delete_files=2, position_delete_records=20)
    assert needed_work(converted, SETTINGS)[0] is Work.DELETE_MERGE
    on_large = PartitionStats(
        data_files=2, data_bytes=256 * MB, records=2000, position_delete_files=2, position_delete_records=20
    )
    assert needed_work(on_large, SETTINGS) is None


def test_read_cost_weighs_equality_deletes_over_data_and_position_deletes():
    assert read_cost(PartitionStats(data_files=10, equality_delete_files=5)) == 10 + 3 * 5
    assert read_cost(PartitionStats(data_files=10, position_delete_files=5)) == 15
    assert read_cost(PartitionStats(data_files=1)) == 1


def test_read_cost_counts_bytes_as_opens_so_a_small_file_costs_little_beside_a_large_one():
    base = PartitionStats(data_files=1, data_bytes=40 * MB)
    assert read_cost(base) == 1 + 10  # 40 MB read, at Iceberg's 4 MB a file open
    with_batch = dataclasses.replace(base, data_files=2, data_bytes=40 * MB + 20 * 1024)
    assert read_cost(with_batch) / read_cost(base) < 1.1
    assert ideal_read_cost(with_batch, SETTINGS) == pytest.approx(11, abs=0.01)


def test_a_hot_partition_is_worked_on_only_past_its_read_budget():
    small = PartitionStats(data_files=2, data_bytes=2 * KB, small_files=2, small_bytes=2 * KB)
    assert read_budget(small, SETTINGS) == pytest.approx(3.0, abs=0.01)  # hot_read_budget x one target-sized file
    assert hot_work(small, SETTINGS) is None  # cost 2
    work, reason = hot_work(dataclasses.replace(small, equality_delete_files=1), SETTINGS)  # cost 5
    assert work is Work.CONVERT and "over its budget 3.0" in reason
    assert hot_work(PartitionStats(data_files=9, data_bytes=9 * 128 * MB), SETTINGS) is None  # its own ideal


def test_benefit_over_cost_prefers_cheap_big_wins():
    rotten = PartitionStats(data_files=50, data_bytes=50 * MB, small_files=50, small_bytes=50 * MB, equality_delete_files=40)
    mild = PartitionStats(
        data_files=12,
        data_bytes=900 * MB,
        small_files=4,
        small_bytes=4 * MB,
        medium_files=8,
        medium_bytes=896 * MB,
        equality_delete_files=1,
    )
    b1, c1 = benefit_and_cost(rotten, Work.DELETE_MERGE, SETTINGS)
    b2, c2 = benefit_and_cost(mild, Work.DELETE_MERGE, SETTINGS)
    assert b1 / c1 > b2 / c2


# ---- the tracker: hot ceiling, ordering, answered work, backoff ----


def event(table: str, path: str, at_ms: int, data_files: int = 1, deletes: int = 1, sequence_number: int = 1) -> CommitEvent:
    delta = PartitionDelta(
        {"p": path},
        path,
        0,
        data_files=data_files,
        data_bytes=1000 * data_files,
        data_records=10,
        equality_delete_files=deletes,
        equality_delete_records=deletes,
    )
    return CommitEvent(table, at_ms, None, sequence_number, at_ms, "overwrite", "w", None, {}, [delta])


def tracker(**overrides) -> PartitionTracker:
    """A tracker for the read budget's and the settle rules' tests: the portability target (its
    own tests below) is set far off unless given."""
    overrides.setdefault("portable_within_seconds", 1e6)
    return PartitionTracker(CompactorConfig(min_small_files=4, settle=SETTLE, **overrides))


def finish(t: PartitionTracker, state, outcome: Outcome, now: float):
    return t.resolve(state, outcome, "why", started=now - 1, now=now, rng=random.Random(1))


def test_hot_partitions_within_their_read_budget_wait_for_settling():
    t = tracker(hot_read_budget=100)
    for second in range(0, 100, 10):
        t.on_commit(event("db.t", "p=hot", second * 1000))
    for second in range(0, 40, 10):
        t.on_commit(event("db.t", "p=cold", second * 1000))
    now = 100
    assert [c.partition_path for c in t.candidates(now)] == ["p=cold"]
    assert [s.path for s in t.waiting(now)] == ["p=hot"]


def test_a_hot_partition_past_its_read_budget_is_a_hot_candidate():
    t = tracker(hot_read_budget=6)
    for second in range(0, 100, 10):  # 10 batch files, 10 equality deletes: cost 40
        t.on_commit(event("db.t", "p=hot", second * 1000))
    [candidate] = t.candidates(100)
    assert (candidate.partition_path, candidate.work, candidate.hot) == ("p=hot", Work.CONVERT, True)
    assert t.report(100)[0].read_budget == pytest.approx(6.0, abs=0.02)


def test_a_hot_partition_over_its_ceiling_is_compacted_anyway():
    t = tracker(hot_max_delete_files=5)
    for second in range(0, 60, 10):
        t.on_commit(event("db.t", "p=hot", second * 1000))
    [candidate] = t.candidates(55)
    assert "ceiling" in candidate.reason


def test_work_is_answered_until_the_next_write():
    t = tracker(hot_read_budget=100)
    t.on_commit(event("db.t", "p=a", 0))
    assert len(t.candidates(1000)) == 1
    state = t.get("db.t", "p=a")
    t.begin(state)
    assert t.candidates(1000) == []
    finish(t, state, Outcome.COMMITTED, 1001)
    # The sidecar re-reads the table after its own compaction: the merge left one file, no delete.
    t.on_metadata("db.t", 1, {"p=a": PartitionMetadata({"p": "p=a"}, PartitionStats(data_files=1, data_bytes=1000), None, 1001)})
    assert t.candidates(2000) == [] and t.waiting(2000) == []  # fixed point: nothing to redo
    t.on_commit(event("db.t", "p=a", 3_000_000, sequence_number=2))
    assert t.waiting(3001) and t.candidates(4000)


def test_the_status_names_the_work_ahead_of_each_partition_and_none_at_the_fixed_point():
    t = tracker(hot_read_budget=100)
    for second in range(0, 100, 10):
        t.on_commit(event("db.t", "p=hot", second * 1000))
    t.on_commit(event("db.t", "p=cold", 0))
    pending = {row.partition: row.pending for row in t.report(100)}
    # The hot one's equality deletes wait for the portability target's conversion; the settled
    # one's delete merge is due now.
    assert pending == {"p=hot": Work.CONVERT.value, "p=cold": Work.DELETE_MERGE.value}
    state = t.get("db.t", "p=cold")
    t.begin(state)
    finish(t, state, Outcome.COMMITTED, 101)
    # A large file with a few deleted rows by position: the policy's fixed point.
    large = PartitionStats(data_files=1, data_bytes=200 * MB, records=1000, position_delete_files=1, position_delete_records=3)
    t.on_metadata("db.t", 2, {"p=cold": PartitionMetadata({"p": "p=cold"}, large, None, 101)})
    [cold] = [row for row in t.report(5000) if row.partition == "p=cold"]
    assert (cold.state, cold.pending) == ("settled", None)
    assert "next work" in status.render(status.StatusReport("test", 5000.0, t.report(5000)), 5000.0)


def test_work_done_while_hot_leaves_the_settled_work_to_do_once_it_settles():
    t = tracker(hot_read_budget=2)
    for second in range(0, 100, 10):
        t.on_commit(event("db.t", "p=a", second * 1000))
    [hot] = t.candidates(100)
    state = t.get("db.t", "p=a")
    t.begin(state, hot=hot.hot)
    finish(t, state, Outcome.COMMITTED, 101)
    assert t.candidates(101) == []  # answered while it is still hot
    [settled] = t.candidates(5000)  # no write since, and it has settled: the full delete merge
    assert (settled.work, settled.hot) == (Work.DELETE_MERGE, False)
    t.begin(state, hot=settled.hot, last_pack=settled.last_pack)
    finish(t, state, Outcome.COMMITTED, 5001)
    assert t.candidates(6000) == []


def settled_small_files(t: PartitionTracker, files: int) -> None:
    """A partition written once every 10 s for ``files`` commits of one small file each (no
    deletes), so that its settle window is the floor, 30 s."""
    for i in range(files):
        t.on_commit(event("db.t", "p=a", i * 10_000, deletes=0, sequence_number=i + 1))


def test_a_settled_partition_under_the_minor_trigger_gets_one_last_pack_once_quiet_for_two_windows():
    t = tracker()  # min_small_files=4
    settled_small_files(t, 3)  # last write at 20 s; settle window 30 s
    assert t.candidates(51) == []  # settled, and 3 small files are under the minor trigger
    assert [p.path for p in t.waiting(51)] == ["p=a"]  # the last pack is ahead
    [last] = t.candidates(81)  # two windows quiet
    assert (last.work, last.hot, last.last_pack) == (Work.MINOR, False, True) and "last pack of 3 small files" in last.reason
    state = t.get("db.t", "p=a")
    t.begin(state, hot=last.hot, last_pack=last.last_pack)
    finish(t, state, Outcome.SKIPPED, 82)  # even when its plan found nothing, it is not tried again
    assert t.candidates(10_000) == [] and t.waiting(10_000) == []
    t.on_commit(event("db.t", "p=a", 20_000_000, deletes=0, sequence_number=9))  # written again
    assert not state.answered(settled=False)  # written again: the last pack answered the write before


def test_the_last_pack_follows_the_settled_work_and_a_compacted_partition_needs_none():
    t = tracker()
    settled_small_files(t, 5)  # at the minor trigger: the settled work is a minor compaction
    [minor] = t.candidates(71)
    assert (minor.work, minor.last_pack) == (Work.MINOR, False)
    state = t.get("db.t", "p=a")
    t.begin(state, hot=minor.hot, last_pack=minor.last_pack)
    finish(t, state, Outcome.COMMITTED, 72)
    packed = PartitionStats(data_files=1, data_bytes=5000, records=50, small_files=1, small_bytes=5000)
    t.on_metadata("db.t", 6, {"p=a": PartitionMetadata({"p": "p=a"}, packed, 40.0, 72.0)})
    assert t.candidates(200) == [] and t.waiting(200) == []  # one file: no last pack to make


@pytest.mark.parametrize(
    ("stats", "packs"),
    [
        (PartitionStats(data_files=1, small_files=1, small_bytes=MB), False),
        (PartitionStats(data_files=3, small_files=3, small_bytes=3 * MB), True),
        # Medium files stay under the usual rule: a writer that returns after long pauses would
        # otherwise have them rewritten on every return.
        (PartitionStats(data_files=2, medium_files=2, medium_bytes=60 * MB), False),
        (PartitionStats(data_files=3, small_files=2, small_bytes=2 * MB, medium_files=1, medium_bytes=40 * MB), True),
    ],
)
def test_the_last_pack_packs_two_small_files_or_more(stats: PartitionStats, packs: bool):
    assert (last_pack(stats, SETTINGS) is not None) is packs


def test_the_last_pack_plans_the_small_files_under_the_minor_trigger():
    small = [DataFileFacts(f"s{i}", MB, 10, i) for i in range(2)]
    medium = [DataFileFacts("m", 40 * MB, 10, 3)]
    large = [DataFileFacts("l", 120 * MB, 10, 4)]
    files = PartitionFiles((*small, *medium, *large), ())
    assert plan_rewrite(files, Work.MINOR, SETTINGS).empty  # two small files: under the minor trigger
    assert set(plan_rewrite(files, Work.MINOR, SETTINGS, last_pack=True).rewrite) == {"s0", "s1"}


def test_a_write_during_a_compaction_is_not_answered_by_it():
    t = tracker()
    t.on_commit(event("db.t", "p=a", 0))
    state = t.get("db.t", "p=a")
    t.begin(state)
    t.on_commit(event("db.t", "p=a", 500_000, sequence_number=2))  # lands while it runs
    finish(t, state, Outcome.COMMITTED, 1001)
    assert t.candidates(2000)  # its starting snapshot did not have that write's deletes


def test_failures_back_off_then_give_up_until_the_next_write():
    t = tracker(max_attempts=3, retry_base_seconds=10, retry_max_seconds=100)
    t.on_commit(event("db.t", "p=a", 0))
    state = t.get("db.t", "p=a")
    t.begin(state)
    assert finish(t, state, Outcome.FAILED, 1000).outcome is Outcome.FAILED
    assert t.candidates(1001) == [] and t.candidates(1011)
    t.begin(state)
    assert finish(t, state, Outcome.CONFLICT, 1011).outcome is Outcome.CONFLICT
    t.begin(state)
    assert finish(t, state, Outcome.FAILED, 1100).outcome is Outcome.ABANDONED  # third failure: given up
    assert t.candidates(10_000) == []


def test_retry_delays_grow_and_are_capped():
    settings = CompactorConfig(retry_base_seconds=10, retry_max_seconds=60)
    rng = random.Random(0)
    delays = [outcomes.retry_delay(n, settings, rng) for n in range(1, 8)]
    assert 5 <= delays[0] <= 10 and all(d <= 60 for d in delays) and delays[-1] >= 30


def test_metadata_replaces_statistics_and_forgets_empty_partitions():
    t = tracker()
    t.on_commit(event("db.t", "p=a", 0))
    t.on_commit(event("db.t", "p=b", 0))
    t.on_metadata("db.t", 7, {"p=a": PartitionMetadata({"p": "a"}, PartitionStats(data_files=1), None, 5.0)})
    assert t.get("db.t", "p=b") is None
    state = t.get("db.t", "p=a")
    assert state.stats == PartitionStats(data_files=1) and state.last_compaction == 5.0


def test_commit_events_add_up_between_metadata_reads_and_are_not_counted_twice():
    t = tracker()
    t.on_commit(event("db.t", "p=a", 0, data_files=2, deletes=1, sequence_number=1))
    t.on_commit(event("db.t", "p=a", 1000, data_files=1, deletes=3, sequence_number=2))
    stats = t.get("db.t", "p=a").stats
    assert (stats.data_files, stats.small_files, stats.equality_delete_files) == (3, 3, 4)
    t.on_metadata("db.t", 2, {"p=a": PartitionMetadata({"p": "a"}, PartitionStats(data_files=1), 1.0, None)})
    t.on_commit(event("db.t", "p=a", 1000, data_files=1, deletes=3, sequence_number=2))  # late: already counted
    t.on_commit(event("db.t", "p=a", 2000, data_files=1, deletes=0, sequence_number=3))
    assert t.get("db.t", "p=a").stats.data_files == 2
    assert t.get("db.t", "p=a").cadence.last_write == 2.0


# ---- one partition, file by file ----


def data(
    name: str, size_mb: float, seq: int, eq: tuple[str, ...] = (), pos: tuple[str, ...] = (), records: int = 1000
) -> DataFileFacts:
    return DataFileFacts(name, int(size_mb * MB), records, seq, eq, pos)


def test_delete_merge_rewrites_small_and_medium_files_and_converts_large_ones():
    files = PartitionFiles(
        data=(
            data("small1", 1, 1, eq=("eq2",)),
            data("small2", 1, 2),
            data("medium", 50, 1, eq=("eq2",)),
            data("large", 120, 1, eq=("eq2",)),
            data("large-clean", 120, 3),
        ),
        deletes=(LiveDeleteFile("eq2", EQUALITY, 5, 100), LiveDeleteFile("eq-dangling", EQUALITY, 5, 100)),
    )
    plan = plan_rewrite(files, Work.DELETE_MERGE, SETTINGS)
    assert set(plan.rewrite) == {"small1", "small2", "medium"}
    assert plan.convert == ("large",)
    assert set(plan.remove_deletes) == {"eq2", "eq-dangling"}


def test_a_large_file_with_many_deleted_rows_is_rewritten():
    files = PartitionFiles(
        data=(data("large", 120, 1, pos=("pos",), records=1000),),
        deletes=(LiveDeleteFile("pos", POSITION, 150, 10),),
    )
    plan = plan_rewrite(files, Work.DELETE_MERGE, SETTINGS)
    assert plan.rewrite == ("large",) and plan.remove_deletes == ("pos",)


def test_minor_compaction_keeps_deletes_that_untouched_files_still_need():
    files = PartitionFiles(
        data=(*(data(f"s{i}", 1, 1, eq=("eq",)) for i in range(4)), data("medium", 50, 1, eq=("eq",))),
        deletes=(LiveDeleteFile("eq", EQUALITY, 5, 100),),
    )
    plan = plan_rewrite(files, Work.MINOR, SETTINGS)
    assert set(plan.rewrite) == {"s0", "s1", "s2", "s3"} and plan.remove_deletes == ()


def test_only_dangling_deletes_is_its_own_kind_of_work():
    files = PartitionFiles(data=(data("large", 120, 5),), deletes=(LiveDeleteFile("eq", EQUALITY, 5, 100),))
    plan = plan_rewrite(files, Work.DELETE_MERGE, SETTINGS)
    assert plan.work is Work.REMOVE_DANGLING_DELETES and plan.remove_deletes == ("eq",)


@pytest.mark.parametrize("work", list(Work))
def test_a_compacted_partition_is_a_fixed_point(work):
    # What a delete merge leaves: one packed file (small), large files with few position deletes.
    files = PartitionFiles(
        data=(data("packed", 3, 9), data("large1", 120, 1, pos=("pos1",)), data("large2", 120, 1)),
        deletes=(LiveDeleteFile("pos1", POSITION, 20, 10),),
    )
    assert plan_rewrite(files, work, SETTINGS).empty
    stats = PartitionStats(
        data_files=3,
        data_bytes=243 * MB,
        records=3000,
        small_files=1,
        small_bytes=3 * MB,
        position_delete_files=1,
        position_delete_records=20,
    )
    assert needed_work(stats, SETTINGS) is None


def test_deletes_apply_by_sequence_number_and_referenced_file():
    deletes = (
        LiveDeleteFile("eq-old", EQUALITY, 1, 1, data_sequence_number=3),
        LiveDeleteFile("eq-new", EQUALITY, 1, 1, data_sequence_number=5),
        LiveDeleteFile("pos-same", POSITION, 1, 1, data_sequence_number=5),
        LiveDeleteFile("pos-other", POSITION, 1, 1, data_sequence_number=9, referenced_data_file="other"),
        LiveDeleteFile("pos-any", POSITION, 1, 1, data_sequence_number=9),
    )
    assert applying_deletes("f", 5, deletes) == ((), ("pos-same", "pos-any"))  # same commit: not its own eq deletes
    assert applying_deletes("f", 4, deletes) == (("eq-new",), ("pos-same", "pos-any"))
    assert applying_deletes("other", 2, deletes) == (("eq-old", "eq-new"), ("pos-same", "pos-other", "pos-any"))


def test_a_listing_becomes_files_with_the_deletes_that_apply_to_each():
    deletes = (LiveDeleteFile("eq", EQUALITY, 1, 1, data_sequence_number=5),)
    files = PartitionFiles.of([LiveDataFile("old", 10, 1, 4), LiveDataFile("new", 10, 1, 5)], deletes)
    assert [(f.path, f.equality_deletes) for f in files.data] == [("old", ("eq",)), ("new", ())]
    assert files.deletes == deletes
