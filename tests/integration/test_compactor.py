"""The compactor sidecar against real Spark, Iceberg, the SQLite catalog and the broker, fed by
the real ingester's commits and commit events. Row sets are checked against the independent CDC
model (tests/cdc.py) and against the table just before each compaction (time travel)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.metadata import TableMetadata, load_table_partitions
from icecdc.compactor.plans import plan_rewrite
from icecdc.compactor.policy import Work
from icecdc.compactor.rewrite import PartitionCompaction
from icecdc.compactor.sidecar import CompactorSidecar, create_sidecar
from icecdc.compactor.status import collect, render
from icecdc.domain.errors import CommitConflict
from icecdc.domain.events import CompactionEvent, CompactionOutcome
from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.domain.tablespec import CREATED_TABLE_PROPERTIES
from icecdc.ingest.records import records_to_dataframe
from icecdc.ingest.writer import BatchWriter
from icecdc.jvm import actions
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import MANIFEST_MIN_MERGE_COUNT, IcebergTable
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config
from tests.cdc import SourceDatabase, kafka_records, table_rows
from tests.integration.test_ingest_writer import batch_writer, config_for, qualified, read_topic
from tests.processes import icecdc_process, write_config

KB = 1024
EQUALITY_DELETES, POSITION_DELETES = 2, 1


@contextmanager
def running(sidecar: CompactorSidecar, join_seconds: float) -> Iterator[CompactorSidecar]:
    """The sidecar's loop on a thread of its own while the block runs, beside the writer; then
    stopped, joined (at most ``join_seconds``) and closed, however the block ends."""
    stop = threading.Event()
    worker = threading.Thread(target=sidecar.run, kwargs={"stop": stop})
    worker.start()
    try:
        yield sidecar
    finally:
        stop.set()
        worker.join(join_seconds)
        sidecar.close()


def until_answered(
    sidecar: CompactorSidecar, write: BatchWriter, seconds: float, holds: Callable[[], bool] = lambda: True
) -> None:
    """Wait, at most ``seconds``, until the sidecar running beside the test (``running``) has
    read the commit event of every commit ``write`` made and then gone idle (``idle(2.0)``), and
    ``holds`` holds.

    Idle alone is not enough when asked from another thread: between a job's end and the loop's
    next poll, the sidecar has been quiet for as long as the job ran (no event is read during
    one), and a batch committed after the job re-read the table is not known yet, so nothing is
    due. ``--until-idle`` is not fooled there, since it reads every table's metadata before it
    stops (``idle_after_reconcile``); a test cannot ask for that read from beside the loop, so it
    counts the events instead."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (
        sidecar.feed.commit_events >= write.stats.commits and sidecar.idle(2.0) and holds()
    ):
        time.sleep(0.5)


def compactor_config(stack_config: Config, unique: str, **settings) -> Config:
    config = config_for(stack_config, unique)
    compactor = {
        "consumer_group": f"compactor-{unique}",
        # No fixed metrics port: two suites on one machine (or a user's own sidecar) may hold 9402.
        "http": {"port": None},
        "min_small_files": 2,
        "reconcile_seconds": 3600,
        "settle": {"cadence_multiple": 3, "min_seconds": 1, "initial_seconds": 3, "max_seconds": 8},
        # The portability target far off: these tests drive the read budget's and the settle
        # rules' work turn by turn (on a loaded machine a batch's deletes pass 5 s between two
        # turns); the target's own tests set it.
        "portable_within_seconds": 3600,
        **settings,
    }
    # No maintenance: these tests drive the compactor turn by turn, and a maintenance run would
    # take a turn first when due (it has its own tests, in test_coordinator).
    coordinator = {**config.coordinator.model_dump(by_alias=True), "maintenance": {"enabled": False}}
    return Config.model_validate(
        {
            **config.model_dump(by_alias=True),
            "compaction_topic": f"compactions-{unique}",
            "compactor": compactor,
            "coordinator": coordinator,
        }
    )


class Stream:
    """The upstream database and the ingester's writer, one micro-batch per call."""

    def __init__(self, spark, config: Config, write) -> None:
        self.spark, self.topic, self.write = spark, config.tables[0].topic, write
        self.source = SourceDatabase()
        self.offset = self.batch = 0

    def __call__(self, pairs) -> None:
        self.write(records_to_dataframe(self.spark, kafka_records(self.topic, pairs, self.offset)), self.batch)
        self.offset += len(pairs)
        self.batch += 1


def table_metadata(config: Config) -> TableMetadata:
    """The compactor's read of the test table's metadata, as it reconciles."""
    loaded = load_table_partitions(
        pyiceberg_catalog(config), config.table_ref(config.tables[0]), config.tables[0], config.compactor
    )
    assert loaded is not None, "the table exists"
    return loaded


def compaction_of(
    spark, config: Config, layout: TableLayout, partition: PartitionKey, target: int, key_index: KeyIndex | None = None
) -> PartitionCompaction:
    """``key_index``: conversions through it, in this process (else on executors). Its commit
    merges the table's manifests as the sidecar's do (``compactor.merge_manifests``)."""
    table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
    return PartitionCompaction(
        spark,
        table,
        layout,
        partition,
        config.catalog.properties,
        target,
        key_index=key_index,
        merge_manifests=config.compactor.merge_manifests,
    )


def partition_files(spark, name: str, region: str) -> dict[int, list]:
    rows = spark.sql(
        f"SELECT content, file_path, file_size_in_bytes, record_count FROM {name}.files WHERE partition.region = '{region}'"
    ).collect()
    out: dict[int, list] = {0: [], 1: [], 2: []}
    for row in rows:
        out[row.content].append(row)
    return out


def assert_reconcile_matches_files(spark, sidecar, name: str, table: str) -> None:
    """The sidecar's reconcile, which opens only manifests it has not read before, counts what
    Spark's ``files`` metadata table lists, partition by partition; a second reconcile of the
    unchanged table opens no manifest at all."""
    opened = {"table": table, "source": "opened"}
    sidecar.reconciler.reconcile(table)
    before = REGISTRY.get_sample_value("icecdc_compactor_manifests_read_total", opened)
    sidecar.reconciler.reconcile(table)
    assert REGISTRY.get_sample_value("icecdc_compactor_manifests_read_total", opened) == before
    layout = sidecar.layouts[table]
    expected: dict[str, list[int]] = {}
    # The sidecar read the table as it is now; Spark's catalog may hold it as a few commits ago.
    spark.sql(f"REFRESH TABLE {name}")
    for row in spark.sql(f"SELECT content, partition, file_size_in_bytes, record_count FROM {name}.files").collect():
        counts = expected.setdefault(layout.partition_path(layout.partition_from_metadata(row.partition.asDict())), [0] * 7)
        at = {0: 0, POSITION_DELETES: 3, EQUALITY_DELETES: 5}[row.content]
        counts[at] += 1
        counts[at + 1] += row.record_count
        if row.content == 0:
            counts[2] += row.file_size_in_bytes
    actual = {
        s.path: [
            s.stats.data_files,
            s.stats.records,
            s.stats.data_bytes,
            s.stats.position_delete_files,
            s.stats.position_delete_records,
            s.stats.equality_delete_files,
            s.stats.equality_delete_records,
        ]
        for s in sidecar.tracker
        if s.table == table and not s.is_global
    }
    assert actual == expected


def assert_compactions_kept_rows(spark, name: str, events: list[CompactionEvent]) -> None:
    """Every committed compaction's snapshot holds exactly the rows of the snapshot before it."""
    parents = {r.snapshot_id: r.parent_id for r in spark.sql(f"SELECT snapshot_id, parent_id FROM {name}.snapshots").collect()}
    for event in events:
        if event.outcome is CompactionOutcome.COMMITTED:
            before = spark.sql(f"SELECT * FROM {name} VERSION AS OF {parents[event.snapshot_id]}").collect()
            after = spark.sql(f"SELECT * FROM {name} VERSION AS OF {event.snapshot_id}").collect()
            assert sorted(map(tuple, before)) == sorted(map(tuple, after)), event


def test_only_the_settled_partition_is_compacted_while_the_hot_one_takes_writes(spark, stack_config, unique):
    # Windows follow the measured cadence (no cap within reach): on a loaded machine a slow batch
    # is a slow writer, not a settled partition. The cold partition stops after four batches and
    # settles once it has been quiet for three of its own gaps, however long those gaps are; the
    # hot one is written every batch until then, and at most MAX_BATCHES times in all.
    settle = {"cadence_multiple": 3, "min_seconds": 1, "initial_seconds": 3, "max_seconds": 3600}
    # A budget no hot partition reaches: within it, a hot partition waits for settling.
    config = compactor_config(stack_config, unique, target_file_size_bytes=256 * KB, settle=settle, hot_read_budget=1000)
    name = qualified(config)
    max_batches = 40
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        sidecar = create_sidecar(config, spark)
        src = stream.source
        events: list[CompactionEvent] = []
        compacted_at: int | None = None
        # The writer goes on after the compaction, as a live stream does: the hot partition is
        # still hot when the status is read.
        while (compacted_at is None or stream.batch < compacted_at + 2) and stream.batch < max_batches:
            n = stream.batch
            pairs = [src.upsert(k, "eu", 100 * k + n, 0) for k in range(1, 40)]  # hot: every batch
            if n < 4:  # cold: stops after four batches, with deletes
                pairs += [src.upsert(k, "us", 100 * k + n, 1) for k in range(100, 130)]
                pairs += [src.delete(k) for k in (100 + n,)]
            stream(pairs)
            done = sidecar.run_once(poll_timeout=0.5)
            if done:
                events += done
                compacted_at = stream.batch
                assert all(e.partition_path.startswith("region=us") for e in done), "the hot partition must be left alone"
        sidecar.status.write(force=True)
        report = collect(config)
        assert_reconcile_matches_files(spark, sidecar, name, config.tables[0].name)
        sidecar.close()
    hot_batches = stream.batch

    assert [e.outcome for e in events] == [CompactionOutcome.COMMITTED], events
    cold = partition_files(spark, name, "us")
    cold_bytes = sum(f.file_size_in_bytes for f in cold[0])
    assert len(cold[0]) <= math.ceil(cold_bytes / (256 * KB)) + 1
    assert cold[EQUALITY_DELETES] == []
    hot = partition_files(spark, name, "eu")
    assert len(hot[0]) == hot_batches and len(hot[EQUALITY_DELETES]) == hot_batches  # untouched: one of each per batch
    assert table_rows(spark, name) == src.expected_rows()
    assert_compactions_kept_rows(spark, name, events)

    # Fixed point: a second pass over the compacted partition finds nothing to do.
    layout = sidecar.layouts[config.tables[0].name]
    us_key = next(tuple(s.partition[t.name] for t in layout.partition) for s in sidecar.tracker if s.path.startswith("region=us"))
    files = compaction_of(spark, config, layout, us_key, 256 * KB).files()
    assert files is not None
    assert all(plan_rewrite(files, work, config.compactor).empty for work in (Work.MINOR, Work.DELETE_MERGE))

    # The status report tells the two apart, with counts that match the table.
    by_partition = {row.partition.split("/")[0]: row for row in report.partitions}
    assert by_partition["region=eu"].state == "hot" and by_partition["region=eu"].equality_delete_files == hot_batches
    assert by_partition["region=us"].equality_delete_files == 0 and by_partition["region=us"].last_compaction
    assert "region=us" in render(report)

    # Each compaction is announced when it starts (with its starting snapshot), then reported.
    published = [CompactionEvent.from_json(m.value()) for m in read_topic(config, config.compaction_topic, 2)]
    assert [(e.outcome, e.partition_path, e.starting_snapshot_id) for e in published] == [
        x
        for e in events
        for x in (
            (CompactionOutcome.STARTED, e.partition_path, e.starting_snapshot_id),
            (e.outcome, e.partition_path, e.starting_snapshot_id),
        )
    ]

    table = config.tables[0].name
    sample = REGISTRY.get_sample_value
    assert sample("icecdc_compactions_total", {"table": table, "kind": "delete-merge", "outcome": "committed"}) == 1
    assert sample("icecdc_compactor_bytes_read_total", {"table": table}) == events[0].bytes_rewritten > 0
    assert sample("icecdc_compactor_delete_files_removed_total", {"table": table}) == events[0].delete_files_removed == 4
    assert sample("icecdc_compactor_partitions", {"table": table, "state": "hot"}) == 1
    assert sample("icecdc_compactor_settle_to_compacted_seconds_count", {"table": table}) == 1


def large_files_settled_at_once(stack_config: Config, unique: str) -> Config:
    """Files of 8 KB and more are "large" (a first batch of 3,000 rows makes one), and a partition
    is settled the moment the writer stops: windows follow the cadence (three gaps between two
    batches, long on a loaded machine) unless capped, and a hot partition gets the cheaper
    conversion."""
    return compactor_config(
        stack_config,
        unique,
        target_file_size_bytes=32 * KB,
        large_file_ratio=0.25,
        settle={"min_seconds": 0, "initial_seconds": 0, "max_seconds": 0.001},
    )


def test_equality_deletes_on_a_large_file_become_position_deletes(spark, stack_config, unique):
    config = large_files_settled_at_once(stack_config, unique)
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        stream([src.upsert(k, "eu", k, 0) for k in range(1, 3001)])
        [large] = partition_files(spark, name, "eu")[0]
        assert large.file_size_in_bytes >= 8 * KB
        stream([src.upsert(k, "eu", 7, 0) for k in (10, 20, 30)] + [src.delete(k) for k in (40, 50)])
        before = table_rows(spark, name)
        table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
        written = actions.current_manifests(table)
        sidecar = create_sidecar(config, spark)
        [event] = sidecar.run_once(poll_timeout=1.0)
        sidecar.close()

    assert event.outcome is CompactionOutcome.COMMITTED and event.kind == "delete-merge"
    assert event.data_files_rewritten == 0 and event.position_delete_files_added == 1
    # The writer's manifests (a data and a delete manifest a batch, merged by its own commits only
    # from 8 on) are merged by the sidecar's commit, data and delete ones alike, which leaves the
    # table's own min-count-to-merge as it was.
    assert sum(not m.deletes for m in written) == 2, written
    merged = actions.current_manifests(table)
    assert sum(not m.deletes for m in merged) == 1 and sum(m.deletes for m in merged) == 1, merged
    assert table.properties()[MANIFEST_MIN_MERGE_COUNT] == CREATED_TABLE_PROPERTIES[MANIFEST_MIN_MERGE_COUNT]
    files = partition_files(spark, name, "eu")
    assert large.file_path in {f.file_path for f in files[0]}  # not rewritten
    assert files[EQUALITY_DELETES] == []
    [positions] = files[POSITION_DELETES]
    assert positions.record_count == 5  # three updated and two deleted keys
    assert table_rows(spark, name) == before == src.expected_rows()


@pytest.mark.slow
def test_compaction_during_writes_to_the_same_partition_loses_no_delete(spark, stack_config, unique):
    # A low hot ceiling makes the sidecar compact the partition the writer keeps changing.
    config = compactor_config(stack_config, unique, hot_max_delete_files=2, min_small_files=2)
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        stream([src.upsert(k, "eu", k, 0) for k in range(1, 200)])
        with running(create_sidecar(config, spark), 120) as sidecar:
            for n in range(1, 13):
                changes = [src.upsert(k, "eu", 1000 * n + k, 0) for k in range(n, 200, 7) if k in src.rows]
                changes += [src.delete(k) for k in range(n * 3, 200, 29) if k in src.rows]
                changes += [src.upsert(k, "us", n, 1) for k in range(n * 5, 200, 31) if k in src.rows]  # moves
                changes += [src.upsert(k, "eu", n, 0) for k in range(200 + n * 3, 203 + n * 3)]  # inserts
                stream(changes)  # any writer failure raises here
            # Let the partition settle and the sidecar finish, then stop it.
            until_answered(sidecar, write, 60)

    events = sidecar.stats.results
    assert sum(e.outcome is CompactionOutcome.COMMITTED for e in events) >= 2, events
    assert not [e for e in events if e.outcome is CompactionOutcome.FAILED], events
    assert table_rows(spark, name) == src.expected_rows()
    assert_compactions_kept_rows(spark, name, events)
    assert partition_files(spark, name, "eu")[EQUALITY_DELETES] == []  # settled at the end: merged


@pytest.mark.slow
def test_a_compactor_killed_mid_compaction_restarts_and_finishes(spark, stack_config, unique, tmp_path):
    config = compactor_config(stack_config, unique, settle={"min_seconds": 0, "initial_seconds": 0})
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        stream([src.upsert(k, "eu", k, 0) for k in range(1, 70)])
        for n in range(1, 4):
            stream([src.upsert(k, "eu", 10 * k + n, 0) for k in range(1, 60)] + [src.delete(60 + n)])
    expected = src.expected_rows()
    before = partition_files(spark, name, "eu")
    path = write_config(config, tmp_path / "icecdc.yaml")

    crashed = icecdc_process("compact", "--config", str(path), "--until-idle", "2", failpoint="compactor-before-commit:1")
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == expected
    assert {f.file_path for f in partition_files(spark, name, "eu")[0]} == {f.file_path for f in before[0]}

    finished = icecdc_process("compact", "--config", str(path), "--until-idle", "2")
    assert finished.returncode == 0, finished.stderr[-3000:]
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == expected
    after = partition_files(spark, name, "eu")
    assert after[EQUALITY_DELETES] == [] and len(after[0]) == 1

    status = icecdc_process("status", "--config", str(path), "--json")
    assert status.returncode == 0, status.stderr
    [row] = orjson.loads(status.stdout)["partitions"]
    assert row["data_files"] == 1 and row["equality_delete_files"] == 0 and row["state"] == "settled"


def test_transform_partitions_are_found_and_compacted(spark, stack_config, unique):
    """bucket, truncate and hours partitions: the partition filter must select each one."""
    config = compactor_config(stack_config, unique, settle={"min_seconds": 0, "initial_seconds": 0})
    table = {
        **config.tables[0].model_dump(by_alias=True),
        "partition_by": ["bucket(3, id)", "truncate(1, region)", "hours(updated_at)"],
    }
    config = Config.model_validate({**config.model_dump(by_alias=True), "tables": [table]})
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        for n in range(3):
            stream([src.upsert(k, "eu" if k % 2 else "us", 10 * k + n, 0) for k in range(1, 30)])
        stream([src.delete(k) for k in range(1, 30, 4)])
        before = table_rows(spark, name)
        sidecar = create_sidecar(config, spark)
        while events := sidecar.run_once(poll_timeout=0.5):
            assert all(e.outcome is CompactionOutcome.COMMITTED for e in events), events
        sidecar.close()

    partitions = spark.sql(f"SELECT partition, content, count(*) AS n FROM {name}.files GROUP BY partition, content").collect()
    assert len({r.partition for r in partitions}) >= 4
    assert all(r.content == 0 and r.n == 1 for r in partitions), partitions
    assert table_rows(spark, name) == before == src.expected_rows()
    assert len(sidecar.stats.results) == len({r.partition for r in partitions})


def test_a_conflicting_compaction_commits_nothing_and_removes_its_files(spark, stack_config, unique):
    config = compactor_config(stack_config, unique)
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        for n in range(3):
            stream([src.upsert(k, "eu", 10 * k + n, 0) for k in range(1, 30)])
    sidecar = create_sidecar(config, spark)
    sidecar.reconciler.reconcile_all()
    layout = sidecar.layouts[config.tables[0].name]
    [state] = list(sidecar.tracker)
    key = tuple(state.partition[t.name] for t in layout.partition)
    first, second = (compaction_of(spark, config, layout, key, 1 << 20) for _ in range(2))
    plans = [plan_rewrite(c.files(), Work.DELETE_MERGE, config.compactor) for c in (first, second)]
    assert first.run(plans[0], {}).committed is not None
    data_dir = Path(layout.data_location)
    files_before = set(data_dir.rglob("*.parquet"))
    with pytest.raises(CommitConflict):  # the second compaction of the same files must not commit
        second.run(plans[1], {})
    assert set(data_dir.rglob("*.parquet")) == files_before  # what it wrote is gone again
    assert table_rows(spark, name) == src.expected_rows()
    assert len(partition_files(spark, name, "eu")[0]) == 1
    sidecar.close()
