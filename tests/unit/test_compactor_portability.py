"""The portability target's decisions, without Spark, Kafka or a catalog: when a partition's
equality deletes need a conversion (hot or settled, partitioned or global), that it goes before
every merge and pack, when the loop wakes for it, and how the status, the metrics and the events
tell a table's oldest live equality delete."""

from __future__ import annotations

import dataclasses
import random

import orjson
import pytest
from pydantic import ValidationError

from icecdc.compactor import metrics, scheduler, status
from icecdc.compactor.compaction_runner import CompactionRunner
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import PartitionFiles, plan_for
from icecdc.compactor.policy import (
    PORTABLE_SHARE,
    Candidate,
    PartitionStats,
    Work,
    portability_due,
    portability_work,
    rank,
)
from icecdc.compactor.staging import StagedMain
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH, PartitionMetadata, PartitionTracker, TablePortability
from icecdc.domain.events import CommitEvent, CompactionEvent, PartitionDelta
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.domain.portable import PortableSnapshot
from icecdc.runtime.config import CompactorConfig, SettleConfig
from tests.unit.test_compactor_loop import LAYOUT, FakeCompaction, FakeGate, FakeLeases, Published

TARGET = 10.0
SETTINGS = CompactorConfig(
    portable_within_seconds=TARGET,
    hot_read_budget=1000,  # the read budget never asks for anything here
    min_small_files=4,
    settle=SettleConfig(cadence_multiple=3, min_seconds=30, max_seconds=600, initial_seconds=60),
)
SHARE = PORTABLE_SHARE * TARGET
WITH_DELETES = PartitionStats(data_files=3, data_bytes=3000, records=30, small_files=3, small_bytes=3000, equality_delete_files=2)


def commit(path: str, at: float, sequence_number: int, deletes: int = 1, global_deletes: int = 0) -> CommitEvent:
    delta = PartitionDelta(
        {"p": path},
        path,
        0,
        data_files=1,
        data_bytes=1000,
        data_records=10,
        equality_delete_files=deletes,
        equality_delete_records=deletes,
    )
    return CommitEvent(
        "db.t",
        sequence_number,
        None,
        sequence_number,
        int(at * 1000),
        "overwrite",
        "w",
        None,
        {},
        [delta],
        global_deletes,
        global_deletes,
    )


# ---- the decision ----


def test_equality_deletes_need_a_conversion_once_half_the_target_old():
    assert portability_due(100.0, SETTINGS) == 100.0 + SHARE
    assert portability_work(WITH_DELETES, 100.0, 100.0 + SHARE - 0.01, SETTINGS) is None
    work, reason = portability_work(WITH_DELETES, 100.0, 100.0 + SHARE, SETTINGS)
    assert work is Work.CONVERT and "portable within 10s" in reason
    assert portability_work(PartitionStats(data_files=3), 0.0, 1e9, SETTINGS) is None  # nothing to convert


def test_global_deletes_need_a_resolution_and_deletes_of_unknown_age_are_due_at_once():
    assert portability_work(WITH_DELETES, 0.0, SHARE, SETTINGS, is_global=True)[0] is Work.RESOLVE_GLOBAL_DELETES
    work, reason = portability_work(WITH_DELETES, None, 0.0, SETTINGS)
    assert work is Work.CONVERT and "unknown age" in reason


def test_the_target_is_positive():
    with pytest.raises(ValidationError):
        CompactorConfig(portable_within_seconds=0)


def test_conversions_for_the_target_go_before_every_merge_and_pack_the_nearest_deadline_first():
    merge = Candidate("db.t", "p=a", Work.DELETE_MERGE, "", benefit=100.0, cost=1.0)
    resolution = Candidate("db.t", GLOBAL_DELETES_PATH, Work.RESOLVE_GLOBAL_DELETES, "", 3.0, 4.0)
    late = Candidate("db.t", "p=b", Work.CONVERT, "", 0.0, 4.0, hot=True, due_by=20.0)
    sooner = Candidate("db.t", "p=c", Work.CONVERT, "", 0.0, 4.0, hot=True, due_by=15.0)
    assert [c.partition_path for c in rank([merge, resolution, late, sooner])] == ["p=c", "p=b", GLOBAL_DELETES_PATH, "p=a"]


# ---- the tracker: hot and settled, global, when to wake ----


def test_a_hot_partition_within_its_read_budget_gets_a_conversion_at_half_the_target():
    t = PartitionTracker(SETTINGS)
    for n, at in enumerate(range(100, 110), start=1):  # written every second: hot
        t.on_commit(commit("p=a", at, n))
    assert t.next_due() == 100 + SHARE
    assert t.candidates(100 + SHARE - 0.1) == [] and [p.path for p in t.waiting(100 + SHARE - 0.1)] == ["p=a"]
    [c] = t.candidates(100 + SHARE)
    assert (c.work, c.hot, c.due_by) == (Work.CONVERT, True, 100 + TARGET)


def test_conversions_not_due_yet_are_coming_with_their_deadlines_the_nearest_first():
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=b", 103.0, 1))
    t.on_commit(commit("p=a", 100.0, 2))
    t.on_commit(commit("p=c", 101.0, 3, deletes=0))  # nothing to convert
    coming = t.coming_conversions(104.0)
    assert [(c.partition_path, c.work, c.due_by) for c in coming] == [
        ("p=a", Work.CONVERT, 100 + TARGET),
        ("p=b", Work.CONVERT, 103 + TARGET),
    ]
    assert "4.0s old" in coming[0].reason
    # Once due it is a candidate, no longer coming; one under way or backing off is neither.
    assert [c.partition_path for c in t.coming_conversions(100 + SHARE)] == ["p=b"]
    p = t.get("db.t", "p=b")
    t.begin(p, hot=True)
    assert t.coming_conversions(104.0) == [c for c in coming if c.partition_path == "p=a"]
    t.resolve(p, Outcome.CONFLICT, "lost", started=104, now=104, rng=random.Random(0))
    assert [c.partition_path for c in t.coming_conversions(104.0)] == ["p=a"]


def test_a_settled_partition_answered_long_ago_still_gets_its_conversion():
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=a", 100.0, 1))
    p = t.get("db.t", "p=a")
    t.begin(p)
    t.resolve(p, Outcome.SKIPPED, "why", started=101, now=101, rng=random.Random(0))  # e.g. a v3 merge left it
    assert p.answered(settled=True)
    [c] = t.candidates(1000.0)
    assert c.work is Work.CONVERT and c.due_by == 100 + TARGET
    t.begin(p, hot=c.hot)
    assert t.candidates(1000.0) == [] and t.next_due() is None  # one attempt at a time


def test_a_conversion_that_lost_a_conflict_waits_for_its_backoff():
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=a", 100.0, 1))
    p = t.get("db.t", "p=a")
    t.begin(p, hot=True)
    t.resolve(p, Outcome.CONFLICT, "lost", started=106, now=106, rng=random.Random(0))
    retry_at = p.state.retry_at
    assert t.next_due() == retry_at and t.candidates(retry_at - 0.1) == []
    assert [c.work for c in t.candidates(retry_at)] == [Work.CONVERT]


def test_the_oldest_equality_delete_comes_from_metadata_and_goes_with_it():
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=a", 100.0, 1))
    t.on_commit(commit("p=a", 104.0, 2))
    assert t.get("db.t", "p=a").oldest_write == 100.0
    # A conversion committed: the table's metadata lists no equality delete any more.
    t.on_metadata("db.t", 2, {"p=a": PartitionMetadata({"p": "p=a"}, PartitionStats(data_files=2), 104.0, 105.0)})
    assert t.get("db.t", "p=a").oldest_write is None and t.next_due() is None
    assert t.portability("db.t") == TablePortability("db.t", 0, None)


def test_global_deletes_are_resolved_first_once_due():
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=a", 100.0, 1, deletes=0, global_deletes=1))
    t.on_commit(commit("p=b", 101.0, 2))
    # While written, they wait for the portability target, as a partition's deletes do.
    assert [c for c in t.candidates(100 + SHARE - 0.1) if c.partition_path == GLOBAL_DELETES_PATH] == []
    assert GLOBAL_DELETES_PATH in {p.path for p in t.waiting(100 + SHARE - 0.1)}
    ranked = t.candidates(100 + SHARE + 1)
    assert [(c.partition_path, c.due_by) for c in ranked] == [(GLOBAL_DELETES_PATH, 100 + TARGET), ("p=b", 101 + TARGET)]
    assert t.portability("db.t") == TablePortability("db.t", 2, 100.0)
    assert t.portability("db.t").oldest_age(110.0) == 10.0


@pytest.mark.parametrize(
    ("has_candidates", "next_due", "timeout"),
    [
        (True, 1000.5, 0.0),
        (False, None, scheduler.IDLE_POLL_SECONDS),
        (False, 1000.25, 0.25),
        (False, 999.0, scheduler.IDLE_POLL_SECONDS),
    ],
    ids=["work to do", "nothing waiting", "a conversion due soon", "due but not ours to do"],
)
def test_the_loop_waits_for_events_no_longer_than_the_next_conversion(has_candidates, next_due, timeout):
    assert scheduler.poll_timeout(has_candidates, next_due, 1000.0) == timeout


# ---- the plan: conversions only ----

EQ = LiveDeleteFile("eq", DataFileContent.EQUALITY_DELETES, 1, 10, 5, None, (1,))
HOT_FILES = PartitionFiles.of([LiveDataFile(f"f{i}", 100, 10, i) for i in range(1, 4)], [EQ])


def test_the_targets_conversion_rewrites_no_data_on_a_settled_partition():
    plan = plan_for(Work.CONVERT, HOT_FILES, SETTINGS, hot=False, portable=True)
    assert plan.work is Work.CONVERT and plan.rewrite == () and set(plan.convert) == {"f1", "f2", "f3"}
    assert plan.remove_deletes == ("eq",)


def test_on_a_hot_partition_over_its_budget_the_targets_conversion_packs_what_the_budget_asks():
    # Three small files and their position deletes after a conversion cost six opens, over the
    # budget of three: the pack takes them into one and leaves no equality delete.
    plan = plan_for(Work.CONVERT, HOT_FILES, SETTINGS.model_copy(update={"hot_read_budget": 3}), hot=True, portable=True)
    assert plan.work is Work.DELETE_MERGE and set(plan.rewrite) == {"f1", "f2", "f3"} and plan.convert == ()
    assert plan.remove_deletes == ("eq",)


def test_on_a_hot_partition_the_targets_work_is_never_a_full_delete_merge():
    settings = SETTINGS.model_copy(update={"target_file_size_bytes": 100, "large_file_ratio": 0.5, "hot_read_budget": 1})
    # Large files only: no pack helps, so the budget's own work would rewrite them all.
    files = PartitionFiles.of([LiveDataFile(f"big{i}", 100, 10, i) for i in range(1, 5)], [EQ])
    assert plan_for(Work.CONVERT, files, settings, hot=True).work is Work.DELETE_MERGE  # the budget's own work
    plan = plan_for(Work.CONVERT, files, settings, hot=True, portable=True)
    assert plan.work is Work.CONVERT and plan.rewrite == ()


def test_on_format_v3_a_merge_converts_nothing():
    settings = SETTINGS.model_copy(update={"target_file_size_bytes": 100, "large_file_ratio": 0.5})
    files = PartitionFiles.of([LiveDataFile("big", 100, 10, 1), LiveDataFile("small", 10, 1, 1)], [EQ])
    assert plan_for(Work.DELETE_MERGE, files, settings).convert == ("big",)
    v3 = plan_for(Work.DELETE_MERGE, files, settings, deletion_vectors=True)
    assert (v3.rewrite, v3.convert, v3.remove_deletes) == (("small",), (), ())  # "eq" still applies to "big"


# ---- what the runner, the status and the metrics tell ----


def test_a_conversion_for_the_target_is_planned_as_one_and_its_event_tells_the_table_after_the_commit():
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=eu", 100.0, 1))
    [candidate] = t.candidates(100 + SHARE)
    compaction, published, reread = FakeCompaction(HOT_FILES), Published(), []

    def read_again(table: str) -> None:
        reread.append(table)
        t.on_metadata(table, 1, {"p=eu": PartitionMetadata({"p": "p=eu"}, PartitionStats(data_files=3), None, 106.0)})

    gate = FakeGate()
    runner = CompactionRunner(
        replica="r1",
        settings=SETTINGS,
        tracker=t,
        leases=FakeLeases(),
        gate=gate,
        compactions=lambda table, layout, partitions: compaction,
        publisher=published,
        clock=lambda: 106.0,
        on_finish=read_again,
        rng=random.Random(0),
    )
    [event] = runner.run([(candidate, t.get("db.t", "p=eu"))], LAYOUT)
    assert compaction.plans[0].work is Work.CONVERT and compaction.plans[0].rewrite == ()
    assert gate.commit_by == [100 + TARGET]  # no wait for a quiet window past the target
    assert reread == ["db.t"]
    started, ended = published
    assert (started.portable, started.oldest_equality_delete_age_seconds) == (False, 6.0)
    assert (ended.outcome, ended.portable, ended.oldest_equality_delete_age_seconds) == (Outcome.COMMITTED, True, 0.0)
    assert CompactionEvent.from_json(event.to_json()) == event
    # The fields are additive: an event from an older replica, without them, still reads.
    older = orjson.loads(event.to_json())
    del older["oldest_equality_delete_age_seconds"], older["portable"]
    assert CompactionEvent.from_json(orjson.dumps(older)) == dataclasses.replace(
        event, oldest_equality_delete_age_seconds=None, portable=None
    )


def test_the_status_says_whether_each_table_is_portable_and_how_old_its_oldest_equality_delete_is():
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=a", 100.0, 1))
    t.on_commit(commit("p=b", 103.0, 2, deletes=0))
    report = status.StatusReport("test", 112.0, t.report(112.0), TARGET)
    text = status.render(report, now=112.0)
    assert "db.t: not portable: 1 live equality-delete files, the oldest 12.0s old, PAST the 10s target" in text
    assert status.StatusReport.from_dict(report.to_dict()) == report
    t.on_metadata("db.t", 2, {"p=a": PartitionMetadata({"p": "p=a"}, PartitionStats(data_files=2), 103.0, None)})
    assert "db.t: portable (no live equality delete)" in status.render(status.StatusReport("test", 113.0, t.report(113.0)), 113.0)


def test_the_status_says_how_far_a_staged_tables_main_is_behind_its_branch():
    behind = StagedMain("db.t", "icecdc-staged", 3, PortableSnapshot(3, 5, 2, 4.1))
    report = status.StatusReport("test", 112.0, [], TARGET, [behind])
    assert "db.t: readers read main, on staging branch icecdc-staged: main is 2 commit(s) and 4.1s behind" in status.render(
        report, now=112.0
    )
    assert status.StatusReport.from_dict(orjson.loads(orjson.dumps(report.to_dict()))) == report
    older = report.to_dict()
    del older["staged"]  # a status file written before staged mains were reported still reads
    assert status.StatusReport.from_dict(older).staged == []


def test_the_writers_bytes_are_counted_beside_the_sidecars():
    before = metrics.WRITER_BYTES.labels("db.t")._value.get()
    metrics.writer_committed(commit("p=a", 1.0, 1))
    assert metrics.WRITER_BYTES.labels("db.t")._value.get() - before == 1000


def test_global_deletes_resolved_by_the_job_still_under_way_are_not_due_again():
    """The job re-reads the table before it ends, while its partition is still being compacted:
    a partition the metadata no longer lists has no live file left, whatever the events said."""
    t = PartitionTracker(SETTINGS)
    t.on_commit(commit("p=a", 100.0, 1, deletes=0, global_deletes=1))
    resolving = t.get("db.t", GLOBAL_DELETES_PATH)
    t.begin(resolving)
    t.on_metadata("db.t", 2, {"p=a": PartitionMetadata({"p": "p=a"}, PartitionStats(data_files=1), 100.0, None)})
    t.resolve(resolving, Outcome.COMMITTED, "done", started=101, now=120, rng=random.Random(0))
    assert t.candidates(120.0) == [] and t.next_due() is None and t.portability("db.t").portable
