"""Partitions of older partition specs, as plain data: how they are named, seen through their own
spec, planned, and when the tracker asks for their rewrite into the current spec (only once
settled, never as a portability conversion)."""

from __future__ import annotations

import pytest

from icecdc.compactor.plans import PartitionFiles, plan_for
from icecdc.compactor.policy import PartitionStats, Work, benefit_and_cost, older_spec_work
from icecdc.compactor.tracker import PartitionMetadata, PartitionTracker
from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.domain.layout import Column, OlderSpec, PartitionTerm, TableLayout, older_spec_of, older_spec_path
from icecdc.runtime.config import CompactorConfig, SettleConfig

REGION = PartitionTerm("region", "region", "identity", "string", 1000)
BUCKET = PartitionTerm("id_bucket", "id", "bucket[4]", "long", 1001)
LAYOUT = TableLayout(
    table="db.t",
    topic="",
    columns=(Column("id", "long", True), Column("region", "string")),
    field_ids={"id": 1, "region": 2},
    primary_key=("id",),
    partition=(REGION, BUCKET),
    spec_id=2,
    data_location="/tmp/t/data",
    global_spec_id=1,
    older_specs=(OlderSpec(0, (REGION,)), OlderSpec(1, ())),
)
SETTINGS = CompactorConfig(
    min_small_files=2,
    portable_within_seconds=10,
    settle=SettleConfig(cadence_multiple=3, min_seconds=2, max_seconds=30, initial_seconds=5),
)
OLD_EU = older_spec_path(0, "region=eu")


def test_an_older_spec_s_paths_carry_its_id_and_never_meet_the_current_spec_s():
    assert OLD_EU == "(spec 0) region=eu" and older_spec_of(OLD_EU) == 0
    assert older_spec_path(1, "") == "(spec 1)" and older_spec_of("(spec 1)") == 1
    assert older_spec_of("region=eu/id_bucket=1") is None and older_spec_of("") is None
    assert older_spec_of("(global deletes)") is None
    assert LAYOUT.tracked_path(("eu", 1)) == "region=eu/id_bucket=1"
    assert LAYOUT.of_older_spec(0).tracked_path(("eu",)) == OLD_EU


def test_an_older_spec_is_seen_through_its_own_fields_and_writes_into_the_current_spec():
    old = LAYOUT.for_path(OLD_EU)
    assert old.partition == (REGION,) and old.spec_id == 0 and old.is_older_spec
    assert old.write_spec_id == 2 and old.older_specs == ()
    assert LAYOUT.for_path("region=eu/id_bucket=1") is LAYOUT and LAYOUT.write_spec_id == 2
    assert LAYOUT.of_spec(2) is LAYOUT and LAYOUT.of_spec(7) is None
    unpartitioned = LAYOUT.of_spec(1)
    assert unpartitioned is not None and unpartitioned.partition == () and unpartitioned.spec_id == unpartitioned.global_spec_id
    with pytest.raises(ValueError, match="no older partition spec 7"):
        LAYOUT.of_older_spec(7)


def test_an_older_spec_partition_is_rewritten_whole_and_leaves_no_delete_file():
    deletes = (
        LiveDeleteFile("eq", DataFileContent.EQUALITY_DELETES, 2, 10, 3, equality_field_ids=(1,)),
        LiveDeleteFile("pos", DataFileContent.POSITION_DELETES, 1, 10, 4, referenced_data_file="b"),
        # A delete that applies to no live file any more goes too: no data file is left for it.
        LiveDeleteFile("dangling", DataFileContent.POSITION_DELETES, 1, 10, 2, referenced_data_file="gone"),
    )
    files = PartitionFiles.of([LiveDataFile("a", 100, 5, 1), LiveDataFile("b", 900_000_000, 50, 2)], deletes)
    plan = plan_for(Work.REWRITE_OLDER_SPEC, files, SETTINGS)
    assert plan.work is Work.REWRITE_OLDER_SPEC
    assert plan.rewrite == ("a", "b") and plan.remove_deletes == ("eq", "pos", "dangling") and not plan.convert


def test_an_older_spec_partition_needs_its_rewrite_while_it_holds_any_file():
    assert older_spec_work(PartitionStats()) is None
    assert older_spec_work(PartitionStats(position_delete_files=1))[0] is Work.REWRITE_OLDER_SPEC
    stats = PartitionStats(data_files=6, data_bytes=6 * 1024, small_files=6, small_bytes=6 * 1024, equality_delete_files=2)
    work, reason = older_spec_work(stats)
    assert work is Work.REWRITE_OLDER_SPEC and "6 data files and 2 delete files" in reason
    benefit, cost = benefit_and_cost(stats, work, SETTINGS)
    assert benefit == 6 + 3 * 2 - 1 and cost > stats.data_bytes


def older_partition(at: float, stats: PartitionStats) -> PartitionMetadata:
    return PartitionMetadata({"region": "eu"}, stats, last_write=at, last_compaction=None, oldest_write=at)


def test_the_tracker_asks_for_an_older_spec_rewrite_only_once_the_partition_has_settled():
    tracker = PartitionTracker(SETTINGS)
    stats = PartitionStats(data_files=3, data_bytes=3000, small_files=3, small_bytes=3000, equality_delete_files=1)
    tracker.on_metadata("db.t", 5, {OLD_EU: older_partition(100.0, stats)})
    (partition,) = tracker
    assert partition.is_older_spec and not partition.is_global
    # Written a moment ago (a merge-on-read writer deleting rows in its files): nothing yet, not
    # even a conversion for the portability target, though its equality delete is past it.
    assert tracker.candidates(101.0) == [] and tracker.portability_due_at(partition) is None
    assert [p.path for p in tracker.waiting(101.0)] == [OLD_EU]
    assert tracker.pending(partition, 101.0) is Work.REWRITE_OLDER_SPEC
    (candidate,) = tracker.candidates(100.0 + SETTINGS.settle.initial_seconds + 1)
    assert (candidate.partition_path, candidate.work, candidate.hot, candidate.due_by) == (
        OLD_EU,
        Work.REWRITE_OLDER_SPEC,
        False,
        None,
    )


def test_a_write_to_an_older_spec_partition_puts_its_rewrite_off_by_a_settle_window():
    tracker = PartitionTracker(SETTINGS)
    tracker.on_metadata("db.t", 5, {OLD_EU: older_partition(100.0, PartitionStats(data_files=2, data_bytes=10))})
    settled = 100.0 + SETTINGS.settle.initial_seconds + 1
    assert tracker.candidates(settled)
    delta = PartitionDelta({"region": "eu"}, OLD_EU, 0)  # e.g. a deletion vector named one of its files
    tracker.on_commit(CommitEvent("db.t", 9, 8, 6, int(settled * 1000), "delete", "found", None, {}, [delta]))
    assert tracker.candidates(settled + 0.1) == []
