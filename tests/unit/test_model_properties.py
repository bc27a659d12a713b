"""Random histories on the in-memory Iceberg model (tests/model), thousands in seconds: the
ingester's per-batch rules and the compactor's real plans, against the rows the change stream
implies (tests/cdc.py). The Spark property tests (tests/integration) run a few such histories on
the real stack; these run the same kinds of history by the thousand on the spec's rules."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence

import hypothesis.strategies as st
import pytest
from hypothesis import event, example, given, settings
from hypothesis.control import currently_in_test_context

from icecdc.compactor.plans import (
    PartitionFiles,
    RewritePlan,
    plan_conversion,
    plan_for,
    plan_hot,
    plan_older_spec,
    plan_resolution,
    plan_rewrite,
)
from icecdc.compactor.policy import Work, hot_work, needed_work, older_spec_work
from icecdc.domain.layout import OlderSpec, TableLayout
from icecdc.domain.sort_order import UNSORTED, SortDirection, SortOrder, sort_order_of
from icecdc.domain.sourcespec import SourceRules
from icecdc.runtime.config import CompactorConfig
from tests.cdc import REGIONS, Change, SourceDatabase, changes, flavoured_batches, flavoured_history, image
from tests.model.compaction import (
    global_delete_files,
    older_spec_partitions,
    partition_files,
    partition_stats,
    partitions,
    prepare,
)
from tests.model.iceberg import (
    PARTITIONED_SPEC_ID,
    UNPARTITIONED_SPEC_ID,
    CommitConflict,
    EqualityDelete,
    Partition,
    Row,
    Snapshot,
    SpecViolation,
    Table,
)
from tests.model.writer import FULL_BEFORE_IMAGES, KEY_ONLY_BEFORE_IMAGES, commit_batch, orders_layout, started

KB = 1024
EXAMPLES = settings(max_examples=1000, deadline=None)


def read(snapshot: Snapshot) -> list[tuple]:
    return sorted(image(row) for row in snapshot.rows())


# --- the ingester: one history of micro-batches, flavoured as a Debezium source sends them ---

PARTITIONINGS = [["region"], ["region", "days(updated_at)"], ["days(updated_at)"], ["bucket(4, id)"], []]


@EXAMPLES
@given(
    history=flavoured_history,
    partition_by=st.sampled_from(PARTITIONINGS),
    source_sends=st.sampled_from(["full before-images", "full before-images, trusted for the key only", "the key only"]),
)
def test_every_batch_of_a_random_history_leaves_the_rows_the_stream_implies(history, partition_by, source_sends):
    source = SourceDatabase(key_only_before=source_sends == "the key only")
    rules = FULL_BEFORE_IMAGES if source_sends == "full before-images" else KEY_ONLY_BEFORE_IMAGES
    layout = orders_layout(partition_by)
    table = Table(layout.primary_key)
    for number, batch in enumerate(flavoured_batches(source, history), start=1):
        snapshot = commit_batch(table, layout, rules, batch)
        assert read(snapshot) == source.expected_images(), f"after batch {number}"


# --- the compactor: writer batches, with maintenance between them and during them ---

PLANNED = ["convert", "hot", "merge", "minor", "policy", "job", "convert-job", "resolve"]


def maintenance_of(planned: Sequence[str]) -> st.SearchStrategy[tuple]:
    """One maintenance step, of one of the ``planned`` kinds."""
    kinds = st.sampled_from(planned)
    works = st.sampled_from([Work.DELETE_MERGE, Work.MINOR])  # a job's work
    return st.tuples(
        kinds,
        st.integers(1, 63),  # which live partitions, by rank: a bit each
        works,
        st.lists(changes(keys=30, days=2, max_size=5), max_size=2),  # writer batches committed while it runs
        # A compaction of other partitions (another lease: a resolution of the global deletes holds
        # its own) from the same snapshot, committed after it, as another replica would.
        st.one_of(st.none(), st.tuples(kinds, st.integers(1, 63), works)),
    )


def histories(planned: Sequence[str], min_size: int = 1, max_size: int = 6) -> st.SearchStrategy[list]:
    """Writer batches, each maybe followed by maintenance of one of the ``planned`` kinds."""
    steps = st.tuples(changes(keys=30, days=2, max_size=10), st.one_of(st.none(), maintenance_of(planned)))
    return st.lists(steps, min_size=min_size, max_size=max_size)


compaction_history = histories(PLANNED)
TARGET = 16 * KB
SETTINGS = {
    ratio: CompactorConfig(target_file_size_bytes=TARGET, min_small_files=2, hot_read_budget=2, large_file_ratio=ratio)
    for ratio in (0.75, 0.25)
}


def plans_for(
    kind: str,
    ranks: int,
    work: Work,
    snapshot: Snapshot,
    config: CompactorConfig,
    format_version: int = 2,
    spec_id: int = PARTITIONED_SPEC_ID,
) -> list[tuple[RewritePlan, PartitionFiles]]:
    """The product's plans for one maintenance step, each with the listing it was made from.
    ``spec_id``: the table's current spec; the partitions of older ones get their rewrite into
    it only (``older-spec``, or ``policy`` as the tracker asks for it once they settled)."""
    dv = format_version >= 3
    if kind == "resolve":
        files = global_delete_files(snapshot)
        return [] if files is None else [(plan_resolution(files), files)]
    live = partitions(snapshot, spec_id)
    older = older_spec_partitions(snapshot, spec_id)
    if kind == "older-spec":
        if not older:
            return []
        old_spec, partition = older[ranks % len(older)]
        files = partition_files(snapshot, partition, spec_id=old_spec)
        return [(plan_older_spec(files), files)]
    if kind == "policy" and older and (chosen := ranks % (len(live) + len(older))) >= len(live):
        old_spec, partition = older[chosen - len(live)]
        files = partition_files(snapshot, partition, spec_id=old_spec)
        needed = older_spec_work(partition_stats(files, config))
        return [] if needed is None else [(plan_for(needed[0], files, config), files)]
    if not live:
        return []
    if kind in ("job", "convert-job"):
        chosen = [partition_files(snapshot, p, spec_id=spec_id) for r, p in enumerate(live) if ranks >> r & 1]
        if kind == "convert-job":  # the portability target's work due together: one commit
            hot = ranks & 1 == 0  # on a hot partition with the pack its read budget asks for
            return [
                (plan_for(Work.CONVERT, files, config, hot=hot, portable=True, deletion_vectors=dv), files) for files in chosen
            ]
        return [(plan_rewrite(files, work, config, dv), files) for files in chosen]
    files = partition_files(snapshot, live[ranks % len(live)], spec_id=spec_id)
    if kind == "convert":
        return [(plan_conversion(files), files)]
    if kind == "hot":
        return [(plan_hot(files, config, dv), files)]
    if kind in ("merge", "minor"):
        return [(plan_rewrite(files, Work.DELETE_MERGE if kind == "merge" else Work.MINOR, config, dv), files)]
    # What the sidecar would choose: a hot partition by its read budget, else by what it needs.
    stats = partition_stats(files, config)
    hot = ranks & 1 == 0
    needed = hot_work(stats, config) if hot else needed_work(stats, config)
    return [] if needed is None else [(plan_for(needed[0], files, config, hot, deletion_vectors=dv), files)]


class ModelHistory:
    """One history under way on the model: the table's layout (its current spec and sort order,
    which a compaction reads when it starts), the ingester's (the one it read when it last
    started), the rows the stream implies after each writer snapshot, and the maintenance
    snapshots."""

    def __init__(self, layout: TableLayout, rules: SourceRules, source: SourceDatabase, table: Table, config: CompactorConfig):
        self.layout, self.rules, self.source, self.table, self.config = layout, rules, source, table, config
        self.ingester = started(table, layout)
        self.expected: dict[int, list] = {}
        self.maintained: list[Snapshot] = []

    def restart(self) -> None:
        """The ingester starts again: it reads the table's layout, and whether older specs hold data."""
        self.ingester = started(self.table, self.layout)

    def write(self, batch: list[Change]) -> None:
        pairs = self.source.apply(batch)
        if pairs:
            self.expected[commit_batch(self.table, self.ingester, self.rules, pairs).snapshot_id] = self.source.expected_images()

    def maintain(self, maintain: tuple) -> None:
        """One maintenance step: its compactions planned from one snapshot, the writer batches
        committed while they run, then their commits."""
        table, config = self.table, self.config
        *first, during, overlapping = maintain
        start = table.current
        commits = []
        leased: set[object] = set()
        for kind, ranks, work in (first, *([overlapping] if overlapping else [])):
            planned = plans_for(kind, ranks, work, start, config, table.format_version, self.layout.spec_id)
            leases = {"global deletes"} if kind == "resolve" else {leased_partition(start, files) for _, files in planned}
            if not planned or leases & leased:
                continue  # one compaction of a partition at a time (the coordinator's leases)
            leased |= leases
            plans, files = zip(*planned, strict=True)
            commit = prepare(table, start, plans, files, config, self.layout)
            if commit is not None:
                commits.append((kind, commit))
        for batch in during:
            self.write(batch)
        # Neither the writer's batches nor a compaction of other partitions refuse a compaction;
        # a resolution of the global deletes touches files of every partition: of it and another
        # compaction that both change one file, the second to commit fails Iceberg's validation,
        # and is planned again from the new snapshot.
        kinds = [kind for kind, _ in commits]
        for n, (kind, commit) in enumerate(commits):
            try:
                committed = commit()
            except CommitConflict:
                assert n and "resolve" in kinds, f"{kind} refused beside {kinds}"
                if currently_in_test_context():
                    event(f"{kind}: refused beside {kinds[0]}")
                continue
            self.maintained.append(committed)
            if currently_in_test_context():  # the explicit tests below run it too
                event(
                    f"{kind}: {committed.operation}{' during writer commits' if during else ''}{' beside another' if n else ''}"
                )

    def step(self, batch: list[Change], maintain: tuple | None) -> None:
        self.write(batch)
        if maintain is not None:
            self.maintain(maintain)


def run_history(
    steps: Sequence[tuple[list[Change], tuple | None]],
    layout: TableLayout,
    rules: SourceRules,
    source: SourceDatabase,
    table: Table,
    config: CompactorConfig,
) -> tuple[dict[int, list], list[Snapshot]]:
    """Write the history's batches and run its maintenance on the model; returns the rows the
    stream implies after each writer snapshot, and the maintenance snapshots."""
    history = ModelHistory(layout, rules, source, table, config)
    history.write(INITIAL)
    for batch, maintain in steps:
        history.step(batch, maintain)
    return history.expected, history.maintained


INITIAL = [(k, REGIONS[k % 2], k % 2, k) for k in range(1, 31)]


def leased_partition(snapshot: Snapshot, files: PartitionFiles) -> tuple[int, Partition]:
    """The partition a compaction leases: its listing's, whatever the plan rewrites (a conversion
    rewrites no data file, and a partition may hold only delete files), with its spec."""
    (partition,) = {(snapshot.data[f.path].spec_id, snapshot.data[f.path].partition) for f in files.data} | {
        (snapshot.deletes[d.path].spec_id, snapshot.deletes[d.path].partition) for d in files.deletes
    }
    return partition


def assert_history_kept_rows(table: Table, expected: dict[int, list], maintained: list[Snapshot]) -> None:
    """Every writer snapshot holds the rows the stream implies after its batch; every
    maintenance snapshot exactly its parent's rows."""
    for snapshot_id, rows in expected.items():
        assert read(table.snapshot(snapshot_id)) == rows, f"writer snapshot {snapshot_id}"
    for snapshot in maintained:
        assert snapshot.parent_id is not None
        parent = expected.get(snapshot.parent_id) or read(table.snapshot(snapshot.parent_id))
        assert read(snapshot) == parent, f"maintenance snapshot {snapshot.snapshot_id}"


@EXAMPLES
@given(
    steps=compaction_history,
    partition_by=st.sampled_from([["region"], ["region", "days(updated_at)"]]),
    key_only=st.booleans(),
    format_version=st.sampled_from([2, 3]),
    row_bytes=st.sampled_from([256, 1024, 4096]),
    large_file_ratio=st.sampled_from(sorted(SETTINGS)),
)
# Two conversions of one partition, from one snapshot: the coordinator leases the partition, so
# the second never runs (a conversion rewrites no data file, so its lease is its listing's).
@example(
    steps=[([(1, "eu", 1, 0), (1, None, 0, 0)], ("convert", 1, Work.DELETE_MERGE, [], ("convert", 1, Work.DELETE_MERGE)))],
    partition_by=["region", "days(updated_at)"],
    key_only=False,
    format_version=2,
    row_bytes=256,
    large_file_ratio=0.25,
)
def test_random_histories_with_compactions_between_and_during_writer_commits_keep_every_row(
    steps, partition_by, key_only, format_version, row_bytes, large_file_ratio
):
    # A source of full before-images deletes in partitions; one of keys alone deletes globally.
    source = SourceDatabase(key_only_before=key_only)
    rules = KEY_ONLY_BEFORE_IMAGES if key_only else FULL_BEFORE_IMAGES
    layout = orders_layout(partition_by, format_version)
    table = Table(layout.primary_key, format_version, row_bytes)
    expected, maintained = run_history(steps, layout, rules, source, table, SETTINGS[large_file_ratio])
    assert read(table.current) == source.expected_images()
    assert_history_kept_rows(table, expected, maintained)


def _a_global_delete_and_an_equality_delete_on_one_large_file() -> tuple[Table, TableLayout, SourceDatabase, CompactorConfig]:
    """A v3 table where one large file of ``us`` has a global delete and an equality delete that
    apply to it: key 1 deleted by a key-only source (a global delete), then inserted again in
    ``us`` (an equality delete there)."""
    layout = orders_layout(["region"], format_version=3)
    table = Table(layout.primary_key, format_version=3, row_bytes=1024)
    source, config = SourceDatabase(key_only_before=True), SETTINGS[0.25]
    for batch in ([(k, REGIONS[k % 2], 0, k) for k in range(1, 31)], [(1, None, 0, 0)], [(1, "us", 0, 0)]):
        commit_batch(table, layout, KEY_ONLY_BEFORE_IMAGES, source.apply(batch))
    return table, layout, source, config


def test_a_rewrite_that_adds_a_deletion_vector_beside_a_resolution_leaves_two():
    """Why a delete merge on format v3 converts nothing: a resolution of the global deletes (a
    ``RowDelta``) and a ``RewriteFiles`` that converts the same large file, both from one
    snapshot (two replicas: the global deletes and the partition are two leases), each add a
    deletion vector for it; Iceberg validates concurrently added deletion vectors for a
    ``RowDelta`` only, so the rewrite commits the second one, which the spec forbids."""
    table, _, _, config = _a_global_delete_and_an_equality_delete_on_one_large_file()
    start = table.current
    global_files, us = global_delete_files(start), partition_files(start, ("us",))
    assert global_files is not None
    resolution = prepare(table, start, [plan_resolution(global_files)], [global_files], config)
    merge = prepare(table, start, [plan_rewrite(us, Work.DELETE_MERGE, config)], [us], config)  # as on v2
    assert resolution is not None and merge is not None
    resolution()
    with pytest.raises(SpecViolation, match="two deletion vectors"):
        merge()


def test_a_resolution_and_a_merge_of_the_same_file_leave_one_deletion_vector():
    """On format v3 the merge leaves the large file's equality deletes to a conversion, a
    ``RowDelta``: planned from the same snapshot as the resolution and committed after it, it
    fails Iceberg's validation cleanly; planned again from the new snapshot, it commits. The file
    ends with one deletion vector and the table with the rows the stream implies."""
    table, _, source, config = _a_global_delete_and_an_equality_delete_on_one_large_file()
    start = table.current
    global_files, us = global_delete_files(start), partition_files(start, ("us",))
    assert global_files is not None
    merge = plan_for(Work.DELETE_MERGE, us, config, deletion_vectors=True)
    assert not merge.convert and not merge.rewrite, "the large file's equality delete is left to a conversion"
    resolution = prepare(table, start, [plan_resolution(global_files)], [global_files], config)
    conversion = prepare(table, start, [plan_for(Work.CONVERT, us, config, hot=True, portable=True)], [us], config)
    assert resolution is not None and conversion is not None
    resolution()
    with pytest.raises(CommitConflict, match="deletion vectors"):
        conversion()
    again = partition_files(table.current, ("us",))
    retried = prepare(table, table.current, [plan_for(Work.CONVERT, again, config, portable=True)], [again], config)
    assert retried is not None
    retried()
    live = table.current.deletes.values()
    assert not [d for d in live if isinstance(d, EqualityDelete) and (d.partition == ("us",) or d.is_global)]
    assert read(table.current) == source.expected_images()


# --- a partition-spec change and a sort-order change in the middle of a history ---

NEW_SPEC_ID = 2  # spec 0 is the first, 1 the unpartitioned one of the global deletes
SPEC_CHANGES = [
    (["region"], ["region", "bucket(4, id)"]),
    (["region", "days(updated_at)"], ["region"]),
    (["region"], ["days(updated_at)"]),
    (["bucket(4, id)"], ["region"]),
    (["region"], ["bucket(4, id)"]),
]
# Orders by the columns the model holds as Iceberg holds them (its amounts are strings).
SORT_ORDERS = [
    UNSORTED,
    sort_order_of(1, [("id", "identity", "asc", "nulls-first")]),
    sort_order_of(2, [("region", "identity", "asc", "nulls-first"), ("updated_at", "identity", "desc", "nulls-last")]),
    sort_order_of(3, [("updated_at", "identity", "asc", "nulls-last"), ("id", "identity", "desc", "nulls-first")]),
]
# Rewrites of older-spec partitions twice as likely as another kind: they are what is new here.
spec_change_history = histories([*PLANNED, "older-spec", "older-spec"], max_size=4)


def in_sort_order(rows: Sequence[Row], order: SortOrder) -> bool:
    """Whether ``rows`` are in ``order``, by Python's own stable sort: one pass per field, the
    last field first (the model's rows hold no nulls, so the null order is not at stake)."""
    ordered = list(rows)
    for f in reversed(order.fields):
        ordered.sort(key=operator.itemgetter(f.column), reverse=f.direction is SortDirection.DESC)
    columns = [f.column for f in order.fields]
    return [[row[c] for c in columns] for row in ordered] == [[row[c] for c in columns] for row in rows]


def rewrite_older_specs(history: ModelHistory) -> None:
    """The sidecar once every partition of an older spec has settled: each rewritten into the
    current spec, one job after the other."""
    for _ in range(100):
        if not older_spec_partitions(history.table.current, history.layout.spec_id):
            return
        history.maintain(("older-spec", 0, Work.REWRITE_OLDER_SPEC, [], None))
    raise AssertionError("older-spec partitions left after 100 rewrites")


def spec_change_example(steps: list, **differences: object) -> Callable:
    """An ``@example`` of the test below: ``steps``, the spec changed from region to region and
    bucket before the first, the sort order to ``id`` after the last, and what else
    ``differences`` says."""
    plain = {
        "spec_change": SPEC_CHANGES[0],
        "spec_change_at": 0,
        "sort_orders": (UNSORTED, SORT_ORDERS[1]),
        "sort_change_at": 4,
        "restarts": frozenset(),
        "tail": [],
        "key_only": False,
        "format_version": 2,
        "row_bytes": 1024,
        "large_file_ratio": 0.25,
    }
    return example(steps=steps, **{**plain, **differences})


@EXAMPLES
@given(
    steps=spec_change_history,
    spec_change=st.sampled_from(SPEC_CHANGES),
    spec_change_at=st.integers(0, 3),
    sort_orders=st.tuples(st.sampled_from(SORT_ORDERS), st.sampled_from(SORT_ORDERS[1:])),
    sort_change_at=st.integers(0, 4),
    restarts=st.frozensets(st.integers(0, 4)),
    tail=histories(PLANNED, min_size=0, max_size=2),
    key_only=st.booleans(),
    format_version=st.sampled_from([2, 3]),
    row_bytes=st.sampled_from([256, 1024, 4096]),
    large_file_ratio=st.sampled_from(sorted(SETTINGS)),
)
# A delete committed while an older spec's partition is rewritten: global (older-spec data is
# live), at a sequence number above the rewrite's start, so it still applies to the moved rows.
@spec_change_example([([(2, "eu", 0, 5)], ("older-spec", 1, Work.MINOR, [[(1, None, 0, 0)]], None))])
# A resolution of the global deletes and a rewrite of an older spec's partition, from one
# snapshot, both touch its file: the second to commit (the rewrite: the resolution's deletion
# vector names a file it replaces) is refused, and the partition is rewritten at the end.
@spec_change_example([([(1, "us", 0, 7)], ("resolve", 1, Work.MINOR, [], ("older-spec", 1, Work.MINOR)))], format_version=3)
# Once the older spec is rewritten, the restarted ingester deletes by partition of the new spec
# again: a row moved to another region is deleted in the partition the rewrite moved it to, at
# the rewrite's starting sequence number, below the delete's; with keys alone, by the key's bucket.
@spec_change_example(
    [([(3, "us", 0, 3)], ("older-spec", 0, Work.MINOR, [], ("older-spec", 1, Work.MINOR)))],
    tail=[([(2, "us", 1, 9)], ("merge", 8, Work.DELETE_MERGE, [], None))],
)
@spec_change_example(
    [([(3, "us", 0, 3)], ("older-spec", 0, Work.MINOR, [], ("older-spec", 1, Work.MINOR)))],
    spec_change=(["region"], ["bucket(4, id)"]),
    tail=[([(2, None, 0, 0), (4, "apac", 1, 9)], ("convert", 4, Work.DELETE_MERGE, [], None))],
    key_only=True,
    format_version=3,
)
# The sort order changes between the rewrites of two older-spec partitions, two days of one
# region that the new spec puts in one partition: the first is sorted by id, the second by region,
# then time descending.
@spec_change_example(
    [
        ([(2, "eu", 1, 2), (4, "eu", 1, 4), (8, "eu", 1, 8), (3, "us", 0, 3)], None),
        ([(5, "us", 1, 5)], ("older-spec", 0, Work.MINOR, [], None)),
        ([(7, "us", 1, 7)], ("older-spec", 0, Work.MINOR, [[(10, "eu", 1, 10)]], None)),
    ],
    spec_change=(["region", "days(updated_at)"], ["region"]),
    spec_change_at=1,
    sort_orders=(SORT_ORDERS[1], SORT_ORDERS[2]),
    sort_change_at=2,
    row_bytes=256,
    large_file_ratio=0.75,
)
def test_random_histories_with_a_spec_change_and_a_sort_order_change_in_the_middle_keep_every_row(
    steps,
    spec_change,
    spec_change_at,
    sort_orders,
    sort_change_at,
    restarts,
    tail,
    key_only,
    format_version,
    row_bytes,
    large_file_ratio,
):
    """The table's spec changes before step ``spec_change_at`` (after the last: once all are
    done), and the ingester restarts, as docs/compactor.md asks; it also restarts before the steps
    in ``restarts``. The sort order changes before step ``sort_change_at``. Then every partition of
    the old spec is rewritten, the ingester restarts, and the ``tail`` runs. Every snapshot holds
    the rows the stream implies; once the old spec's partitions are rewritten no file of it is
    live and the ingester deletes by partition again; every live data file's rows are of its
    partition; every file a compaction wrote is in the sort order the table had when it started."""
    before, after = spec_change
    first_order, second_order = sort_orders
    source = SourceDatabase(key_only_before=key_only)
    rules = KEY_ONLY_BEFORE_IMAGES if key_only else FULL_BEFORE_IMAGES
    table = Table(("id",), format_version, row_bytes)
    history = ModelHistory(
        dataclasses.replace(orders_layout(before, format_version), sort_order=first_order),
        rules,
        source,
        table,
        SETTINGS[large_file_ratio],
    )
    history.write(INITIAL)
    orders = [(0, first_order)]  # from which snapshot on (after it), the order compactions sort by
    for n, step in enumerate([*steps, None]):
        if n == min(spec_change_at, len(steps)):
            # As ``layout_from_pyiceberg`` reads it: the table's other specs, the global deletes' too.
            older = (OlderSpec(PARTITIONED_SPEC_ID, history.layout.partition), OlderSpec(UNPARTITIONED_SPEC_ID, ()))
            new_layout = orders_layout(after, format_version, NEW_SPEC_ID)
            history.layout = dataclasses.replace(new_layout, sort_order=history.layout.sort_order, older_specs=older)
            history.restart()
            spec_changed_at = table.current.snapshot_id
        if n == min(sort_change_at, len(steps)):
            history.layout = dataclasses.replace(history.layout, sort_order=second_order)
            orders.append((table.current.snapshot_id, second_order))
        if n in restarts:
            history.restart()
        if step is not None:
            history.step(*step)
    if older_spec_partitions(table.current, NEW_SPEC_ID) != older_spec_partitions(table.snapshot(spec_changed_at), NEW_SPEC_ID):
        event("older-spec partitions rewritten before the end")
    rewrite_older_specs(history)
    live = table.current
    assert not [f for f in (*live.data.values(), *live.deletes.values()) if f.spec_id == PARTITIONED_SPEC_ID]
    history.restart()
    assert not history.ingester.older_spec_data
    for step in tail:
        history.step(*step)
    assert read(table.current) == source.expected_images()
    assert_history_kept_rows(table, history.expected, history.maintained)
    for f in {path: f for snapshot in table.snapshots for path, f in snapshot.data.items()}.values():
        spec = history.layout.of_spec(f.spec_id)
        assert spec is not None and {spec.partition_of(row) for row in f.rows} <= {f.partition}, f
    for snapshot in history.maintained:
        order = next(o for since, o in reversed(orders) if snapshot.snapshot_id > since)
        assert snapshot.parent_id is not None
        for path in snapshot.data.keys() - table.snapshot(snapshot.parent_id).data.keys():
            assert in_sort_order(snapshot.data[path].rows, order), (order, snapshot.data[path])


def test_an_ingester_left_running_across_a_spec_change_misses_rows_once_the_old_spec_is_rewritten():
    """Why the ingester stops at its next commit after a spec change (docs/compactor.md, "Older
    partition specs"): one that kept the layout it read would go on writing the old spec, with
    deletes by the old spec's partitions; once the sidecar has rewritten those files into the
    current spec, its next update of a row deletes nothing there, and the old version is read
    beside the new."""
    table, source = Table(("id",)), SourceDatabase()
    history = ModelHistory(orders_layout(["region"]), FULL_BEFORE_IMAGES, source, table, SETTINGS[0.25])
    history.write(INITIAL)
    history.layout = orders_layout(["region", "bucket(4, id)"], spec_id=NEW_SPEC_ID)  # and no restart
    rewrite_older_specs(history)
    history.write([(1, "us", 0, 7)])
    assert sorted(amount for key, _, amount, _ in read(table.current) if key == 1) == ["0.01", "0.07"]
    assert read(table.current) != source.expected_images()
    assert_history_kept_rows(table, {}, history.maintained)  # the rewrite itself kept every row
