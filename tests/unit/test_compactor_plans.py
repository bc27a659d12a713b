"""Hot-partition plans, without Spark: which files a conversion, a tiered pack or a delete
merge touches, and which delete files each may remove, by the spec's sequence-number rules."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecdc.compactor.plans import (
    PartitionFiles,
    RewritePlan,
    keep_deletes_of_unchanged,
    next_tier_worth_packing,
    pack_tier,
    plan_conversion,
    plan_hot,
    plan_resolution,
    plan_tier_pack,
    plan_together,
    read_cost_after,
)
from icecdc.compactor.policy import OPEN_FILE_COST_BYTES, Work, budget_for_bytes
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.runtime.config import CompactorConfig
from icecdc.runtime.puffin import puffin_bytes

EQUALITY, POSITION = DataFileContent.EQUALITY_DELETES, DataFileContent.POSITION_DELETES
KB, MB = 1024, 1024 * 1024
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
    # Five data files, four position-delete files, and 5 MB read.
    assert read_cost_after(files, plan_conversion(files), SETTINGS) == 5 + 4 + 5 * MB / OPEN_FILE_COST_BYTES


def test_a_hot_partition_gets_a_conversion_when_that_is_within_budget():
    files = batches(3, size_mb=0.01)  # cost 12, budget 6: converting leaves 3 + 2
    assert plan_hot(files, SETTINGS).work is Work.CONVERT


def test_tiers_go_up_by_the_fan_in():
    assert [pack_tier(s) for s in (1, 4 * KB, 63 * KB, 64 * KB, 255 * KB, 256 * KB, MB, 40 * MB)] == [0, 1, 2, 3, 3, 4, 5, 7]


def test_past_what_a_conversion_fixes_the_lowest_tier_is_packed_and_larger_files_are_left():
    # An earlier pack of 3 MB and the writer's batch files of a few KB: converting leaves 1 + 8
    # data files and their position deletes, over budget; packing the batch files alone fits.
    files = PartitionFiles.of(
        [LiveDataFile("packed", 3 * MB, 100_000, 1), *(LiveDataFile(f"d{i}", 20 * KB, 1000, i) for i in range(2, 10))],
        [eq(f"e{i}", i) for i in range(2, 10)],
    )
    plan = plan_hot(files, SETTINGS)
    assert plan.work is Work.DELETE_MERGE
    assert set(plan.rewrite) == {f"d{i}" for i in range(2, 10)} and plan.convert == ("packed",)
    assert set(plan.remove_deletes) == {f"e{i}" for i in range(2, 10)}
    assert read_cost_after(files, plan, SETTINGS) <= budget_for_bytes(3 * MB + 8 * 20 * KB, SETTINGS)
    assert plan_tier_pack(batches(1), SETTINGS, budget=0) is None


def test_on_format_v3_the_pack_leaves_the_rest_to_the_conversion_and_is_judged_as_if_it_had_run():
    files = PartitionFiles.of(
        [LiveDataFile("base", 300 * KB, 10_000, 1), LiveDataFile("d2", 12 * KB, 100, 2), LiveDataFile("d3", 12 * KB, 100, 3)],
        [eq("e2", 2), eq("e3", 3)],
    )
    settings = CompactorConfig(target_file_size_bytes=128 * MB)
    budget = budget_for_bytes(324 * KB, settings)
    v2, v3 = plan_tier_pack(files, settings, budget), plan_tier_pack(files, settings, budget, deletion_vectors=True)
    assert v2 is not None and v3 is not None
    assert set(v2.rewrite) == set(v3.rewrite) == {"d2", "d3"}  # not the base: a full rewrite every batch
    assert v2.convert == ("base",) and v3.convert == ()
    assert "e3" in v2.remove_deletes and "e3" not in v3.remove_deletes  # still applies to the base on v3


def test_a_higher_tier_joins_the_pack_only_when_the_lower_ones_do_not_fit():
    files = PartitionFiles.of(
        [
            LiveDataFile("base", 30 * MB, 100_000, 1),
            LiveDataFile("mid-a", 300 * KB, 1000, 2),
            LiveDataFile("mid-b", 300 * KB, 1000, 3),
            *(LiveDataFile(f"d{i}", 20 * KB, 1000, i) for i in range(4, 7)),
        ],
        [],
    )
    data_bytes = sum(f.size for f in files.data)
    lowest = plan_tier_pack(files, SETTINGS, budget=4 + data_bytes / OPEN_FILE_COST_BYTES)
    assert lowest is not None and set(lowest.rewrite) == {"d4", "d5", "d6"}
    next_tier = plan_tier_pack(files, SETTINGS, budget=2 + data_bytes / OPEN_FILE_COST_BYTES)
    assert next_tier is not None and set(next_tier.rewrite) == {"d4", "d5", "d6", "mid-a", "mid-b"}
    assert plan_tier_pack(files, SETTINGS, budget=data_bytes / OPEN_FILE_COST_BYTES) is None


def test_when_nothing_cheaper_fits_a_hot_partition_gets_a_full_delete_merge():
    files = batches(40)  # all alike and over budget however they are packed short of all of them
    plan = plan_hot(files, CompactorConfig(target_file_size_bytes=128 * MB, hot_read_budget=1))
    assert plan.work is Work.DELETE_MERGE and len(plan.rewrite) == 40


def stream_into_one_partition(
    partition_bytes: int, batches: int, settings: CompactorConfig, batch_bytes: int = 25 * KB
) -> tuple[int, int]:
    """Batches of ``batch_bytes`` into one partition of ``partition_bytes``, each one data file and one
    equality-delete file, with ``plan_hot``'s plan committed whenever the read cost is over budget
    and then, as the portability target does, the rest converted: the bytes the writer wrote and
    the bytes the plans rewrote. Checks that every plan brings the partition within its budget.
    Pessimistic on purpose: every equality delete is taken to hit every older file."""
    data = {"base": (partition_bytes, 1)}  # path -> (size, data sequence number)
    deletes: list[LiveDeleteFile] = []
    written = rewritten = 0

    def listing() -> PartitionFiles:
        return PartitionFiles.of([LiveDataFile(p, size, 1000, seq) for p, (size, seq) in data.items()], deletes)

    def commit(plan: RewritePlan, seq: int) -> None:
        nonlocal deletes
        packed = sum(data[p][0] for p in plan.rewrite)
        for p in plan.rewrite:
            del data[p]
        if plan.rewrite:
            data[f"pack{seq}"] = (packed, seq)
        deletes = [d for d in deletes if d.path not in plan.remove_deletes and d.referenced_data_file not in plan.convert]
        deletes += [pos(f"p-{p}-{seq}", seq, p) for p in plan.convert]

    for seq in range(2, batches + 2):
        data[f"d{seq}"] = (batch_bytes, seq)
        deletes.append(eq(f"e{seq}", seq))
        written += batch_bytes
        files = listing()
        budget = budget_for_bytes(sum(size for size, _ in data.values()), settings)
        if read_cost_after(files, RewritePlan(Work.CONVERT), settings) > budget:
            plan = plan_hot(files, settings)
            assert read_cost_after(files, plan, settings) <= budget
            rewritten += sum(f.size for f in files.data if f.path in plan.rewrite)
            commit(plan, seq)
        commit(plan_conversion(listing()), seq)
    return written, rewritten


@pytest.mark.parametrize("partition_mb", [35, 100, 300])
def test_small_batches_into_a_large_partition_are_rewritten_a_few_times_not_every_batch(partition_mb):
    # Packing everything under a quarter of the largest file, as before, rewrote 12-50 times the
    # bytes written here (its last pack with every batch); in tiers about once per tier climbed.
    written, rewritten = stream_into_one_partition(partition_mb * MB, 100, CompactorConfig(target_file_size_bytes=128 * MB))
    assert rewritten <= 2 * written  # a write amplification of at most 3


DEFAULTS = CompactorConfig(target_file_size_bytes=128 * MB)


def one_slot(pack_kb: int, budget_slack: float = 0.0, base_kb: int = 80) -> tuple[PartitionFiles, float]:
    """A partition of a few hundred KB on the default budget: a base with position deletes, the
    last pack, and the newest batch's file, whose equality deletes hit both."""
    files = PartitionFiles.of(
        [
            LiveDataFile("base", base_kb * KB, 4000, 1),
            LiveDataFile("pack", pack_kb * KB, 500, 5),
            LiveDataFile("d6", 5 * KB, 300, 6),
        ],
        [pos("p-base", 5, "base"), eq("e6", 6)],
    )
    return files, budget_for_bytes(sum(f.size for f in files.data), DEFAULTS) + budget_slack


@pytest.mark.parametrize(
    ("pack_kb", "slack", "packed"),
    [
        (15, 0.0, {"pack", "d6"}),  # 20 KB packed, rent 20^2 < 2 x 80 x 5: the base stays
        (30, 0.0, {"base", "pack", "d6"}),  # 35^2 >= 2 x 80 x 5: the base joins
        (30, 2.0, {"pack", "d6"}),  # room for the next batch: the pack is not repacked, no rent
    ],
)
def test_a_pack_each_batch_repacks_takes_the_next_tier_once_its_rent_is_paid(pack_kb, slack, packed):
    files, budget = one_slot(pack_kb, slack)
    plan = plan_tier_pack(files, DEFAULTS, budget)
    assert plan is not None and set(plan.rewrite) == packed


def test_a_base_of_a_few_dozen_kb_is_not_packed_with_every_batch():
    # All under 64 KB, the tier floor before: one tier, so every pack took the base along, a
    # whole-partition rewrite each batch. Now the base waits for the rent: the pack and the
    # batch's file, 15 KB, have not paid it (15^2 < 2 x 54 x 5).
    files, budget = one_slot(10, base_kb=54)
    plan = plan_tier_pack(files, DEFAULTS, budget)
    assert plan is not None and set(plan.rewrite) == {"pack", "d6"}


def test_the_rent_is_the_bytes_a_pack_grown_a_batch_at_a_time_has_rewritten():
    assert not next_tier_worth_packing(27 * KB, 80 * KB, 5 * KB) and next_tier_worth_packing(29 * KB, 80 * KB, 5 * KB)


@pytest.mark.parametrize(("batches", "before"), [(72, 12.0), (200, 24.0)])
def test_small_batches_into_a_partition_of_a_few_hundred_kb_are_not_repacked_up_to_a_tier_floor(batches, before):
    # One slot in the budget (a base and its position deletes take two of three opens): packing by
    # tiers alone repacked the slot with every batch up to the next tier's floor, 12 and 24 times
    # the bytes written here (``before``); with the rent rule about 9 and 14 in this pessimistic model
    # (every delete hits every older file, nothing shrinks).
    written, rewritten = stream_into_one_partition(80 * KB, batches, DEFAULTS, 5 * KB)
    assert rewritten <= 0.8 * before * written


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


def test_conversions_are_committed_together_only_with_conversions():
    conversion = RewritePlan(Work.CONVERT, convert=("a1",), remove_deletes=("ea",))
    other = RewritePlan(Work.CONVERT, convert=("b1",), remove_deletes=("eb", "pb"))
    assert plan_together([conversion, other, RewritePlan(Work.CONVERT)]) == RewritePlan(
        Work.CONVERT, convert=("a1", "b1"), remove_deletes=("ea", "eb", "pb")
    )
    resolution = RewritePlan(Work.RESOLVE_GLOBAL_DELETES, convert=("b1",), remove_deletes=("g",))
    pack = RewritePlan(Work.DELETE_MERGE, ("b1", "b2"), remove_deletes=("eb",))
    with pytest.raises(ValueError, match="only with conversions"):
        plan_together([conversion, resolution])
    with pytest.raises(ValueError, match="only with conversions"):
        plan_together([conversion, pack], deletion_vectors=True)
    # On format v2 the rewrite's commit carries the conversion's position deletes.
    assert plan_together([conversion, pack]) == RewritePlan(
        Work.DELETE_MERGE, ("b1", "b2"), convert=("a1",), remove_deletes=("ea", "eb")
    )
