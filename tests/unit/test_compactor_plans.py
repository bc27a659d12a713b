"""Hot-partition plans, without Spark: which files a conversion, a fresh-file pack or a delete
merge touches, and which delete files each may remove, by the spec's sequence-number rules."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecdc.compactor.plans import (
    PartitionFiles,
    RewritePlan,
    keep_deletes_of_unchanged,
    plan_conversion,
    plan_fresh_pack,
    plan_hot,
    plan_resolution,
    plan_together,
    read_cost_after,
)
from icecdc.compactor.policy import Work
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.runtime.config import CompactorConfig
from icecdc.runtime.puffin import puffin_bytes

EQUALITY, POSITION = DataFileContent.EQUALITY_DELETES, DataFileContent.POSITION_DELETES
MB = 1024 * 1024
SETTINGS = CompactorConfig(target_file_size_bytes=128 * MB, min_small_files=4, hot_read_budget=6)


def eq(name: str, seq: int) -> LiveDeleteFile:
    return LiveDeleteFile(name, EQUALITY, 10, 1000, data_sequence_number=seq)


def pos(name: str, seq: int, of: str | None) -> LiveDeleteFile:
    return LiveDeleteFile(name, POSITION, 10, 1000, data_sequence_number=seq, referenced_data_file=of)


def batches(n: int, size_mb: float = 1) -> PartitionFiles:
    """What ``n`` writer batches leave: one data file and one equality-delete file each."""
    return PartitionFiles.of(
        [LiveDataFile(f"d{i}", int(size_mb * MB), 1000, i) for i in range(1, n + 1)], [eq(f"e{i}", i) for i in range(1, n + 1)]
    )


def test_conversion_covers_every_file_an_equality_delete_applies_to():
    files = batches(4)
    plan = plan_conversion(files)
    assert plan.work is Work.CONVERT and plan.rewrite == ()
    assert plan.convert == ("d1", "d2", "d3")  # d4 is newest: no equality delete is newer than it
    # e1 applies to nothing (its own batch's file is not older); e2..e4 apply only to converted files.
    assert set(plan.remove_deletes) == {"e1", "e2", "e3", "e4"}


def test_an_equality_delete_stays_while_a_file_it_applies_to_is_not_converted():
    files = batches(3)
    partial = keep_deletes_of_unchanged(plan_conversion(files), files, ())
    assert "e3" in partial.remove_deletes
    # A file whose conversion is refused (not in the plan) keeps the deletes that apply to it.
    manual = PartitionFiles(files.data[:1], files.deletes)
    assert plan_conversion(manual).remove_deletes == ("e1", "e2", "e3")  # d1 is the only older file
    mixed = PartitionFiles.of(
        [LiveDataFile("d1", MB, 1000, 1), LiveDataFile("late", MB, 1000, 1)],
        [eq("e2", 2)],
    )
    assert plan_conversion(mixed).convert == ("d1", "late") and plan_conversion(mixed).remove_deletes == ("e2",)


def test_file_scoped_position_deletes_are_replaced_and_shared_ones_kept():
    files = PartitionFiles.of(
        [LiveDataFile("d1", MB, 1000, 1), LiveDataFile("d2", MB, 1000, 1)],
        [eq("e3", 3), pos("p-d1", 2, "d1"), pos("p-shared", 2, None)],
    )
    plan = plan_conversion(files)
    assert set(plan.remove_deletes) == {"p-d1", "e3"}
    # d1's equality deletes matched no row it still held: nothing new written, its deletes stay.
    kept = keep_deletes_of_unchanged(plan, files, {"d1"})
    assert set(kept.remove_deletes) == {"e3"}


def test_read_cost_after_a_conversion_counts_one_position_file_per_converted_file():
    files = batches(5)
    assert read_cost_after(files, plan_conversion(files), SETTINGS) == 5 + 4


def test_a_hot_partition_gets_a_conversion_when_that_is_within_budget():
    files = batches(3)  # cost 12, budget 6: converting leaves 3 + 2
    assert plan_hot(files, SETTINGS).work is Work.CONVERT


def test_past_what_a_conversion_fixes_the_fresh_files_are_packed():
    # One packed file from earlier, then the writer's batch files: converting leaves 1 + 8 data
    # files and their position deletes, over budget; packing the fresh ones leaves two files.
    files = PartitionFiles.of(
        [LiveDataFile("packed", 40 * MB, 100_000, 1), *(LiveDataFile(f"d{i}", MB, 1000, i) for i in range(2, 10))],
        [eq(f"e{i}", i) for i in range(2, 10)],
    )
    plan = plan_hot(files, SETTINGS)
    assert plan.work is Work.DELETE_MERGE
    assert set(plan.rewrite) == {f"d{i}" for i in range(2, 10)} and plan.convert == ("packed",)
    assert set(plan.remove_deletes) == {f"e{i}" for i in range(2, 10)}
    assert read_cost_after(files, plan, SETTINGS) <= 6
    assert plan_fresh_pack(batches(1), SETTINGS) is None


def test_when_nothing_cheaper_fits_a_hot_partition_gets_a_full_delete_merge():
    files = batches(40)  # all alike: nothing is "fresh", conversion leaves 40 + 39
    plan = plan_hot(files, SETTINGS)
    assert plan.work is Work.DELETE_MERGE and len(plan.rewrite) == 40


def test_a_plan_that_converts_nothing_is_empty():
    assert plan_conversion(batches(1)).convert == ()
    assert RewritePlan(Work.CONVERT).empty


def test_a_deletion_vector_round_trips_through_pyiceberg():
    from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
    from pyiceberg.table.puffin import PuffinFile

    positions = [0, 5, 70_000, 2**32 + 3]  # two Roaring containers and a second 32-bit bitmap
    content, offset, length = puffin_bytes("s3://b/d1.parquet", pa.array(positions, pa.int64()))
    assert content[:4] == b"PFA1" and content[-4:] == b"PFA1" and offset == 4 and length > 12
    [vector] = deletion_vectors_from_puffin_file(PuffinFile(content))
    assert vector.referenced_data_file == "s3://b/d1.parquet"
    assert vector.to_vector().to_pylist() == positions


def test_a_resolution_converts_the_files_global_deletes_hit_and_removes_them_all():
    # Three data files in any partitions (sequence numbers 1, 2, 5), global deletes of batches 3
    # and 4, and the file-scoped position deletes of d1.
    data = [LiveDataFile("d1", MB, 1000, 1), LiveDataFile("d2", MB, 1000, 2), LiveDataFile("d5", MB, 1000, 5)]
    deletes = [eq("g3", 3), eq("g4", 4), pos("p-d1", 2, "d1")]
    files = PartitionFiles.of(data, deletes, may_match=["d1", "d5"])  # d2's key bounds admit no deleted key
    plan = plan_resolution(files)
    assert plan.work is Work.RESOLVE_GLOBAL_DELETES
    assert plan.convert == ("d1",)  # d5 is newer than every global delete
    assert plan.examined == ("d1", "d2")  # d2 must still exist when the deletes that applied to it go
    assert set(plan.remove_deletes) == {"g3", "g4", "p-d1"}
    # d1 held none of the keys: its own position deletes stay, the global deletes go all the same.
    assert set(keep_deletes_of_unchanged(plan, files, {"d1"}).remove_deletes) == {"g3", "g4"}


def test_a_resolution_with_nothing_to_convert_still_removes_the_global_deletes():
    files = PartitionFiles.of([LiveDataFile("d1", MB, 1000, 1)], [eq("g2", 2)], may_match=[])
    plan = plan_resolution(files)
    assert plan.convert == () and plan.examined == ("d1",) and plan.remove_deletes == ("g2",) and not plan.empty


def test_a_job_of_several_partitions_commits_every_plan_side_by_side():
    merge = RewritePlan(Work.DELETE_MERGE, ("a1", "a2"), ("a3",), ("ea",), ("a4",))
    minor = RewritePlan(Work.MINOR, ("b1", "b2"))
    together = plan_together([merge, minor, RewritePlan(Work.MINOR)])
    assert together == RewritePlan(Work.DELETE_MERGE, ("a1", "a2", "b1", "b2"), ("a3",), ("ea",), ("a4",))
    assert plan_together([minor, minor]).work is Work.MINOR
    assert plan_together([merge]) is merge


def test_conversions_are_never_committed_together():
    conversion = RewritePlan(Work.CONVERT, convert=("a1",), remove_deletes=("ea",))
    with pytest.raises(ValueError, match="one partition at a time"):
        plan_together([conversion, RewritePlan(Work.MINOR, ("b1", "b2"))])
