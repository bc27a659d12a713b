"""The pure steps of one compaction job (``compactor.job_progress``): planning its partitions,
counting them from the starting snapshot, the commit's deadline, how a failure ends it, and which
partitions leave the key index."""

from __future__ import annotations

import dataclasses

import pytest

from icecdc.compactor.job_progress import JobPartition, JobUnderWay, failure_of, partition_key
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import PartitionFiles, RewritePlan
from icecdc.compactor.policy import Candidate, PartitionStats, Work
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH, TrackedPartition
from icecdc.coordinator.errors import CommitGaveUp, LeaseLost
from icecdc.domain.errors import CommitConflict
from icecdc.domain.events import CompactionCounts
from icecdc.runtime.config import CompactorConfig
from tests.unit.test_compactor_loop import LAYOUT, SMALL_FILES

SETTINGS = CompactorConfig(min_small_files=2)
NOTHING = PartitionFiles((), ())


def part(region: str, slot: int = 0, due_by: float | None = None, hot: bool = False, work: Work = Work.MINOR) -> JobPartition:
    partition = TrackedPartition("db.t", f"p={region}", {"p": region}, PartitionStats(data_files=3, small_files=3))
    candidate = Candidate("db.t", f"p={region}", work, "3 small files", 1.0, 1.0, hot=hot, due_by=due_by)
    return JobPartition(candidate, partition, slot, 1, candidate.reason)


def job(*parts: JobPartition) -> JobUnderWay:
    return JobUnderWay("db.t", LAYOUT, list(parts), started=100.0)


def test_each_partition_is_planned_from_its_own_files_in_order():
    under_way = job(part("eu"), part("us"))
    plans = under_way.plan([SMALL_FILES, NOTHING], SETTINGS)
    assert [len(p.rewrite) for p in plans] == [3, 0]
    assert [p.plan for p in under_way.parts] == plans
    assert [p.has_work for p in under_way.parts] == [True, False] and under_way.has_work


def test_an_empty_table_plans_nothing_anywhere():
    under_way = job(part("eu"), part("us"))
    assert under_way.plan(None, SETTINGS) == [RewritePlan(Work.MINOR), RewritePlan(Work.MINOR)]
    assert not under_way.has_work
    assert all(p.ending(None)[0] is Outcome.SKIPPED for p in under_way.parts)


def test_only_partitions_with_work_are_counted_from_the_start_and_take_the_results():
    under_way = job(part("eu"), part("us"))
    under_way.plan([SMALL_FILES, NOTHING], SETTINGS)
    under_way.start_from(8, 7)
    assert [p.counts for p in under_way.parts] == [CompactionCounts(starting_snapshot_id=8, starting_sequence_number=7), None]
    done = CompactionCounts(8, 7, 9, 8, 3)
    under_way.finish_with([done, done])
    assert [p.counts for p in under_way.parts] == [done, None]


def test_a_failure_ends_every_partition_with_work_and_the_others_are_skipped():
    under_way = job(part("eu"), part("us"))
    under_way.plan([SMALL_FILES, NOTHING], SETTINGS)
    failure = (Outcome.CONFLICT, "files changed")
    assert [p.ending(failure)[0] for p in under_way.parts] == [Outcome.CONFLICT, Outcome.SKIPPED]
    assert under_way.parts[0].ending(None) == (Outcome.COMMITTED, "3 small files")


def test_a_partition_not_yet_planned_shares_the_jobs_failure():
    assert part("eu").ending((Outcome.FAILED, "boom")) == (Outcome.FAILED, "boom")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError("disk full"), (Outcome.FAILED, "RuntimeError: disk full")),
        (CommitConflict("files changed"), (Outcome.CONFLICT, "files changed")),
        (CommitGaveUp("gave up"), (Outcome.CONFLICT, "gave up")),
        (LeaseLost("slot 3 moved"), (Outcome.FENCED, "slot 3 moved")),
    ],
)
def test_an_unexpected_failure_names_its_error_type(error, expected):
    assert failure_of(error) == expected


def test_the_commit_waits_no_longer_than_the_nearest_conversion_deadline():
    assert job(part("eu"), part("us")).commit_by is None
    assert job(part("eu", due_by=50.0), part("us"), part("ap", due_by=40.0)).commit_by == 40.0


def test_the_leases_to_confirm_are_each_slot_once_in_order():
    under_way = job(part("eu", slot=3), part("us", slot=1), part("ap", slot=3))
    assert under_way.slots == [1, 3]
    assert under_way.what == "compacting db.t p=eu, p=us, p=ap"


def test_a_job_lists_its_partitions_by_key_or_the_tables_global_deletes():
    assert job(part("eu"), part("us")).keys == [("eu",), ("us",)]
    assert partition_key(part("eu").partition, LAYOUT) == ("eu",)
    whole = TrackedPartition("db.t", GLOBAL_DELETES_PATH, {}, PartitionStats())
    assert whole.is_global
    global_part = dataclasses.replace(part("eu"), partition=whole)
    assert job(global_part).keys is None


@pytest.mark.parametrize(
    ("hot", "work", "outcome", "leaves"),
    [
        (False, Work.MINOR, Outcome.COMMITTED, True),
        (True, Work.MINOR, Outcome.COMMITTED, False),  # a hot pack leaves the rest of its files indexed
        (False, Work.MINOR, Outcome.CONFLICT, False),
        (False, Work.CONVERT, Outcome.COMMITTED, False),  # a conversion rewrites no data
    ],
)
def test_a_settled_partition_whose_data_a_committed_job_rewrote_leaves_the_key_index(hot, work, outcome, leaves):
    p = dataclasses.replace(part("eu", hot=hot, work=work), plan=RewritePlan(work, rewrite=("f0",)))
    assert p.leaves_key_index(outcome) is leaves
