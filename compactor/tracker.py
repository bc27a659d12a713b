"""What the sidecar knows about every partition: file statistics (from table metadata, kept
current between reads by the commit events), write cadence, and where its own work on it stands.
Plain data and plain decisions; the sidecar feeds it, acts on ``candidates``, and records what
each attempt did through ``outcomes``.

Time is wall-clock epoch seconds throughout, because commit events carry the catalog's commit
time; the writer and the sidecar are expected to run on hosts with synchronised clocks (they
share a pod in the Kubernetes deployment).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from icecdc.cadence import WriteCadence
from icecdc.compactor.policy import (
    Candidate,
    PartitionStats,
    Work,
    benefit_and_cost,
    global_work,
    hot_work,
    ideal_read_cost,
    needed_work,
    rank,
    read_budget,
    read_cost,
)
from icecdc.compactor.settle import Phase, phase, settle_window, settles_at
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.config import CompactorConfig
from icecdc.events import CommitEvent, PartitionDelta

COMPACTING = "compacting"
# A table's global equality deletes (keys whose old partition was unknown; they apply to every
# partition) are tracked, leased and resolved as one pseudo-partition of the table, by this path.
GLOBAL_DELETES_PATH = "(global deletes)"
GLOBAL = "global"  # its state in the status: unresolved global deletes


@dataclass(frozen=True)
class PartitionMetadata:
    """One partition as the table's metadata describes it."""

    partition: Mapping[str, Any]
    stats: PartitionStats
    # The last commit that touched the partition, unless it was one of ours.
    last_write: float | None
    last_compaction: float | None
    # The global deletes only: when the oldest live one was committed.
    oldest_write: float | None = None


@dataclass
class PartitionState:
    table: str
    path: str
    partition: Mapping[str, Any]
    stats: PartitionStats = field(default_factory=PartitionStats)
    cadence: WriteCadence = field(default_factory=WriteCadence)
    last_compaction: float | None = None
    compacting: bool = False
    failures: int = 0
    retry_at: float | None = None
    # The last write a compaction already answered (done, found nothing to do, or given up):
    # no new work until the partition is written again. This is what makes the policy stop.
    answered_write: float | None = None
    # Whether that answer was work on a hot partition (what keeps it within its read budget):
    # it leaves the settled partition's work (one file per target size, no deletes) to do.
    answered_hot: bool = False
    # The last write known when the running compaction started: the one it answers (a write
    # that lands while it runs is not in its starting snapshot), and whether it is hot work.
    compacting_after_write: float | None = None
    compacting_hot: bool = False
    settled_at: float | None = None
    # The global deletes only: when the oldest live one was committed (their age in the status).
    oldest_write: float | None = None

    @property
    def is_global(self) -> bool:
        return self.path == GLOBAL_DELETES_PATH

    @property
    def key(self) -> tuple[str, str]:
        return self.table, self.path

    def answered(self, settled: bool) -> bool:
        """Whether its last write has had the work its phase calls for."""
        if self.answered_write is None or self.answered_write != self.cadence.last_write:
            return False
        return not (settled and self.answered_hot)


@dataclass(frozen=True)
class PartitionStatus:
    """One row of ``icecdc status``: a partition's state, files, deletes and read cost."""

    table: str
    partition: str
    state: str  # hot, settling, settled, compacting
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
    read_cost: int
    ideal_read_cost: int
    # What the partition may cost while it is still written (``policy.read_budget``).
    read_budget: float = 0.0
    owned: bool | None = None  # whether this replica holds the partition's lease (None: not asked)
    oldest_write: float | None = None  # the global deletes only: when the oldest live one was committed


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
        self._partitions: dict[tuple[str, str], PartitionState] = {}
        # Per table, the sequence number its statistics were last read at from metadata.
        self._counted_up_to: dict[str, int] = {}
        # Tables with a commit whose event did not list its partitions (too many): only their
        # metadata says what it wrote.
        self._unlisted: set[str] = set()

    def __iter__(self) -> Iterator[PartitionState]:
        return iter(self._partitions.values())

    def get(self, table: str, path: str) -> PartitionState | None:
        return self._partitions.get((table, path))

    def _state(self, table: str, path: str, partition: Mapping[str, Any]) -> PartitionState:
        state = self._partitions.get((table, path))
        if state is None:
            state = self._partitions[(table, path)] = PartitionState(table, path, dict(partition))
        return state

    def on_commit(self, event: CommitEvent) -> None:
        at = event.commit_time_ms / 1000
        # A commit the last metadata read already saw (events lag, or were replayed) only
        # tells the cadence; its files are counted.
        counted = event.sequence_number <= self._counted_up_to.get(event.table, -1)
        if event.truncated and not counted:
            # Every file of the table is gone: only what this commit adds is left.
            for state in self._partitions.values():
                if state.table == event.table:
                    state.stats = PartitionStats()
        if event.partitions_omitted and not counted:
            self._unlisted.add(event.table)
        for delta in event.partitions:
            state = self._state(event.table, delta.partition_path, delta.partition)
            if not counted:
                state.stats = _add(state.stats, delta, self.settings)
            state.cadence.record(at)
            state.settled_at = None
        if event.global_delete_files:
            state = self._state(event.table, GLOBAL_DELETES_PATH, {})
            if not counted:
                state.stats = dataclasses.replace(
                    state.stats,
                    equality_delete_files=state.stats.equality_delete_files + event.global_delete_files,
                    equality_delete_records=state.stats.equality_delete_records + event.global_delete_records,
                )
                state.oldest_write = state.oldest_write or at
            state.cadence.record(at)

    def take_unlisted(self) -> set[str]:
        """The tables to read metadata of now: a commit event since their last read left out
        the partitions it wrote."""
        tables, self._unlisted = self._unlisted, set()
        return tables

    def on_metadata(self, table: str, sequence_number: int, partitions: Mapping[str, PartitionMetadata]) -> None:
        """Replace a table's statistics with what its metadata says at ``sequence_number``;
        partitions that have no live file any more are forgotten."""
        self._counted_up_to[table] = sequence_number
        self._unlisted.discard(table)
        for path, meta in partitions.items():
            state = self._state(table, path, meta.partition)
            state.stats = meta.stats
            if meta.last_write is not None:
                state.cadence.record(meta.last_write)
            if meta.last_compaction is not None:
                state.last_compaction = max(state.last_compaction or 0.0, meta.last_compaction)
            if state.is_global:
                state.oldest_write = meta.oldest_write
        for key in [k for k in self._partitions if k[0] == table and k[1] not in partitions]:
            if not self._partitions[key].compacting:
                del self._partitions[key]

    def phase_of(self, state: PartitionState, now: float) -> str:
        if state.compacting:
            return COMPACTING
        if state.is_global:
            return GLOBAL
        current = phase(state.cadence, now, self.settings.settle)
        if current is Phase.SETTLED and state.settled_at is None:
            state.settled_at = settles_at(state.cadence, self.settings.settle) or now
        return current.value

    def _due(self, state: PartitionState, now: float) -> tuple[Work, str, bool] | None:
        """(work, reason, hot) for a partition that needs work now. A settled partition gets
        what it needs; one still being written only what keeps it within its read budget."""
        settled = phase(state.cadence, now, self.settings.settle) is Phase.SETTLED
        if state.compacting or state.answered(settled) or (state.retry_at is not None and now < state.retry_at):
            return None
        if state.is_global:  # resolved at once, written or not: every read of every partition pays for them
            work = global_work(state.stats, state.oldest_write, now)
            return None if work is None else (*work, False)
        if settled:
            work = needed_work(state.stats, self.settings)
            return None if work is None else (*work, False)
        hot = hot_work(state.stats, self.settings)
        return None if hot is None else (*hot, True)

    def candidates(self, now: float) -> list[Candidate]:
        out = []
        for state in self._partitions.values():
            due = self._due(state, now)
            if due is not None:
                work, reason, hot = due
                benefit, cost = benefit_and_cost(state.stats, work, self.settings)
                out.append(Candidate(state.table, state.path, work, reason, benefit, cost, hot, state.stats.data_bytes))
        return rank(out)

    def waiting(self, now: float) -> list[PartitionState]:
        """Partitions that need work which is not due yet (still hot, or backing off)."""
        return [
            s
            for s in self._partitions.values()
            if not s.compacting
            and not s.answered(phase(s.cadence, now, self.settings.settle) is Phase.SETTLED)
            and (global_work(s.stats, s.oldest_write, now) if s.is_global else needed_work(s.stats, self.settings)) is not None
            and self._due(s, now) is None
        ]

    def report(
        self, now: float, tables: Iterable[str] | None = None, owned: Callable[[str, str], bool] | None = None
    ) -> list[PartitionStatus]:
        """Status rows; ``owned`` tells whether this replica holds a partition's lease."""
        wanted = set(tables) if tables is not None else None
        rows = []
        for state in sorted(self._partitions.values(), key=lambda s: s.key):
            if wanted is not None and state.table not in wanted:
                continue
            stats = state.stats
            rows.append(
                PartitionStatus(
                    table=state.table,
                    partition=state.path or "(unpartitioned)",
                    state=self.phase_of(state, now),
                    data_files=stats.data_files,
                    small_files=stats.small_files,
                    data_bytes=stats.data_bytes,
                    records=stats.records,
                    equality_delete_files=stats.equality_delete_files,
                    equality_delete_records=stats.equality_delete_records,
                    position_delete_files=stats.position_delete_files,
                    position_delete_records=stats.position_delete_records,
                    last_write=state.cadence.last_write,
                    last_compaction=state.last_compaction,
                    settle_window_seconds=round(settle_window(state.cadence, self.settings.settle), 1),
                    read_cost=read_cost(stats),
                    ideal_read_cost=ideal_read_cost(stats, self.settings),
                    read_budget=read_budget(stats, self.settings),
                    owned=owned(state.table, state.path) if owned is not None else None,
                    oldest_write=state.oldest_write,
                )
            )
        return rows
