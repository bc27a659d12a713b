"""The compaction policy, in one place and free of I/O: what a partition needs, from its file
statistics, and which partition goes first (expected benefit over cost). What one compaction
touches, file by file, is ``plans``.

Read cost is counted in file opens for one full scan (docs/compactor.md, "The policy"): one for
every data file and position-delete file, ``EQUALITY_DELETE_WEIGHT`` for every equality-delete
file, and one for every ``OPEN_FILE_COST_BYTES`` of data, so that a small batch file does not
cost as much as a large base. The policy has a fixed point: after a compaction ``needed_work``
finds nothing, and ``plans.plan_rewrite`` plans nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from icecdc.domain.events import CompactionKind
from icecdc.domain.writer_commits import WriterKind
from icecdc.runtime.config import CompactorConfig

MIB = 1024 * 1024
# What an equality-delete file costs a full scan, in data-file opens: a reader builds a set of its
# keys and probes every row of every older data file of the partition against it (measured:
# docs/compactor.md, "The policy").
EQUALITY_DELETE_WEIGHT = 3
# What opening one more file costs a full scan, in bytes read: Iceberg's default
# ``read.split.open-file-cost``. Counting bytes keeps the budget from rewriting a large base for
# every small batch (docs/BENCHMARKS.md, row "Users' partition sizes").
OPEN_FILE_COST_BYTES = 4 * MIB
# Every compaction costs a commit and a Spark job, whatever its size: the cost of a tiny
# compaction is not zero, or it would always rank first.
FIXED_COST_BYTES = 4 * MIB


# A partition's oldest live equality delete gets a conversion (the table's global deletes a
# resolution) once it is this share of ``portable_within_seconds`` old, so that the conversion
# commits within the target. From the delete's commit to the conversion's commit pass: this
# share of the target; the turn that sees it due (the sidecar wakes for the due time, but a job
# already running finishes first); then the conversion itself: a listing, key columns read for
# the partition's files with deletes, one RowDelta through the writer's quiet window (a batch's
# conversion's time is in its event; docs/compactor.md, "Portability"). Half the target for that
# is the margin; waiting at all, rather than converting every batch's deletes as they land, lets one
# conversion (one commit, one file per data file) cover the few batches the writer commits
# meanwhile instead of doubling the table's commits.
PORTABLE_SHARE = 0.5


# What a compaction does: minor, delete-merge, equality-to-position, remove-dangling-deletes,
# resolve-global-deletes. Its compaction event reports it, so the enum lives with the event.
Work = CompactionKind


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


def file_opens(stats: PartitionStats) -> int:
    """The files one full scan opens, an equality-delete file counted ``EQUALITY_DELETE_WEIGHT`` times."""
    return stats.data_files + stats.position_delete_files + EQUALITY_DELETE_WEIGHT * stats.equality_delete_files


def read_cost(stats: PartitionStats) -> float:
    """One full scan's file opens plus its bytes, in opens (the module's docstring)."""
    return file_opens(stats) + stats.data_bytes / OPEN_FILE_COST_BYTES


def ideal_read_cost(stats: PartitionStats, settings: CompactorConfig) -> float:
    return compacted_read_cost(stats.data_bytes, settings) if stats.data_files else 0.0


def compacted_files(data_bytes: int, settings: CompactorConfig) -> int:
    """How many files ``data_bytes`` make compacted: ``ceil(bytes / target)``, at least one."""
    return max(1, math.ceil(data_bytes / settings.target_file_size_bytes))


def compacted_read_cost(data_bytes: int, settings: CompactorConfig) -> float:
    """The read cost of ``data_bytes`` compacted: its files' opens and the bytes themselves."""
    return compacted_files(data_bytes, settings) + data_bytes / OPEN_FILE_COST_BYTES


def read_budget(stats: PartitionStats, settings: CompactorConfig) -> float:
    """What a partition that is still being written may cost a full scan."""
    return budget_for_bytes(stats.data_bytes, settings)


def budget_for_bytes(data_bytes: int, settings: CompactorConfig) -> float:
    """``hot_read_budget`` times the read cost of the same bytes compacted."""
    return settings.hot_read_budget * compacted_read_cost(data_bytes, settings)


@dataclass(frozen=True)
class WriterRules:
    """What the sidecar may do on a table beside the kind of writer that writes it."""

    # Work on partitions still being written: the read budget, its ceiling, conversions.
    hot_work: bool
    # Commit although the writer committed to the job's partitions since its starting snapshot.
    commit_after_writer: bool


def beside_writer(kind: WriterKind | None) -> WriterRules:
    """The one decision on another writer (docs/compactor.md, "Beside other writers"). A writer
    that deletes rows in place or replaces files checks, at its commit, that the data files it
    names are still live, and a rewrite is a ``replace`` that removes them: so no work while it
    writes a partition, and no commit once it has written there again. Appending and
    equality-delete writers name no file: a rewrite at the starting sequence number is safe for
    them at any time. None: no other writer's commit seen (icecdc's ingester writes equality deletes)."""
    if kind is not None and kind >= WriterKind.DELETES_IN_PLACE:
        return WriterRules(hot_work=False, commit_after_writer=False)
    return WriterRules(hot_work=True, commit_after_writer=True)


def hot_work(stats: PartitionStats, settings: CompactorConfig) -> tuple[Work, str] | None:
    """What a partition the writer keeps writing needs: nothing while its read cost is within
    its budget; past it, work chosen file by file (``plans.plan_hot``) to bring it back under.
    Past a hard ceiling, a full delete merge."""
    if over_hot_ceiling(stats, settings):
        work = needed_work(stats, settings)
        return (work[0], f"{work[1]} (hot partition over its ceiling)") if work else None
    cost, budget = read_cost(stats), read_budget(stats, settings)
    if cost <= budget:
        return None
    if not (stats.equality_delete_files or stats.position_delete_files or stats.small_files > 1):
        return None  # nothing cheap would lower it: large files alone are their own ideal
    return Work.CONVERT, f"read cost {cost:.1f} over its budget {budget:.1f} (hot partition)"


def global_work(stats: PartitionStats, oldest_write: float | None, now: float) -> tuple[Work, str] | None:
    """What a table's settled global equality deletes need: resolving, while there are any.
    While the writer writes, the portability target alone calls for their resolution."""
    if not stats.equality_delete_files:
        return None
    age = "" if oldest_write is None else f", the oldest {max(0.0, now - oldest_write):.0f}s old"
    return (
        Work.RESOLVE_GLOBAL_DELETES,
        f"{stats.equality_delete_files} global equality-delete files ({stats.equality_delete_records} keys){age}",
    )


def older_spec_work(stats: PartitionStats) -> tuple[Work, str] | None:
    """What a settled partition of an older spec needs: a rewrite into the current spec, while it
    holds any live file."""
    if not (stats.data_files or stats.delete_files):
        return None
    return (
        Work.REWRITE_OLDER_SPEC,
        f"{stats.data_files} data files and {stats.delete_files} delete files of an older partition spec",
    )


def portability_due(oldest_write: float | None, settings: CompactorConfig) -> float | None:
    """When a partition whose oldest live equality delete was committed at ``oldest_write``
    needs its conversion (None: it has none, as far as this is told)."""
    return None if oldest_write is None else oldest_write + PORTABLE_SHARE * settings.portable_within_seconds


def conversion_margin(settings: CompactorConfig) -> float:
    """What the portability target leaves a conversion once it is due: the rest of the target."""
    return (1 - PORTABLE_SHARE) * settings.portable_within_seconds


def portability_work(
    stats: PartitionStats, oldest_write: float | None, now: float, settings: CompactorConfig, *, is_global: bool = False
) -> tuple[Work, str] | None:
    """What the portability target asks of a partition (or, ``is_global``, of a table's global
    deletes) holding equality deletes, the oldest committed at ``oldest_write``: a conversion
    (a resolution) once that one is ``PORTABLE_SHARE`` of the target old, hot or settled, whatever
    its read budget says. Conversions only: merges and packs stay the read budget's and the settle
    rules'. An equality delete of unknown age (its snapshot expired) is due at once."""
    if not stats.equality_delete_files:
        return None
    due = portability_due(oldest_write, settings)
    if due is not None and now < due:
        return None
    target = settings.portable_within_seconds
    age = "of unknown age" if oldest_write is None else f"{max(0.0, now - oldest_write):.1f}s old"
    work = Work.RESOLVE_GLOBAL_DELETES if is_global else Work.CONVERT
    return work, f"oldest of {stats.equality_delete_files} equality-delete files {age} (portable within {target:g}s)"


def needed_work(stats: PartitionStats, settings: CompactorConfig) -> tuple[Work, str] | None:
    """What a partition needs, with the reason, or None when it is healthy."""
    if stats.equality_delete_files:
        return Work.DELETE_MERGE, f"{stats.equality_delete_files} equality-delete files"
    if stats.records and stats.position_delete_records >= settings.position_delete_rewrite_ratio * stats.records:
        return Work.DELETE_MERGE, f"{stats.position_delete_records} of {stats.records} rows deleted by position"
    if stats.position_delete_files > stats.data_files - stats.small_files - stats.medium_files:
        # Some land on small or medium files (what conversions leave on a partition that was hot):
        # rewriting those is cheap, and a settled partition ends as one file per target size.
        return Work.DELETE_MERGE, f"{stats.position_delete_files} position-delete files on small or medium files"
    medium = (
        f"{stats.medium_files} medium files ({stats.medium_bytes / MIB:.0f} MiB) to pack"
        if medium_files_pack(stats.medium_files, stats.medium_bytes, settings)
        else ""
    )
    if stats.small_files >= settings.min_small_files:
        return Work.MINOR, f"{stats.small_files} small files" + (f" and {medium}" if medium else "")
    if medium:
        return Work.MINOR, medium
    if stats.position_delete_files and not stats.data_files:
        return Work.REMOVE_DANGLING_DELETES, f"{stats.position_delete_files} position-delete files and no data"
    return None


def last_pack(stats: PartitionStats, settings: CompactorConfig) -> tuple[Work, str] | None:
    """What a partition nobody has written for ``last_pack_after_windows`` settle windows needs
    once ``needed_work`` finds nothing: its small files packed, however few (docs/compactor.md,
    "The last pack"); ``plans.plan_rewrite`` plans them with ``last_pack``. Medium files stay under
    the usual rule (``medium_files_pack``): packing them on every return of a writer that pauses
    long would rewrite up to a large file's bytes each time."""
    if stats.small_files < 2:
        return None
    return Work.MINOR, f"last pack of {stats.small_files} small files, settled"


def medium_files_pack(files: int, data_bytes: int, settings: CompactorConfig) -> bool:
    """Whether a partition's medium files are worth packing into target-size ones, deletes or not:
    Amoro's "enough content" for its undersized segment files. Together they make at least one
    target file, and on average two fit in one, so the two smallest do and a pack that takes them
    smallest first (``row_merge.bins``) makes fewer files: each pack leaves fewer medium files, and
    the packs end. Without it a partition of medium files (a bulk load's) stays as it is until
    deletes spread over it, and then the settled rule for position deletes on medium files
    rewrites the whole partition in the middle of the stream (docs/BENCHMARKS.md, row "Users'
    partition sizes"); packed once it settles, its files are large, and later deletes on them stay
    position deletes."""
    target = settings.target_file_size_bytes
    return files >= 2 and target <= data_bytes <= files * target / 2


def over_hot_ceiling(stats: PartitionStats, settings: CompactorConfig) -> bool:
    return stats.delete_files >= settings.hot_max_delete_files or stats.small_files >= settings.hot_max_small_files


def benefit_and_cost(stats: PartitionStats, work: Work, settings: CompactorConfig) -> tuple[float, float]:
    """Read cost removed (file opens) and bytes rewritten, both estimated from the statistics."""
    target = settings.target_file_size_bytes
    large_files = stats.data_files - stats.small_files - stats.medium_files
    if work is Work.RESOLVE_GLOBAL_DELETES:
        # No data rewritten; every read of every partition stops opening them.
        return float(EQUALITY_DELETE_WEIGHT * stats.equality_delete_files), float(FIXED_COST_BYTES)
    if work is Work.REWRITE_OLDER_SPEC:
        # Every byte rewritten, into about one file per target size (of the new spec's partitions).
        after = compacted_files(stats.data_bytes, settings) if stats.data_files else 0
        return max(0.0, file_opens(stats) - after), float(stats.data_bytes + FIXED_COST_BYTES)
    if work is Work.CONVERT:
        # No data rewritten; every data file may end with one position-delete file.
        after = stats.data_files + min(stats.data_files, stats.position_delete_files + stats.equality_delete_records)
        rewritten = 0
    elif work is Work.MINOR:
        packed_files, packed_bytes = stats.small_files, stats.small_bytes
        if medium_files_pack(stats.medium_files, stats.medium_bytes, settings):
            packed_files += stats.medium_files
            packed_bytes += stats.medium_bytes
        files_after = stats.data_files - packed_files + math.ceil(packed_bytes / target)
        after = files_after + stats.position_delete_files + EQUALITY_DELETE_WEIGHT * stats.equality_delete_files
        rewritten = packed_bytes
    else:
        rewritten_bytes = stats.small_bytes + stats.medium_bytes
        files_after = large_files + math.ceil(rewritten_bytes / target)
        # Large files keep at most one position-delete file each.
        after = files_after + min(large_files, stats.delete_files)
        rewritten = rewritten_bytes
    # The bytes read stay (less the deleted rows a rewrite drops): the benefit is in opens.
    return max(0.0, file_opens(stats) - after), float(rewritten + FIXED_COST_BYTES)


@dataclass(frozen=True)
class Candidate:
    table: str
    partition_path: str
    work: Work
    reason: str
    benefit: float
    cost: float
    hot: bool = False  # still being written: planned against its read budget (``plans.plan_hot``)
    data_bytes: int = 0  # the partition's live data (what a job compacting it reads at most)
    # Work the portability target asks for: when its oldest equality delete reaches the target
    # (it goes first, the most urgent first). None: work for reads and file counts.
    due_by: float | None = None
    # The last pack of a partition nobody has written for a while (``last_pack``): its plan packs
    # its small files however few, and its answer stands until the next write.
    last_pack: bool = False

    @property
    def priority(self) -> float:
        return self.benefit / self.cost


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The portability target's conversions first, the nearest deadline first (a reader that
    cannot apply equality deletes fails on the table until they are done, and they rewrite no
    data); then global deletes (every read of every partition pays for them); then most read cost
    removed per byte rewritten; ties go to the bigger benefit."""
    return sorted(
        candidates,
        key=lambda c: (
            c.due_by is None,
            c.due_by or 0.0,
            c.work is not Work.RESOLVE_GLOBAL_DELETES,
            -c.priority,
            -c.benefit,
            c.table,
            c.partition_path,
        ),
    )
