"""The portability target on the in-memory Iceberg model (tests/model), over random histories:
a writer committing micro-batches at random gaps, the sidecar's real tracker fed its commit
events, and the sidecar's turns choosing, planning and committing the real plans on the model,
with writer batches committed while a job runs (after its starting snapshot, before its commit).

A turn comes after every writer commit and runs every job that is due (the model's jobs take no
time: the policy always has time to act). What must hold: after every turn, no live equality
delete, partitioned or global, is as old as the share of the target at which the policy asks for
its conversion; so, with writer gaps under the rest of the target, none is ever older than the
target. And every snapshot reads the rows the change stream implies."""

from __future__ import annotations

import random
from collections.abc import Sequence

import hypothesis.strategies as st
from hypothesis import event, given, settings

from icecdc.compactor import scheduler
from icecdc.compactor.outcomes import Outcome
from icecdc.compactor.plans import PartitionFiles, RewritePlan, plan_for
from icecdc.compactor.policy import PORTABLE_SHARE, Candidate, PartitionStats, conversion_margin
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH, PartitionMetadata, PartitionTracker
from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.runtime.config import CompactorConfig, SettleConfig
from tests.cdc import REGIONS, Change, SourceDatabase, changes, image
from tests.model.compaction import global_delete_files, partition_files, partition_stats, partitions, prepare
from tests.model.iceberg import EqualityDelete, Partition, Snapshot, Table
from tests.model.writer import FULL_BEFORE_IMAGES, KEY_ONLY_BEFORE_IMAGES, commit_batch, orders_layout

KB = 1024
TARGET = 10.0
CONFIG = CompactorConfig(
    target_file_size_bytes=16 * KB,
    min_small_files=2,
    hot_read_budget=2,
    large_file_ratio=0.25,
    portable_within_seconds=TARGET,
    settle=SettleConfig(cadence_multiple=3, min_seconds=2, max_seconds=30, initial_seconds=4),
)
DUE_AGE = PORTABLE_SHARE * TARGET
# Writer gaps, all under the part of the target the policy leaves after asking (so a turn after
# each commit comes before a delete due at the last one gets past the target).
GAPS = (0.1, 0.5, 1.0, 2.0, (1 - PORTABLE_SHARE) * TARGET - 0.5)
TABLE = "db.orders"
# How fast rewrites go (bytes of their estimated cost a second; None: jobs take no time). A job's
# fixed cost alone is 4 MiB, so at these a one-partition rewrite takes 1-2 s and a job of the
# four partitions of two regions and two days 4-8 s, past the margin a due conversion has: the
# coming conversions must go first (``scheduler.convert_first``).
PACES = (None, 2 * 1024 * KB, 4 * 1024 * KB)

step = st.tuples(
    st.sampled_from(GAPS),
    changes(keys=30, days=2, max_size=6),
    st.lists(changes(keys=30, days=2, max_size=4), max_size=2),  # committed while the turn's first job runs
)


def path_of(partition: Partition) -> str:
    return "/".join(map(str, partition)) or "(unpartitioned)"


class Run:
    """One history under way: the model table, its commit times, and the sidecar's tracker."""

    def __init__(
        self, format_version: int, key_only: bool, partition_by: list[str], pace: scheduler.RewritePace | None = None
    ) -> None:
        self.pace = pace  # how fast rewrites go (None: every job takes no time)
        self.layout = orders_layout(partition_by, format_version)
        self.rules = KEY_ONLY_BEFORE_IMAGES if key_only else FULL_BEFORE_IMAGES
        self.table = Table(self.layout.primary_key, format_version, row_bytes=1024)
        self.source = SourceDatabase(key_only_before=key_only)
        self.tracker = PartitionTracker(CONFIG)
        self.committed_at: dict[int, float] = {}  # sequence number -> commit time
        self.partitions: dict[str, Partition] = {}
        self.now = 0.0

    def write(self, batch: list[Change]) -> None:
        """The writer commits a batch at ``now`` and publishes its commit event."""
        pairs = self.source.apply(batch)
        if not pairs:
            return
        parent = self.table.current
        snapshot = commit_batch(self.table, self.layout, self.rules, pairs)
        self.committed_at[snapshot.sequence_number] = self.now
        self.tracker.on_commit(self._event(parent, snapshot))

    def _event(self, parent: Snapshot, snapshot: Snapshot) -> CommitEvent:
        deltas: dict[Partition, dict[str, int]] = {}
        global_files = global_records = 0
        for f in snapshot.data.values():
            if f.path not in parent.data:
                d = deltas.setdefault(f.partition, {})
                d["data_files"] = d.get("data_files", 0) + 1
                d["data_bytes"] = d.get("data_bytes", 0) + f.size
                d["data_records"] = d.get("data_records", 0) + len(f.rows)
        for e in snapshot.deletes.values():
            if e.path in parent.deletes or not isinstance(e, EqualityDelete):
                continue
            if e.is_global:
                global_files, global_records = global_files + 1, global_records + len(e.keys)
            else:
                d = deltas.setdefault(e.partition, {})
                d["equality_delete_files"] = d.get("equality_delete_files", 0) + 1
                d["equality_delete_records"] = d.get("equality_delete_records", 0) + len(e.keys)
        for p in deltas:
            self.partitions[path_of(p)] = p
        return CommitEvent(
            TABLE,
            snapshot.snapshot_id,
            parent.snapshot_id or None,
            snapshot.sequence_number,
            int(self.now * 1000),
            "overwrite",
            "w",
            None,
            {},
            [PartitionDelta({"p": path_of(p)}, path_of(p), 0, **counts) for p, counts in deltas.items()],
            global_files,
            global_records,
        )

    def reconcile(self) -> None:
        """The sidecar re-reads the table's metadata (after each of its own compactions)."""
        snapshot = self.table.current
        metadata = {}
        for p in partitions(snapshot):
            self.partitions[path_of(p)] = p
            files = partition_files(snapshot, p)
            metadata[path_of(p)] = PartitionMetadata(
                {"p": path_of(p)}, partition_stats(files, CONFIG), None, None, self._oldest(p)
            )
        global_files = global_delete_files(snapshot)
        if global_files is not None:
            equality = [d for d in global_files.deletes if d.is_equality]
            stats = PartitionStats(equality_delete_files=len(equality), equality_delete_records=sum(d.records for d in equality))
            metadata[GLOBAL_DELETES_PATH] = PartitionMetadata({}, stats, None, None, self._oldest(None))
        self.tracker.on_metadata(TABLE, snapshot.sequence_number, metadata)

    def _oldest(self, partition: Partition | None) -> float | None:
        times = [
            self.committed_at[d.sequence_number]
            for d in self.live_equality_deletes()
            if (None if d.is_global else d.partition) == partition
        ]
        return min(times, default=None)

    def live_equality_deletes(self) -> list[EqualityDelete]:
        return [d for d in self.table.current.deletes.values() if isinstance(d, EqualityDelete)]

    def turn(self, during: Sequence[list[Change]]) -> None:
        """Every job due now, one after another, as the sidecar's turns run them."""
        converted_ahead = False
        for _ in range(50):
            step = scheduler.next_step(
                [], self.tracker.candidates(self.now), CONFIG.partitions_per_job, CONFIG.target_file_size_bytes
            )
            if self.pace is not None:
                coming = self.tracker.coming_conversions(self.now)
                margin, per_job = conversion_margin(CONFIG), CONFIG.partitions_per_job
                holding = scheduler.holding_seconds(step, self.pace, {})
                ahead = scheduler.convert_first(step, coming, holding, self.now, margin, per_job, converted_ahead)
                converted_ahead, step = ahead is not step, ahead
            if step is None:
                return
            assert isinstance(step, scheduler.Compact)
            self._job(step.candidates, during)
            during = ()
        raise AssertionError("the sidecar never ran out of due work")

    def _job(self, candidates: Sequence[Candidate], during: Sequence[list[Change]]) -> None:
        tracked = [self.tracker.get(c.table, c.partition_path) for c in candidates]
        for c, p in zip(candidates, tracked, strict=True):
            assert p is not None
            self.tracker.begin(p, hot=c.hot, last_pack=c.last_pack)
        start = self.table.current
        listed: list[PartitionFiles | None] = [
            global_delete_files(start)
            if c.partition_path == GLOBAL_DELETES_PATH
            else partition_files(start, self.partitions[c.partition_path])
            for c in candidates
        ]
        plans = [
            RewritePlan(c.work)
            if files is None
            else plan_for(
                c.work,
                files,
                CONFIG,
                hot=c.hot,
                portable=c.due_by is not None,
                deletion_vectors=self.table.format_version >= 3,
                last_pack=c.last_pack,
            )
            for c, files in zip(candidates, listed, strict=True)
        ]
        commit = None if None in listed else prepare(self.table, start, plans, listed, CONFIG)
        for batch in during:
            self.write(batch)
        # A rewrite takes the time its pace says (a conversion none): what is live now waits for it.
        seconds = self.pace.seconds_for(candidates) if self.pace is not None and scheduler.rewrites(candidates[0]) else 0.0
        waited = [self.now + seconds - self.committed_at[d.sequence_number] for d in self.live_equality_deletes()]
        assert all(age <= TARGET for age in waited), f"a {seconds:.1f}s rewrite held equality deletes past the target: {waited}"
        self.now += seconds
        outcome = Outcome.SKIPPED
        if commit is not None:
            commit()  # neither the writer's batches nor a conversion refuse it: nothing else compacts
            outcome = Outcome.COMMITTED
        event(f"{candidates[0].work.value}{' for the target' if candidates[0].due_by else ''}: {outcome.value}")
        self.reconcile()
        for p in tracked:
            assert p is not None
            self.tracker.resolve(p, outcome, "done", started=self.now, now=self.now, rng=random.Random(0))

    def ages(self) -> list[float]:
        return [self.now - self.committed_at[d.sequence_number] for d in self.live_equality_deletes()]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(step, min_size=1, max_size=25),
    format_version=st.sampled_from([2, 3]),
    key_only=st.booleans(),
    partition_by=st.sampled_from([["region"], ["region", "days(updated_at)"]]),
    pace=st.sampled_from(PACES),
)
def test_no_equality_delete_outlives_the_target_while_the_writer_writes(steps, format_version, key_only, partition_by, pace):
    run = Run(format_version, key_only, partition_by, scheduler.RewritePace(pace, measured=True) if pace else None)
    run.write([(k, REGIONS[k % 2], k % 2, k) for k in range(1, 31)])
    run.turn(())
    for gap, batch, during in steps:
        run.now += gap
        assert all(age <= TARGET for age in run.ages()), "an equality delete outlived the target between turns"
        run.write(batch)
        run.turn(during)
        assert all(age < DUE_AGE for age in run.ages()), f"due equality deletes left live after a turn: {run.ages()}"
    assert sorted(image(row) for row in run.table.current.rows()) == run.source.expected_images()
