"""What one compaction of one partition touches, file by file, at the snapshot it starts from:
free of I/O, over the facts of the partition's live files.

Which delete applies to which data file follows the spec's sequence-number rules (Iceberg spec,
"Scan Planning"): an equality delete of sequence number ``e`` applies to the data files of its
partition whose data sequence number ``d`` is strictly lower (``d < e``; a batch's own deletes
never hit its own files); a position delete (or deletion vector) of sequence number ``x``
applies to the data file it names when ``d <= x``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from icecdc.compactor.policy import (
    EQUALITY_DELETE_WEIGHT,
    OPEN_FILE_COST_BYTES,
    Work,
    budget_for_bytes,
    medium_files_pack,
)
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.domain.files import DataFileContent, LiveDataFile, LiveDeleteFile
from icecdc.runtime.config import CompactorConfig


@dataclass(frozen=True)
class DataFileFacts:
    path: str
    size: int
    records: int
    data_sequence_number: int
    # Paths of the delete files that apply to this file (same partition, higher sequence number).
    equality_deletes: tuple[str, ...] = ()
    position_deletes: tuple[str, ...] = ()
    # False when the file's key bounds rule out every key its equality deletes name (a global
    # delete resolution reads no key column of such a file).
    may_match: bool = True


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
    def of(
        cls, data: Iterable[LiveDataFile], deletes: Iterable[LiveDeleteFile], may_match: Iterable[str] | None = None
    ) -> PartitionFiles:
        """From a listing: which deletes apply to which file is computed from sequence numbers,
        not read from each scan task (one call per file instead of one per (file, delete) pair).
        ``may_match``: the files whose key bounds admit a deleted key (None: every file)."""
        deletes = tuple(deletes)
        matching = None if may_match is None else set(may_match)
        return cls(
            tuple(
                DataFileFacts(
                    f.path,
                    f.size,
                    f.records,
                    f.data_sequence_number,
                    *applying_deletes(f.path, f.data_sequence_number, deletes),
                    may_match=matching is None or f.path in matching,
                )
                for f in data
            ),
            deletes,
        )


@dataclass(frozen=True)
class RewritePlan:
    work: Work
    rewrite: tuple[str, ...] = ()  # data files rewritten with their deletes applied
    convert: tuple[str, ...] = ()  # data files whose equality deletes become position deletes
    remove_deletes: tuple[str, ...] = ()  # delete files that apply to nothing once this commits
    # Data files the plan relies on being unchanged when it commits, beyond those it converts: a
    # removed equality delete applied to them (validated to still exist).
    examined: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.rewrite or self.convert or self.remove_deletes)


def plan_rewrite(
    files: PartitionFiles, work: Work, settings: CompactorConfig, deletion_vectors: bool = False, *, last_pack: bool = False
) -> RewritePlan:
    """The files one compaction of this partition touches. ``last_pack``: a minor compaction packs
    the small files however few, two or more (``policy.last_pack``).
    ``deletion_vectors`` (format v3): the
    large files' equality deletes are not converted here but left to a conversion
    (``plan_conversion``, the portability target asks for it): a ``RewriteFiles`` that adds a
    deletion vector is not validated against deletion vectors added concurrently (Iceberg 1.10
    validates them for a ``RowDelta`` only), so a resolution of the global deletes committed on
    another replica from the same snapshot would leave the file two, which the spec forbids and
    which breaks the scan. Conversions commit as a ``RowDelta``, and the second of two fails."""
    small = [f for f in files.data if size_class(f.size, settings) is SizeClass.SMALL]
    medium = [f for f in files.data if size_class(f.size, settings) is SizeClass.MEDIUM]
    large = [f for f in files.data if size_class(f.size, settings) is SizeClass.LARGE]
    # Medium files with enough content are packed by either kind of work (``policy.medium_files_pack``).
    packed_medium = medium if medium_files_pack(len(medium), sum(f.size for f in medium), settings) else []
    deletes_by_path = {d.path: d for d in files.deletes}

    def deleted_share(f: DataFileFacts) -> float:
        # Our position-delete files are one per data file, so their record count is exact; a
        # foreign one covering several files makes this an upper bound (rewrite sooner).
        deleted = sum(deletes_by_path[p].records for p in f.position_deletes if p in deletes_by_path)
        return deleted / f.records if f.records else 1.0

    rewrite: list[DataFileFacts] = []
    convert: list[DataFileFacts] = []
    if work is Work.MINOR:
        if packed_medium:
            rewrite = small + packed_medium
        elif len(small) >= (2 if last_pack else max(2, settings.min_small_files)):
            rewrite = small
    elif work is Work.DELETE_MERGE:
        large_paths = {f.path for f in large}
        # Small files (two or more) and medium files with enough content are packed along with
        # the files deletes force us to rewrite.
        packed_paths = {f.path for f in (small if len(small) > 1 else []) + packed_medium}
        for f in files.data:
            has_deletes = bool(f.equality_deletes or f.position_deletes)
            if f.path not in large_paths:
                if has_deletes or f.path in packed_paths:
                    rewrite.append(f)
            elif f.position_deletes and deleted_share(f) >= settings.position_delete_rewrite_ratio:
                rewrite.append(f)
            elif f.equality_deletes and not deletion_vectors:
                convert.append(f)
    touched = {f.path for f in rewrite} | {f.path for f in convert}
    still_needed = {p for f in files.data if f.path not in touched for p in (*f.equality_deletes, *f.position_deletes)}
    remove = tuple(sorted(d.path for d in files.deletes if d.path not in still_needed))
    plan = RewritePlan(work, tuple(f.path for f in rewrite), tuple(f.path for f in convert), remove)
    if not plan.rewrite and not plan.convert and plan.remove_deletes:
        return RewritePlan(Work.REMOVE_DANGLING_DELETES, remove_deletes=plan.remove_deletes)
    return plan


# Plans committed as a ``RowDelta`` of position deletes alone, never together with others.
CONVERSIONS = frozenset({Work.CONVERT, Work.RESOLVE_GLOBAL_DELETES})


def plan_together(plans: Sequence[RewritePlan], deletion_vectors: bool = False) -> RewritePlan:
    """The one commit of a job that compacts several partitions: every file each partition's plan
    touches. Partitions never share a file, so the plans are simply put side by side. Conversions
    commit as a ``RowDelta``, rewrites as a ``RewriteFiles``. On format v2 the portability
    target's job may hold both (``plan_portable``): the rewrite carries the conversions' position
    deletes, as a pack's does for the files it leaves. On format v3 (``deletion_vectors``) a job
    is all conversions or none, since a ``RewriteFiles`` would add vectors unvalidated
    (``plan_rewrite``). A resolution of the global deletes is one job of its own."""
    if len(plans) == 1:
        return plans[0]
    works = {p.work for p in plans}
    mixed = len({w in CONVERSIONS for w in works}) > 1
    if Work.RESOLVE_GLOBAL_DELETES in works or (mixed and deletion_vectors):
        raise ValueError("a resolution, or a conversion on format v3, is committed together only with conversions")
    return RewritePlan(
        plans[0].work if len(works) == 1 else Work.DELETE_MERGE,
        tuple(path for p in plans for path in p.rewrite),
        tuple(path for p in plans for path in p.convert),
        tuple(path for p in plans for path in p.remove_deletes),
        tuple(path for p in plans for path in p.examined),
    )


def plan_conversion(files: PartitionFiles) -> RewritePlan:
    """Equality deletes become position deletes, without rewriting any data (``Work.CONVERT``).

    Each data file that an equality delete applies to gets one file-scoped position-delete file
    (or deletion vector) holding the rows those deletes match and the rows its earlier
    file-scoped position deletes removed, which it replaces. An equality delete is removed once
    every data file it applies to is converted: it can apply to nothing else, because every data
    file the writer adds later has a higher sequence number. Deletes that name no single file
    (someone else's) are left as they are."""
    convert = tuple(f.path for f in files.data if f.equality_deletes)
    converted = set(convert)
    by_path = {d.path: d for d in files.deletes}
    replaced = {
        p for f in files.data if f.path in converted for p in f.position_deletes if by_path[p].referenced_data_file == f.path
    }
    removable = tuple(
        sorted(
            d.path
            for d in files.deletes
            if d.is_equality and all(f.path in converted for f in files.data if f.data_sequence_number < d.data_sequence_number)
        )
    )
    return RewritePlan(Work.CONVERT, convert=convert, remove_deletes=tuple(sorted(replaced)) + removable)


def plan_resolution(files: PartitionFiles) -> RewritePlan:
    """Global equality deletes become position deletes on the files they hit, in every partition,
    and are removed (``Work.RESOLVE_GLOBAL_DELETES``); ``files`` lists every data file of the table
    and, as deletes, the global deletes and the file-scoped position deletes.

    A global delete of sequence number ``g`` applies to the data files with ``d < g``, whatever
    their partition: each such file whose key bounds admit a deleted key is converted (its
    earlier file-scoped positions merged in, as ``plan_conversion`` does), the others are only
    examined. Once all of them are, nothing is left for the global deletes to apply to (files the
    writer adds later have higher sequence numbers), so they are removed in the same commit,
    which validates that every examined file still exists."""
    by_path = {d.path: d for d in files.deletes}
    applied = [f for f in files.data if f.equality_deletes]
    convert = tuple(f.path for f in applied if f.may_match)
    converted = set(convert)
    replaced = {
        p for f in files.data if f.path in converted for p in f.position_deletes if by_path[p].referenced_data_file == f.path
    }
    resolved = {d.path for d in files.deletes if d.is_equality}
    return RewritePlan(
        Work.RESOLVE_GLOBAL_DELETES,
        convert=convert,
        remove_deletes=tuple(sorted(resolved | replaced)),
        examined=tuple(f.path for f in applied),
    )


def plan_older_spec(files: PartitionFiles) -> RewritePlan:
    """A partition of an older spec joins the current spec: every data file rewritten with its
    deletes applied (Spark's engine writes the rows partitioned by the current spec), and every
    delete file of the partition removed, since the partition then holds no data file for it to
    apply to. Its listing holds no global delete (``listing._list``)."""
    return RewritePlan(
        Work.REWRITE_OLDER_SPEC,
        rewrite=tuple(f.path for f in files.data),
        remove_deletes=tuple(d.path for d in files.deletes),
    )


def keep_deletes_of_unchanged(plan: RewritePlan, files: PartitionFiles, unchanged: Iterable[str]) -> RewritePlan:
    """The plan once its conversions have run: a converted file whose equality deletes matched
    no row it still held got no new position-delete file, so the position deletes that apply to
    it stay (its equality deletes may go all the same: they delete nothing from it)."""
    unchanged = set(unchanged)
    needed = {p for f in files.data if f.path in unchanged for p in f.position_deletes}
    return dataclasses.replace(plan, remove_deletes=tuple(p for p in plan.remove_deletes if p not in needed))


# Packs go in tiers, as in a size-tiered LSM: a file of tier ``t`` (``pack_tier``) is packed only
# with files of tier ``t`` or lower, and only when packing the lower tiers alone does not bring the
# partition within its budget. Each file a pack makes is at least the size of the largest it packed
# and usually of the next tier, so a row is rewritten about once per tier it climbs, log4 of (the
# bytes the writer added / a batch's), not once per batch (docs/BENCHMARKS.md, row "Write
# amplification").
PACK_FAN_IN = 4
# Files under this size are all of the lowest tier: a batch file's few KB cost their open, not
# their bytes, and packing them together is cheap. Not larger: every file under the floor is the
# same tier, so a partition whose largest file is under it is rewritten whole by every pack, one
# batch after another, and a small partition's compacted base can be under 64 KB
# (docs/BENCHMARKS.md, row "Write amplification"). Above 64 KB the tiers are the same as with a
# floor of 64 KB (a factor of 4 apart).
PACK_TIER_FLOOR_BYTES = 4 * 1024


def pack_tier(size: int) -> int:
    """A file's tier: 0 under ``PACK_TIER_FLOOR_BYTES``, one more per ``PACK_FAN_IN`` times that."""
    if size < PACK_TIER_FLOOR_BYTES:
        return 0
    return 1 + math.floor(math.log(size / PACK_TIER_FLOOR_BYTES, PACK_FAN_IN))


def read_cost_after(files: PartitionFiles, plan: RewritePlan, settings: CompactorConfig) -> float:
    """The partition's read cost (``policy.read_cost``) once ``plan`` has committed (every
    converted file counted with one position-delete file: an upper bound; the bytes counted as
    before, though a rewrite drops the deleted rows)."""
    rewritten, converted, removed = set(plan.rewrite), set(plan.convert), set(plan.remove_deletes)
    packed = sum(f.size for f in files.data if f.path in rewritten)
    data = len(files.data) - len(rewritten) + (math.ceil(packed / settings.target_file_size_bytes) if rewritten else 0)
    kept = [d for d in files.deletes if d.path not in removed]
    equality = sum(1 for d in kept if d.is_equality)
    still_positions = {d.referenced_data_file for d in kept if not d.is_equality}
    positions = len(kept) - equality + len(converted - still_positions)
    return data + positions + EQUALITY_DELETE_WEIGHT * equality + sum(f.size for f in files.data) / OPEN_FILE_COST_BYTES


def plan_pack(files: PartitionFiles, packed: Sequence[DataFileFacts], deletion_vectors: bool = False) -> RewritePlan:
    """Rewrite ``packed`` into one file (their deletes applied) and convert the equality deletes
    of the rest, in one commit. ``deletion_vectors``: the rest is left to a conversion
    (``plan_rewrite`` says why)."""
    rewrite = {f.path for f in packed}
    convert = [] if deletion_vectors else [f.path for f in files.data if f.path not in rewrite and f.equality_deletes]
    touched = rewrite | set(convert)
    by_path = {d.path: d for d in files.deletes}
    still_needed = {p for f in files.data if f.path not in touched for p in (*f.equality_deletes, *f.position_deletes)}
    # Position deletes of converted files are merged into their new ones only when file-scoped.
    still_needed |= {
        p for f in files.data if f.path in convert for p in f.position_deletes if by_path[p].referenced_data_file != f.path
    }
    remove = tuple(sorted(d.path for d in files.deletes if d.path not in still_needed))
    return RewritePlan(Work.DELETE_MERGE, tuple(f.path for f in packed), tuple(convert), remove)


# A pack the next batch makes the partition pack again (the budget has no room for that batch's
# file and its position deletes) is rewritten with every batch until it reaches the next tier:
# with one such slot, as on a partition of a few hundred KB, a tier's floor sets how far it grows,
# and a row is rewritten some (floor / batch bytes) times, growing without bound
# (docs/compactor.md, "Packs that the next batch packs again"). So that pack takes the next tier
# along once the rewriting it costs has paid for that, as in the ski-rental problem, which buys
# once the rent paid reaches the price: ``next_tier_worth_packing``.
NEXT_BATCH_OPENS = 2  # a batch's data file, and the position deletes it leaves on the pack


def next_tier_worth_packing(packed_bytes: int, next_tier_bytes: int, batch_bytes: int) -> bool:
    """Whether a pack of ``packed_bytes`` that each batch of ``batch_bytes`` repacks has cost about
    as much as packing the next tier's ``next_tier_bytes`` with it: grown a batch at a time from
    nothing, it has rewritten some ``packed_bytes ** 2 / (2 * batch_bytes)`` bytes, which reaches
    the price at ``sqrt(2 * next_tier_bytes * batch_bytes)``. That is also the cycle that
    minimises the bytes rewritten a batch (``batch_bytes * m / 2 + next_tier_bytes / m`` over a
    cycle of ``m`` batches). A pack that grows by less than a batch's bytes (the batch's updates
    delete rows of the pack) merges somewhat later than that optimum."""
    return packed_bytes * packed_bytes >= 2 * next_tier_bytes * batch_bytes


def plan_tier_pack(
    files: PartitionFiles, settings: CompactorConfig, budget: float, deletion_vectors: bool = False
) -> RewritePlan | None:
    """The pack of the lowest tiers (``pack_tier``) that brings the partition within ``budget``,
    the rest's equality deletes converted in the same commit; None when no pack of at least two
    files under the large size does. The next tier joins a pack that fits when the next batch
    would make the partition pack it again and the rewriting that costs has paid for it
    (``next_tier_worth_packing``).
    ``deletion_vectors``: the rest is left to the portability target's conversion, due within half
    its target, and the budget is judged as if it had run: judged with the rest's equality
    deletes, a pack on format v3 would take every file of a small partition, a full rewrite every
    batch."""
    packable = sorted((f for f in files.data if size_class(f.size, settings) is not SizeClass.LARGE), key=lambda f: f.size)
    if len(packable) < 2:
        return None
    batch_bytes = max(packable, key=lambda f: f.data_sequence_number).size
    chosen: list[DataFileFacts] | None = None
    for tier in sorted({pack_tier(f.size) for f in packable}):
        packed = [f for f in packable if pack_tier(f.size) <= tier]
        if len(packed) < 2:
            continue
        if chosen is None:
            if read_cost_after(files, plan_pack(files, packed), settings) <= budget:
                chosen = packed
            continue
        repacked = read_cost_after(files, plan_pack(files, chosen), settings) + NEXT_BATCH_OPENS > budget
        chosen_bytes = sum(f.size for f in chosen)
        if not (repacked and next_tier_worth_packing(chosen_bytes, sum(f.size for f in packed) - chosen_bytes, batch_bytes)):
            break
        chosen = packed
    if chosen is None:
        return None
    return plan_pack(files, chosen, deletion_vectors=deletion_vectors)


def plan_hot(files: PartitionFiles, settings: CompactorConfig, deletion_vectors: bool = False) -> RewritePlan:
    """The cheapest work that brings a partition still being written back within its read
    budget (``policy.read_budget``): converting its equality deletes (no data rewritten); else
    packing its smallest files, tier by tier, and converting the rest; else a full delete merge."""
    cheap = _conversion_or_pack_within_budget(files, settings, deletion_vectors)
    return cheap or plan_rewrite(files, Work.DELETE_MERGE, settings, deletion_vectors)


def plan_portable(files: PartitionFiles, settings: CompactorConfig, hot: bool, deletion_vectors: bool = False) -> RewritePlan:
    """The portability target's work on a partition: its conversion. On a partition still being
    written (``hot``) that the conversion alone leaves over its read budget, the tier pack the
    budget asks for, the rest converted in the same commit: conversions come due every half
    target and go first, so a budget's own work would otherwise wait until the writer stops.
    Never a full delete merge, which could take a large partition past the deadline. Never on
    format v3 (``deletion_vectors``): a pack there leaves the other files' equality deletes to a
    conversion anyway, and could not share the conversions' commit (``plan_together``)."""
    if hot and not deletion_vectors and (cheap := _conversion_or_pack_within_budget(files, settings, False)) is not None:
        return cheap
    return plan_conversion(files)


def _conversion_or_pack_within_budget(
    files: PartitionFiles, settings: CompactorConfig, deletion_vectors: bool
) -> RewritePlan | None:
    """The conversion, if it brings the partition within its read budget; else the lowest tiers'
    pack that does (``plan_tier_pack``); else None."""
    budget = budget_for_bytes(sum(f.size for f in files.data), settings)
    conversion = plan_conversion(files)
    if not conversion.empty and read_cost_after(files, conversion, settings) <= budget:
        return conversion
    return plan_tier_pack(files, settings, budget, deletion_vectors)


def plan_for(
    work: Work,
    files: PartitionFiles,
    settings: CompactorConfig,
    hot: bool = False,
    *,
    portable: bool = False,
    deletion_vectors: bool = False,
    last_pack: bool = False,
) -> RewritePlan:
    """The plan of a candidate: for the portability target (``portable``) ``plan_portable``, a
    conversion with at most the pack a hot partition's budget asks for; against its read budget
    for a partition still being written; else the plan of its kind of work (``last_pack``: the
    last pack of a partition settled long ago). ``deletion_vectors``: the table is format v3
    (``plan_rewrite``)."""
    if work is Work.RESOLVE_GLOBAL_DELETES:
        return plan_resolution(files)
    if work is Work.REWRITE_OLDER_SPEC:
        return plan_older_spec(files)
    if work is Work.CONVERT and portable:
        return plan_portable(files, settings, hot, deletion_vectors)
    if work is Work.CONVERT and not hot:
        return plan_conversion(files)
    if hot:
        return plan_hot(files, settings, deletion_vectors)
    return plan_rewrite(files, work, settings, deletion_vectors, last_pack=last_pack)
