"""Tables kept for another writer, without a catalog: what kind of writer a found commit shows,
the commit event it becomes, the snapshots a poll reads, and what the sidecar may do beside each
kind (docs/compactor.md, "Beside other writers")."""

from __future__ import annotations

import pytest

from icecdc.compactor.policy import PartitionStats, Work, beside_writer
from icecdc.compactor.tracker import PartitionMetadata, PartitionTracker
from icecdc.compactor.watcher import REMEMBERED_SNAPSHOTS, SeenSnapshot, WatchedTable
from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.domain.files import DataFileContent
from icecdc.domain.writer_commits import (
    FOUND_WRITER,
    FileChange,
    FoundCommit,
    SnapshotLink,
    SummaryCounts,
    WriterKind,
    classify,
    classify_counts,
    commit_event,
    most_demanding,
    new_snapshots,
    told_by_event,
    touched_partitions,
)
from icecdc.runtime.config import CompactorConfig, SettleConfig

DATA, EQUALITY, POSITION = DataFileContent.DATA, DataFileContent.EQUALITY_DELETES, DataFileContent.POSITION_DELETES
MB = 1024 * 1024
SETTINGS = CompactorConfig(
    target_file_size_bytes=128 * MB,
    min_small_files=4,
    hot_max_delete_files=4,
    settle=SettleConfig(cadence_multiple=3, min_seconds=10, max_seconds=600, initial_seconds=60),
)


def change(
    content: DataFileContent, path: str, *, added: bool = True, region: str = "eu", refers: str | None = None
) -> FileChange:
    return FileChange(
        content=content,
        added=added,
        path=path,
        partition={"region": region},
        partition_path=f"region={region}",
        spec_id=0,
        records=10,
        size=1000,
        referenced_data_file=refers,
    )


def commit(*changes: FileChange, snapshot_id: int = 2, sequence_number: int = 2, at_ms: int = 5_000) -> FoundCommit:
    return FoundCommit("db.kept", snapshot_id, snapshot_id - 1, sequence_number, at_ms, "overwrite", changes)


# ---- what kind of writer a commit shows ----


def test_a_commit_that_only_adds_data_files_is_an_append():
    assert classify(commit(change(DATA, "a.parquet"), change(DATA, "b.parquet"))) is WriterKind.APPENDS
    assert classify(commit()) is WriterKind.APPENDS


def test_equality_deletes_and_position_deletes_against_the_commits_own_files_are_flink_like():
    own = commit(
        change(DATA, "new.parquet"), change(EQUALITY, "eq.parquet"), change(POSITION, "pos.parquet", refers="new.parquet")
    )
    assert classify(own) is WriterKind.EQUALITY_DELETES
    assert classify(commit(change(DATA, "new.parquet"), change(EQUALITY, "eq.parquet"))) is WriterKind.EQUALITY_DELETES


def test_position_deletes_against_older_files_or_unknown_ones_delete_in_place():
    older = commit(change(DATA, "new.parquet"), change(POSITION, "dv.puffin", refers="old.parquet"))
    unknown = commit(change(POSITION, "partition-scoped.parquet", refers=None))
    assert classify(older) is WriterKind.DELETES_IN_PLACE
    assert classify(unknown) is WriterKind.DELETES_IN_PLACE


def test_a_commit_that_removes_a_data_file_replaces_files():
    cow = commit(change(DATA, "old.parquet", added=False), change(DATA, "rewritten.parquet"))
    assert classify(cow) is WriterKind.REPLACES_FILES
    assert classify(commit(change(DATA, "old.parquet", added=False))) is WriterKind.REPLACES_FILES


def test_removing_only_delete_files_is_no_replacement_of_data():
    # A v3 merge-on-read MERGE replaces a file's DV: the old one removed, a new one against the old file.
    dv = commit(
        change(POSITION, "dv1.puffin", added=False, refers="old.parquet"), change(POSITION, "dv2.puffin", refers="old.parquet")
    )
    assert classify(dv) is WriterKind.DELETES_IN_PLACE


@pytest.mark.parametrize(
    ("summary", "kind"),
    [
        ({"added-data-files": "3"}, WriterKind.APPENDS),
        (
            {"added-data-files": "1", "added-equality-delete-files": "1", "added-position-delete-files": "1"},
            WriterKind.EQUALITY_DELETES,
        ),
        ({"added-data-files": "1", "added-position-delete-files": "2"}, WriterKind.DELETES_IN_PLACE),
        ({"added-dvs": "2"}, WriterKind.DELETES_IN_PLACE),
        ({"added-data-files": "2", "deleted-data-files": "2"}, WriterKind.REPLACES_FILES),
        ({}, WriterKind.APPENDS),
    ],
)
def test_a_summary_alone_tells_the_kind_of_a_commit_made_before_the_watch(summary: dict[str, str], kind: WriterKind):
    assert classify_counts(SummaryCounts.from_summary(summary)) is kind


def test_the_most_demanding_kind_is_kept():
    assert most_demanding([]) is None
    assert (
        most_demanding([WriterKind.APPENDS, WriterKind.DELETES_IN_PLACE, WriterKind.EQUALITY_DELETES])
        is WriterKind.DELETES_IN_PLACE
    )
    assert most_demanding([WriterKind.APPENDS], WriterKind.REPLACES_FILES) is WriterKind.REPLACES_FILES


# ---- the commit event a found commit becomes ----


def test_a_found_commit_becomes_the_commit_event_of_its_partitions():
    found = commit(
        change(DATA, "a.parquet", region="eu"),
        change(DATA, "b.parquet", region="eu"),
        change(EQUALITY, "eq.parquet", region="us"),
        change(DATA, "gone.parquet", region="ap", added=False),
        FileChange(DATA, True, "old-spec.parquet", {}, None, 7, 10, 1000),
        sequence_number=9,
        at_ms=12_345,
    )
    event = commit_event(found)
    assert (event.table, event.snapshot_id, event.parent_snapshot_id) == ("db.kept", 2, 1)
    assert (event.sequence_number, event.commit_time_ms, event.writer) == (9, 12_345, FOUND_WRITER)
    by_path = {d.partition_path: d for d in event.partitions}
    assert sorted(by_path) == ["region=ap", "region=eu", "region=us"]  # the removal touched ap; the old spec's file no partition
    assert (by_path["region=eu"].data_files, by_path["region=eu"].data_bytes, by_path["region=eu"].data_records) == (2, 2000, 20)
    assert (by_path["region=us"].equality_delete_files, by_path["region=us"].equality_delete_records) == (1, 10)
    assert by_path["region=ap"].data_files == 0
    assert touched_partitions(found) == {"region=ap", "region=eu", "region=us"}
    assert CommitEvent.from_json(event.to_json()) == event  # a valid commit event by its schema


def test_only_removals_and_position_deletes_need_the_metadata_read_after_the_event():
    assert told_by_event(commit(change(DATA, "a.parquet"), change(EQUALITY, "eq.parquet")))
    assert not told_by_event(commit(change(DATA, "a.parquet"), change(POSITION, "pos.parquet", refers="a.parquet")))
    assert not told_by_event(commit(change(DATA, "old.parquet", added=False)))


# ---- the snapshots a poll reads ----


def links(*chain: tuple[int, int | None], ours: tuple[int, ...] = ()) -> dict[int, SnapshotLink]:
    return {s: SnapshotLink(s, parent, s in ours) for s, parent in chain}


def test_a_poll_reads_the_snapshots_since_the_last_seen_oldest_first():
    history = links((1, None), (2, 1), (3, 2), (4, 3))
    assert new_snapshots(history, 4, 2) == [3, 4]
    assert new_snapshots(history, 4, 4) == []
    assert new_snapshots(history, None, 2) == []


def test_a_last_seen_snapshot_no_longer_in_the_history_gives_the_retained_ones():
    expired = links((3, 2), (4, 3))  # 1 and 2 expired
    assert new_snapshots(expired, 4, 1) == [3, 4]


# ---- what the sidecar may do beside each kind ----


def test_only_writers_that_name_no_file_let_the_sidecar_work_on_hot_partitions():
    assert beside_writer(None) == beside_writer(WriterKind.APPENDS) == beside_writer(WriterKind.EQUALITY_DELETES)
    assert beside_writer(WriterKind.APPENDS).hot_work and beside_writer(WriterKind.APPENDS).commit_after_writer
    for kind in (WriterKind.DELETES_IN_PLACE, WriterKind.REPLACES_FILES):
        rules = beside_writer(kind)
        assert not rules.hot_work and not rules.commit_after_writer


def writing(tracker: PartitionTracker, table: str, times: list[float], stats: PartitionStats) -> None:
    """A partition written at ``times`` (found commits), holding ``stats`` by its metadata."""
    for i, at in enumerate(times, start=1):
        eu = PartitionDelta({"region": "eu"}, "region=eu", 0, data_files=1)
        tracker.on_commit(CommitEvent(table, i, i - 1, i, int(at * 1000), "overwrite", FOUND_WRITER, None, {}, [eu]))
    tracker.on_metadata(table, len(times), {"region=eu": PartitionMetadata({"region": "eu"}, stats, times[-1], None)})


# Over the hot ceiling (4 delete files) and holding many small files: today's rules work on it hot.
BUSY = PartitionStats(
    data_files=20,
    data_bytes=20 * MB,
    records=20_000,
    small_files=20,
    small_bytes=20 * MB,
    position_delete_files=8,
    position_delete_records=80,
)


@pytest.mark.parametrize("kind", [WriterKind.DELETES_IN_PLACE, WriterKind.REPLACES_FILES])
def test_a_hot_partition_of_a_writer_that_names_files_gets_no_work_even_past_its_ceiling(kind: WriterKind):
    tracker = PartitionTracker(SETTINGS)
    writing(tracker, "db.kept", [100.0, 102.0, 104.0], BUSY)
    tracker.on_writer("db.kept", [kind])
    assert tracker.candidates(105.0) == []
    assert [p.path for p in tracker.waiting(105.0)] == ["region=eu"]  # its work waits for it to settle
    settled = tracker.candidates(104.0 + 10 + 1)  # settle window: 3 x 2 s, at least 10 s
    assert [(c.partition_path, c.work, c.hot) for c in settled] == [("region=eu", Work.DELETE_MERGE, False)]


@pytest.mark.parametrize("kind", [None, WriterKind.APPENDS, WriterKind.EQUALITY_DELETES])
def test_a_hot_partition_of_an_appending_or_equality_delete_writer_keeps_todays_work(kind: WriterKind | None):
    tracker = PartitionTracker(SETTINGS)
    writing(tracker, "db.kept", [100.0, 102.0, 104.0], BUSY)
    if kind is not None:
        tracker.on_writer("db.kept", [kind])
    assert [(c.work, c.hot) for c in tracker.candidates(105.0)] == [(Work.DELETE_MERGE, True)]


def test_a_table_remembers_its_writers_most_demanding_commit():
    tracker = PartitionTracker(SETTINGS)
    tracker.on_writer("db.kept", [WriterKind.APPENDS])
    tracker.on_writer("db.kept", [WriterKind.DELETES_IN_PLACE])
    tracker.on_writer("db.kept", [WriterKind.APPENDS])
    tracker.on_writer("db.kept", [])
    assert tracker.writer_kind("db.kept") is WriterKind.DELETES_IN_PLACE
    assert tracker.writer_kind("db.other") is None


def watched(*seen: SeenSnapshot, watched_from: int = 10) -> WatchedTable:
    table = WatchedTable(watched_from=watched_from)
    for snapshot in seen:
        table.remember(snapshot)
    return table


def test_the_writer_guard_sees_a_commit_to_the_jobs_partitions_and_ignores_the_others():
    table = watched(
        SeenSnapshot(11, 111, False, frozenset({"region=eu"})), SeenSnapshot(12, 112, False, frozenset({"region=us"}))
    )
    assert table.writer_wrote(10, ["region=us"])
    assert not table.writer_wrote(10, ["region=ap"])
    assert not table.writer_wrote(12, ["region=us"])  # committed before the job started


def test_the_writer_guard_cannot_vouch_for_what_it_did_not_read():
    assert watched(watched_from=12).writer_wrote(11, ["region=eu"])  # the watch began after the job
    unread = watched(SeenSnapshot(11, 111, False, None))  # the table's layout was not known yet
    assert unread.writer_wrote(10, ["region=eu"])
    forgetful = watched(
        *(SeenSnapshot(11 + n, 111 + n, False, frozenset({"region=us"})) for n in range(REMEMBERED_SNAPSHOTS + 1))
    )
    assert forgetful.writer_wrote(10, ["region=eu"])  # the oldest commits after the start are forgotten
    assert not forgetful.writer_wrote(12, ["region=eu"])


def test_a_commit_validates_from_the_newest_writer_snapshot_before_any_of_the_sidecars():
    writer = [SeenSnapshot(11, 111, False, frozenset({"region=us"})), SeenSnapshot(12, 112, False, frozenset({"region=ap"}))]
    assert watched(*writer).checked_through(10) == 112
    assert watched(*writer).checked_through(11) == 112
    assert watched(*writer).checked_through(12) is None  # nothing landed since the start: validate from it
    # A sidecar commit (another slot's global resolution) may have added deletes to the job's files.
    ours = SeenSnapshot(13, 113, True)
    assert watched(writer[0], ours, writer[1]).checked_through(10) == 111
    assert watched(ours, *writer).checked_through(10) is None
    assert watched(*writer, watched_from=11).checked_through(10) is None
