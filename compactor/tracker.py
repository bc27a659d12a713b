"""What the sidecar knows about every partition: file statistics (from table metadata, kept
current between reads by the commit events), write cadence, and where its own work on it stands.
Plain data and plain decisions; the sidecar feeds it, acts on ``candidates``, and records where
each attempt stands through ``begin`` and ``resolve`` (the transitions of ``outcomes``).

Time is wall-clock epoch seconds throughout, because commit events carry the catalog's commit
time; the writer and the sidecar are expected to run on hosts with synchronised clocks (they
share a pod in the Kubernetes deployment).
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from icecdc.compactor import outcomes
from icecdc.compactor.outcomes import BackingOff, Compacting, Idle, PartitionState, Resolution
from icecdc.compactor.policy import (
    Candidate,
    PartitionStats,
    Work,
    benefit_and_cost,
    beside_writer,
    global_work,
    hot_work,
    ideal_read_cost,
    last_pack,
    needed_work,
    older_spec_work,
    portability_due,
    portability_work,
    rank,
    read_budget,
    read_cost,
)
from icecdc.compactor.settle import Phase, phase, quiet_windows, settle_window, settles_at
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.domain.cadence import WriteCadence
from icecdc.domain.events import CommitEvent, CompactionOutcome, PartitionDelta
from icecdc.domain.layout import older_spec_of
from icecdc.domain.writer_commits import WriterKind, most_demanding
from icecdc.runtime.config import CompactorConfig

# A table's global equality deletes (keys whose old partition was unknown; they apply to every
# partition) are tracked, leased and resolved as one pseudo-partition of the table, by this path.
GLOBAL_DELETES_PATH = "(global deletes)"


@dataclass(frozen=True)
class PartitionMetadata:
    """One partition as the table's metadata describes it."""

    partition: Mapping[str, Any]
    stats: PartitionStats
    # The last commit that touched the partition, unless it was one of ours (but a resolution of
    # the global deletes, which deletes rows in it as the writer's deletes do).
    last_write: float | None
    last_compaction: float | None
    # When the commit that added its oldest live equality-delete file was made (None: none, or
    # its snapshot is gone); for the global deletes, the oldest of them.
    oldest_write: float | None = None


class PartitionPhase(str, enum.Enum):
    """A partition's state in the status and its gauges: its settle phase, unless it is being
    compacted; the global deletes are their own."""

    HOT = "hot"
    SETTLING = "settling"
    SETTLED = "settled"
    COMPACTING = "compacting"
    GLOBAL = "global"  # a table's unresolved global deletes


@dataclass
class TrackedPartition:
    """What the tracker knows of one partition: what it has observed (file statistics, write
    cadence, compaction times) and where its own work on it stands (``state``, which only the
    transitions of ``outcomes`` change, through the tracker's ``begin`` and ``resolve``)."""

    table: str
    path: str
    partition: Mapping[str, Any]
    stats: PartitionStats = field(default_factory=PartitionStats)
    cadence: WriteCadence = field(default_factory=WriteCadence)
    last_compaction: float | None = None
    state: PartitionState = field(default_factory=Idle)
    # When its oldest live equality-delete file was committed: what the portability target
    # measures (``policy.portability_work``), and the age in the status.
    oldest_write: float | None = None

    @property
    def is_global(self) -> bool:
        return self.path == GLOBAL_DELETES_PATH

    @property
    def is_older_spec(self) -> bool:
        """A partition of one of the table's older partition specs."""
        return older_spec_of(self.path) is not None

    @property
    def packs_last(self) -> bool:
        """Whether it gets a last pack once quiet long enough: a current-spec partition (the
        global deletes get resolutions, an older spec's partitions their rewrite)."""
        return not (self.is_global or self.is_older_spec)

    @property
    def key(self) -> tuple[str, str]:
        return self.table, self.path

    @property
    def compacting(self) -> bool:
        return isinstance(self.state, Compacting)

    def answered(self, settled: bool, last_pack_due: bool = False) -> bool:
        """Whether its last write has had the work its phase calls for (``last_pack_due``: it has
        been quiet long enough for the last pack)."""
        return outcomes.answered(self.state, self.cadence.last_write, settled, last_pack_due)


class _Due(NamedTuple):
    """What a partition needs now, for its candidate: ``hot``, planned against its read budget;
    ``due_by``, the portability target's deadline; ``last_pack``, it has been quiet long enough
    for the last pack, which its plan then includes."""

    work: Work
    reason: str
    hot: bool = False
    due_by: float | None = None
    last_pack: bool = False


def _conversion(partition: TrackedPartition) -> Work:
    """What the portability target asks of a partition's equality deletes: a conversion, or for
    a table's global deletes a resolution."""
    return Work.RESOLVE_GLOBAL_DELETES if partition.is_global else Work.CONVERT


@dataclass(frozen=True)
class PartitionStatus:
    """One row of ``icecdc status``: a partition's state, files, deletes and read cost."""

    table: str
    partition: str
    state: str  # a PartitionPhase: hot, settling, settled, compacting, global
    data_files: int
    small_files: int
    data_bytes: int
    records: int
    equality_delete_files: int
    equality_delete_records: int
    position_delete_files: int
    position_delete_records: int
    last_write: float | None
    last_compaction: float | None
    settle_window_seconds: float
    read_cost: float
    ideal_read_cost: float
    # What the partition may cost while it is still written (``policy.read_budget``).
    read_budget: float = 0.0
    owned: bool | None = None  # whether this replica holds the partition's lease (None: not asked)
    # When its oldest live equality-delete file was committed (None: none live, or unknown).
    oldest_write: float | None = None
    # The work the sidecar has ahead for it, due now or later (``PartitionTracker.pending``;
    # None: none, the policy's fixed point, or a report older than the field).
    pending: str | None = None


@dataclass(frozen=True)
class TablePortability:
    """Whether readers that cannot apply equality deletes can read a table now: its live
    equality-delete files, partitioned and global, and when the oldest was committed."""

    table: str
    equality_delete_files: int = 0
    oldest_write: float | None = None

    @property
    def portable(self) -> bool:
        return not self.equality_delete_files

    def oldest_age(self, now: float) -> float:
        """Seconds since the oldest live equality delete was committed (0: none live, or unknown)."""
        return max(0.0, now - self.oldest_write) if self.equality_delete_files and self.oldest_write is not None else 0.0


def portability_of(partitions: Iterable[tuple[str, int, float | None]]) -> dict[str, TablePortability]:
    """Each table's portability, from its partitions' (table, live equality-delete files, when
    the oldest was committed)."""
    tables: dict[str, TablePortability] = {}
    for table, files, written in partitions:
        known = tables.get(table, TablePortability(table))
        oldest = known.oldest_write
        if files and written is not None:
            oldest = written if oldest is None else min(oldest, written)
        tables[table] = TablePortability(table, known.equality_delete_files + files, oldest)
    return tables


def status_portability(rows: Iterable[PartitionStatus]) -> dict[str, TablePortability]:
    """Each table's portability, from its status rows (the sidecar's or table metadata's)."""
    return portability_of((r.table, r.equality_delete_files, r.oldest_write) for r in rows)


def _add(stats: PartitionStats, delta: PartitionDelta, settings: CompactorConfig) -> PartitionStats:
    # A commit event sums a batch's files per partition; a batch's files are small or not alike.
    small = bool(delta.data_files) and size_class(delta.data_bytes // delta.data_files, settings) is SizeClass.SMALL
    return dataclasses.replace(
        stats,
        data_files=stats.data_files + delta.data_files,
        data_bytes=stats.data_bytes + delta.data_bytes,
        records=stats.records + delta.data_records,
        small_files=stats.small_files + (delta.data_files if small else 0),
        small_bytes=stats.small_bytes + (delta.data_bytes if small else 0),
        equality_delete_files=stats.equality_delete_files + delta.equality_delete_files,
        equality_delete_records=stats.equality_delete_records + delta.equality_delete_records,
    )


class PartitionTracker:
    def __init__(self, settings: CompactorConfig) -> None:
        self.settings = settings
        self._partitions: dict[tuple[str, str], TrackedPartition] = {}
        # Per table, the sequence number its statistics were last read at from metadata.
        self._counted_up_to: dict[str, int] = {}
        # Tables with a commit whose event did not list its partitions (too many): only their
        # metadata says what it wrote.
        self._unlisted: set[str] = set()
        # Per table kept for another writer, the most demanding kind of commit seen from it.
        self._writers: dict[str, WriterKind] = {}

    def __iter__(self) -> Iterator[TrackedPartition]:
        return iter(self._partitions.values())

    def get(self, table: str, path: str) -> TrackedPartition | None:
        return self._partitions.get((table, path))

    def _tracked(self, table: str, path: str, partition: Mapping[str, Any]) -> TrackedPartition:
        tracked = self._partitions.get((table, path))
        if tracked is None:
            tracked = self._partitions[(table, path)] = TrackedPartition(table, path, dict(partition))
        return tracked

    def on_commit(self, event: CommitEvent) -> None:
        at = event.commit_time_ms / 1000
        # A commit the last metadata read already saw (events lag, or were replayed) only
        # tells the cadence; its files are counted.
        counted = event.sequence_number <= self._counted_up_to.get(event.table, -1)
        if event.truncated and not counted:
            # Every file of the table is gone: only what this commit adds is left.
            for p in self._partitions.values():
                if p.table == event.table:
                    p.stats, p.oldest_write = PartitionStats(), None
        if event.partitions_omitted and not counted:
            self._unlisted.add(event.table)
        for delta in event.partitions:
            p = self._tracked(event.table, delta.partition_path, delta.partition)
            if not counted:
                p.stats = _add(p.stats, delta, self.settings)
                if delta.equality_delete_files:
                    p.oldest_write = at if p.oldest_write is None else min(p.oldest_write, at)
            p.cadence.record(at)
        if event.global_delete_files:
            p = self._tracked(event.table, GLOBAL_DELETES_PATH, {})
            if not counted:
                p.stats = dataclasses.replace(
                    p.stats,
                    equality_delete_files=p.stats.equality_delete_files + event.global_delete_files,
                    equality_delete_records=p.stats.equality_delete_records + event.global_delete_records,
                )
                p.oldest_write = at if p.oldest_write is None else min(p.oldest_write, at)
            p.cadence.record(at)

    def on_writer(self, table: str, kinds: Iterable[WriterKind]) -> None:
        """Another writer committed these kinds of commit to the table."""
        kind = most_demanding(kinds, self._writers.get(table))
        if kind is not None:
            self._writers[table] = kind

    def writer_kind(self, table: str) -> WriterKind | None:
        """The most demanding kind of commit seen from the table's writer (None: none seen, or
        icecdc's ingester, which sends commit events)."""
        return self._writers.get(table)

    def take_unlisted(self) -> set[str]:
        """The tables to read metadata of now: a commit event since their last read left out
        the partitions it wrote."""
        tables, self._unlisted = self._unlisted, set()
        return tables

    def on_metadata(self, table: str, sequence_number: int, partitions: Mapping[str, PartitionMetadata]) -> None:
        """Replace a table's statistics with what its metadata says at ``sequence_number``;
        partitions that have no live file any more are forgotten (unless being compacted)."""
        self._counted_up_to[table] = sequence_number
        self._unlisted.discard(table)
        for path, meta in partitions.items():
            p = self._tracked(table, path, meta.partition)
            p.stats = meta.stats
            if meta.last_write is not None:
                p.cadence.record(meta.last_write)
            if meta.last_compaction is not None:
                p.last_compaction = max(p.last_compaction or 0.0, meta.last_compaction)
            p.oldest_write = meta.oldest_write
        for key in [k for k in self._partitions if k[0] == table and k[1] not in partitions]:
            gone = self._partitions[key]
            if gone.compacting:  # its job re-reads the table before it ends: no live file is left
                gone.stats, gone.oldest_write = PartitionStats(), None
            else:
                del self._partitions[key]

    def phase_of(self, partition: TrackedPartition, now: float) -> PartitionPhase:
        """What the status shows of the partition at ``now``."""
        if partition.compacting:
            return PartitionPhase.COMPACTING
        if partition.is_global:
            return PartitionPhase.GLOBAL
        return PartitionPhase(phase(partition.cadence, now, self.settings.settle).value)

    def begin(self, partition: TrackedPartition, hot: bool = False, answers: bool = True, last_pack: bool = False) -> Compacting:
        """An attempt on the partition starts (``outcomes.begin``); ``hot``: work on a hot partition;
        ``answers``: not a conversion for the portability target; ``last_pack``: its last pack."""
        started = partition.state = outcomes.begin(partition.state, partition.cadence.last_write, hot, answers, last_pack)
        return started

    def resolve(
        self,
        partition: TrackedPartition,
        outcome: CompactionOutcome,
        reason: str,
        *,
        started: float,
        now: float,
        rng: random.Random,
    ) -> Resolution:
        """The attempt under way on the partition ended in ``outcome`` (``outcomes.resolve``)."""
        resolution = outcomes.resolve(
            partition.state,
            outcome,
            reason,
            settles_at=settles_at(partition.cadence, self.settings.settle),
            started=started,
            now=now,
            settings=self.settings,
            rng=rng,
        )
        partition.state = resolution.state
        if resolution.outcome is CompactionOutcome.COMMITTED:
            partition.last_compaction = now
        return resolution

    def _settled(self, partition: TrackedPartition, now: float) -> bool:
        return phase(partition.cadence, now, self.settings.settle) is Phase.SETTLED

    def _last_pack_due(self, partition: TrackedPartition, now: float) -> bool:
        """Whether nobody has written the partition for ``last_pack_after_windows`` settle windows."""
        quiet = quiet_windows(partition.cadence, now, self.settings.settle)
        return partition.packs_last and quiet >= self.settings.last_pack_after_windows

    def portability_due_at(self, partition: TrackedPartition) -> float | None:
        """When the portability target asks for a conversion of the partition: once its oldest
        equality delete is ``policy.PORTABLE_SHARE`` of the target old, and not before a backoff
        ends (None: it holds none, or an attempt on it is under way)."""
        state = partition.state
        # An older spec's equality deletes go with its rewrite into the current spec, once settled.
        if not partition.stats.equality_delete_files or isinstance(state, Compacting) or partition.is_older_spec:
            return None
        # No "answered" here: the statistics are re-read from metadata after each of our own
        # compactions, and a conversion removes every equality delete it lists, so equality
        # deletes still counted are live ones (a delete merge on format v3, or a pack, leaves
        # the deletes of the files it does not rewrite to the conversion).
        due = portability_due(partition.oldest_write, self.settings)
        due = float("-inf") if due is None else due
        return max(due, state.retry_at) if isinstance(state, BackingOff) else due

    def next_due(self) -> float | None:
        """The earliest time the portability target asks for a conversion (the sidecar waits no
        longer than this for events)."""
        due = [at for p in self._partitions.values() if (at := self.portability_due_at(p)) is not None]
        return min(due, default=None)

    def _due(self, partition: TrackedPartition, now: float) -> _Due | None:
        """What a partition needs now. The portability target first: a partition whose oldest
        equality delete is due gets a conversion, hot or settled, hot with the pack its read
        budget asks for (``plans.plan_portable``); it answers no write: the rules below judge what
        it leaves. Otherwise a settled partition gets what it needs, and
        once quiet long enough its last pack; one still being written only what keeps it within
        its read budget."""
        state, stats, settled = partition.state, partition.stats, self._settled(partition, now)
        last_pack_due = settled and self._last_pack_due(partition, now)
        if not settled and not beside_writer(self._writers.get(partition.table)).hot_work:
            return None
        portable_at = self.portability_due_at(partition)
        if portable_at is not None and now >= portable_at:
            portable = portability_work(stats, partition.oldest_write, now, self.settings, is_global=partition.is_global)
            if portable is not None:
                oldest = partition.oldest_write
                due_by = now if oldest is None else oldest + self.settings.portable_within_seconds
                return _Due(*portable, hot=not settled, due_by=due_by)
        if isinstance(state, Compacting) or partition.answered(settled, last_pack_due):
            return None
        # Answered as settled, and quiet long enough since: only the last pack is left to ask.
        answered_as_settled = settled and partition.answered(settled)
        if isinstance(state, BackingOff) and now < state.retry_at:
            return None
        # While the writer writes, the global deletes wait for the portability target as a
        # partition's equality deletes do: resolving each batch's at once rewrites the position
        # deletes of every file they hit once a batch, and leaves the loop no time for the read
        # budget (docs/BENCHMARKS.md, row "Commit-to-visible latency beside the sidecar").
        if partition.is_global and not settled:
            return None
        if settled:
            work = None if answered_as_settled else self._needed(partition, now)
            work = work or (last_pack(stats, self.settings) if last_pack_due else None)
            return None if work is None else _Due(*work, last_pack=last_pack_due)
        if partition.is_older_spec:  # left alone while a writer still deletes rows in its files
            return None
        hot = hot_work(stats, self.settings)
        return None if hot is None else _Due(*hot, hot=True)

    def candidates(self, now: float) -> list[Candidate]:
        out = []
        for p in self._partitions.values():
            due = self._due(p, now)
            if due is not None:
                benefit, cost = benefit_and_cost(p.stats, due.work, self.settings)
                out.append(
                    Candidate(
                        p.table,
                        p.path,
                        due.work,
                        due.reason,
                        benefit,
                        cost,
                        due.hot,
                        p.stats.data_bytes,
                        due.due_by,
                        due.last_pack,
                    )
                )
        return rank(out)

    def coming_conversions(self, now: float) -> list[Candidate]:
        """The portability target's conversions not due yet, as candidates with their deadlines
        (``due_by``), the nearest first: what ``turns.convert_first`` may put ahead of a long
        rewrite that would otherwise hold them past their due time."""
        out = []
        for p in self._partitions.values():
            due_at = self.portability_due_at(p)
            # One of unknown age (no ``oldest_write``) is due at once.
            if due_at is None or due_at <= now or p.oldest_write is None or isinstance(p.state, BackingOff):
                continue
            if not beside_writer(self._writers.get(p.table)).hot_work:
                continue  # converted once settled, as any other work there
            stats, target = p.stats, self.settings.portable_within_seconds
            work = _conversion(p)
            reason = f"oldest of {stats.equality_delete_files} equality-delete files {now - p.oldest_write:.1f}s old"
            benefit, cost = benefit_and_cost(stats, work, self.settings)
            due_by = p.oldest_write + target
            out.append(Candidate(p.table, p.path, work, reason, benefit, cost, True, stats.data_bytes, due_by))
        return rank(out)

    def waiting(self, now: float) -> list[TrackedPartition]:
        """Partitions that need work which is not due yet (still hot, backing off, or holding
        equality deletes the portability target has not asked to convert yet)."""
        return [
            p
            for p in self._partitions.values()
            if not p.compacting and self._due(p, now) is None and self._work_once_due(p, now) is not None
        ]

    def _work_once_due(self, partition: TrackedPartition, now: float) -> Work | None:
        """The work a partition that is neither due nor being compacted will need once it comes
        due (None: none)."""
        if self.portability_due_at(partition) is not None:
            return _conversion(partition)
        stats, settled = partition.stats, self._settled(partition, now)
        work = None if partition.answered(settled) else self._needed(partition, now)
        if work is None and settled and partition.packs_last and not partition.answered(settled, last_pack_due=True):
            work = last_pack(stats, self.settings)  # once quiet long enough
        return None if work is None else work[0]

    def _needed(self, partition: TrackedPartition, now: float) -> tuple[Work, str] | None:
        """What the partition needs by its kind: the global deletes a resolution, an older spec's
        partition its rewrite into the current spec, any other the policy's work."""
        if partition.is_global:
            return global_work(partition.stats, partition.oldest_write, now)
        if partition.is_older_spec:
            return older_spec_work(partition.stats)
        return needed_work(partition.stats, self.settings)

    def pending(self, partition: TrackedPartition, now: float) -> Work | None:
        """The work the sidecar has ahead for the partition, due now or once due (None: it is
        at the policy's fixed point, or being compacted)."""
        if partition.compacting:
            return None
        due = self._due(partition, now)
        return due[0] if due is not None else self._work_once_due(partition, now)

    def portability(self, table: str) -> TablePortability:
        """The table's portability as this tracker knows it now."""
        mine = ((p.table, p.stats.equality_delete_files, p.oldest_write) for p in self._partitions.values() if p.table == table)
        return portability_of(mine).get(table, TablePortability(table))

    def report(
        self, now: float, tables: Iterable[str] | None = None, owned: Callable[[str, str], bool] | None = None
    ) -> list[PartitionStatus]:
        """Status rows; ``owned`` tells whether this replica holds a partition's lease."""
        wanted = set(tables) if tables is not None else None
        rows = []
        for p in sorted(self._partitions.values(), key=lambda p: p.key):
            if wanted is not None and p.table not in wanted:
                continue
            stats, pending = p.stats, self.pending(p, now)
            rows.append(
                PartitionStatus(
                    table=p.table,
                    partition=p.path or "(unpartitioned)",
                    state=self.phase_of(p, now).value,
                    data_files=stats.data_files,
                    small_files=stats.small_files,
                    data_bytes=stats.data_bytes,
                    records=stats.records,
                    equality_delete_files=stats.equality_delete_files,
                    equality_delete_records=stats.equality_delete_records,
                    position_delete_files=stats.position_delete_files,
                    position_delete_records=stats.position_delete_records,
                    last_write=p.cadence.last_write,
                    last_compaction=p.last_compaction,
                    settle_window_seconds=round(settle_window(p.cadence, self.settings.settle), 1),
                    read_cost=read_cost(stats),
                    ideal_read_cost=ideal_read_cost(stats, self.settings),
                    read_budget=read_budget(stats, self.settings),
                    owned=owned(p.table, p.path) if owned is not None else None,
                    oldest_write=p.oldest_write,
                    pending=pending.value if pending is not None else None,
                )
            )
        return rows
