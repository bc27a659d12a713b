"""The compaction policy, in one place and free of I/O: what a partition needs (from its file
statistics), which partition goes first (expected benefit over cost), and, file by file, what a
compaction of one partition rewrites, converts and removes.

Read cost is counted in file opens for one full scan: every data file is opened once, and every
delete file is opened again for each data file it may apply to. That is what equality deletes
cost Spark and Trino readers, and it is what compaction buys back. A fully compacted partition
costs ceil(bytes / target) opens.

The policy has a fixed point: after a compaction, the partition has at most one small file, no
equality deletes older than the compaction, and only position deletes on large files that carry
few deleted rows; ``needed_work`` finds nothing in that state, and ``plan_rewrite`` plans nothing.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.config import CompactorConfig
from icecdc.files import DataFileContent, LiveDataFile, LiveDeleteFile

MIB = 1024 * 1024
# Every compaction costs a commit and a Spark job, whatever its size: the cost of a tiny
# compaction is not zero, or it would always rank first.
FIXED_COST_BYTES = 4 * MIB


class Work(enum.Enum):
    MINOR = "minor"
    DELETE_MERGE = "delete-merge"
    REMOVE_DANGLING_DELETES = "remove-dangling-deletes"


@dataclass(frozen=True)
class PartitionStats:
    """Live files of one partition, summed from table metadata."""

    data_files: int = 0
    data_bytes: int = 0
    records: int = 0
    small_files: int = 0
    small_bytes: int = 0
    # Neither small nor large: rewritten when deletes apply to them.
    medium_files: int = 0
    medium_bytes: int = 0
    equality_delete_files: int = 0
    equality_delete_records: int = 0
    position_delete_files: int = 0
    position_delete_records: int = 0

    @property
    def delete_files(self) -> int:
        return self.equality_delete_files + self.position_delete_files


def read_cost(stats: PartitionStats) -> int:
    return stats.data_files * (1 + stats.delete_files)


def ideal_read_cost(stats: PartitionStats, settings: CompactorConfig) -> int:
    return max(1, math.ceil(stats.data_bytes / settings.target_file_size_bytes)) if stats.data_files else 0


def needed_work(stats: PartitionStats, settings: CompactorConfig) -> tuple[Work, str] | None:
    """What a partition needs, with the reason, or None when it is healthy."""
    if stats.equality_delete_files:
        return Work.DELETE_MERGE, f"{stats.equality_delete_files} equality-delete files"
    if stats.records and stats.position_delete_records >= settings.position_delete_rewrite_ratio * stats.records:
        return Work.DELETE_MERGE, f"{stats.position_delete_records} of {stats.records} rows deleted by position"
    if stats.small_files >= settings.min_small_files:
        return Work.MINOR, f"{stats.small_files} small files"
    if stats.position_delete_files and not stats.data_files:
        return Work.REMOVE_DANGLING_DELETES, f"{stats.position_delete_files} position-delete files and no data"
    return None


def over_hot_ceiling(stats: PartitionStats, settings: CompactorConfig) -> bool:
    return stats.delete_files >= settings.hot_max_delete_files or stats.small_files >= settings.hot_max_small_files


def benefit_and_cost(stats: PartitionStats, work: Work, settings: CompactorConfig) -> tuple[float, float]:
    """Read cost removed (file opens) and bytes rewritten, both estimated from the statistics."""
    target = settings.target_file_size_bytes
    large_files = stats.data_files - stats.small_files - stats.medium_files
    if work is Work.MINOR:
        files_after = large_files + stats.medium_files + math.ceil(stats.small_bytes / target)
        after = files_after * (1 + stats.delete_files)
        rewritten = stats.small_bytes
    else:
        rewritten_bytes = stats.small_bytes + stats.medium_bytes
        files_after = large_files + math.ceil(rewritten_bytes / target)
        # Large files keep at most one position-delete file each.
        after = files_after + min(large_files, stats.delete_files) * files_after
        rewritten = rewritten_bytes
    return max(0.0, read_cost(stats) - after), float(rewritten + FIXED_COST_BYTES)


@dataclass(frozen=True)
class Candidate:
    table: str
    partition_path: str
    work: Work
    reason: str
    benefit: float
    cost: float

    @property
    def priority(self) -> float:
        return self.benefit / self.cost


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Most read cost removed per byte rewritten first; ties go to the bigger benefit."""
    return sorted(candidates, key=lambda c: (-c.priority, -c.benefit, c.table, c.partition_path))


# ---- one partition, file by file ---------------------------------------------------------------


@dataclass(frozen=True)
class DataFileFacts:
    path: str
    size: int
    records: int
    data_sequence_number: int
    # Paths of the delete files that apply to this file (same partition, higher sequence number).
    equality_deletes: tuple[str, ...] = ()
    position_deletes: tuple[str, ...] = ()


def applying_deletes(
    path: str, data_sequence_number: int, deletes: tuple[LiveDeleteFile, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The equality and position deletes of the same partition that apply to one data file, by
    the spec's sequence-number rules: an equality delete applies to files with a strictly lower
    data sequence number, a position delete to files with a lower or equal one (and only to the
    file it names, when it names one)."""
    equality = tuple(d.path for d in deletes if d.is_equality and d.data_sequence_number > data_sequence_number)
    position = tuple(
        d.path
        for d in deletes
        if d.content is DataFileContent.POSITION_DELETES
        and d.data_sequence_number >= data_sequence_number
        and d.referenced_data_file in (None, path)
    )
    return equality, position


@dataclass(frozen=True)
class PartitionFiles:
    """A partition's live files at one snapshot, each data file with the deletes that apply to it."""

    data: tuple[DataFileFacts, ...]
    deletes: tuple[LiveDeleteFile, ...]

    @classmethod
    def of(cls, data: Iterable[LiveDataFile], deletes: Iterable[LiveDeleteFile]) -> PartitionFiles:
        """From a listing: which deletes apply to which file is computed from sequence numbers,
        not read from each scan task (one call per file instead of one per (file, delete) pair)."""
        deletes = tuple(deletes)
        return cls(
            tuple(
                DataFileFacts(
                    f.path, f.size, f.records, f.data_sequence_number, *applying_deletes(f.path, f.data_sequence_number, deletes)
                )
                for f in data
            ),
            deletes,
        )


@dataclass(frozen=True)
class RewritePlan:
    work: Work
    rewrite: tuple[str, ...] = ()  # data files rewritten with their deletes applied
    convert: tuple[str, ...] = ()  # large data files whose equality deletes become position deletes
    remove_deletes: tuple[str, ...] = ()  # delete files that apply to nothing once this commits

    @property
    def empty(self) -> bool:
        return not (self.rewrite or self.convert or self.remove_deletes)


def plan_rewrite(files: PartitionFiles, work: Work, settings: CompactorConfig) -> RewritePlan:
    """The files one compaction of this partition touches."""
    small = [f for f in files.data if size_class(f.size, settings) is SizeClass.SMALL]
    large = [f for f in files.data if size_class(f.size, settings) is SizeClass.LARGE]
    deletes_by_path = {d.path: d for d in files.deletes}

    def deleted_share(f: DataFileFacts) -> float:
        # Our position-delete files are one per data file, so their record count is exact; a
        # foreign one covering several files makes this an upper bound (rewrite sooner).
        deleted = sum(deletes_by_path[p].records for p in f.position_deletes if p in deletes_by_path)
        return deleted / f.records if f.records else 1.0

    rewrite: list[DataFileFacts] = []
    convert: list[DataFileFacts] = []
    if work is Work.MINOR:
        if len(small) >= max(2, settings.min_small_files):
            rewrite = small
    elif work is Work.DELETE_MERGE:
        large_paths = {f.path for f in large}
        for f in files.data:
            has_deletes = bool(f.equality_deletes or f.position_deletes)
            if f.path not in large_paths:
                # Small files are packed along with the files deletes force us to rewrite.
                if has_deletes or (size_class(f.size, settings) is SizeClass.SMALL and len(small) > 1):
                    rewrite.append(f)
            elif f.position_deletes and deleted_share(f) >= settings.position_delete_rewrite_ratio:
                rewrite.append(f)
            elif f.equality_deletes:
                convert.append(f)
    touched = {f.path for f in rewrite} | {f.path for f in convert}
    still_needed = {p for f in files.data if f.path not in touched for p in (*f.equality_deletes, *f.position_deletes)}
    remove = tuple(sorted(d.path for d in files.deletes if d.path not in still_needed))
    plan = RewritePlan(work, tuple(f.path for f in rewrite), tuple(f.path for f in convert), remove)
    if not plan.rewrite and not plan.convert and plan.remove_deletes:
        return RewritePlan(Work.REMOVE_DANGLING_DELETES, remove_deletes=plan.remove_deletes)
    return plan
