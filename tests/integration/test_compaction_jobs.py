"""Compaction jobs of several partitions on the real stack: one Spark job and ONE commit for
random sets of partitions (regions x days), with writer batches committed between and during
the jobs, on format v2 and v3, with files small enough to be rewritten or large enough to have
their equality deletes converted.

The rows are checked against the independent CDC model (tests/cdc.py) at every writer snapshot,
and every job's snapshot must hold exactly its parent's rows (time travel)."""

from __future__ import annotations

import functools
import time

import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import HealthCheck, event, example, given, settings

from icecdc.compactor.plans import plan_rewrite
from icecdc.compactor.policy import Work
from icecdc.compactor.rewrite import Committer, CompactionJob, CompactionResult, PartitionCompaction
from icecdc.compactor.sidecar import create_sidecar
from icecdc.domain import summary
from icecdc.domain.events import CompactionOutcome
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import IcebergTable
from icecdc.runtime.config import Config, RewriteEngine, TableConfig
from tests.cdc import REGIONS, changes, orders_table, table_rows
from tests.histories import History, run_history
from tests.integration.test_compactor import (
    EQUALITY_DELETES,
    Stream,
    assert_compactions_kept_rows,
    compactor_config,
    table_metadata,
)
from tests.integration.test_ingest_writer import batch_writer, qualified

KB = 1024
DAYS = (0, 1)


def orders_of_format(config: Config, format_version: int) -> Config:
    table = config.tables[0]
    spec = {**orders_table(table.name, table.topic), "format_version": format_version}
    return config.model_copy(update={"tables": [TableConfig.model_validate(spec)]})


# One micro-batch: keys move between partitions (two regions by two days).
batch = changes(keys=40, regions=REGIONS[:2], days=len(DAYS), max_size=25)
job = st.tuples(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),  # which live partitions, by rank
        st.sampled_from([Work.DELETE_MERGE, Work.DELETE_MERGE, Work.MINOR]),
    ),
    st.one_of(st.none(), batch),  # a writer batch that commits while the job runs
)
history = st.lists(st.tuples(batch, st.one_of(st.none(), job)), min_size=3, max_size=5)


def compact(
    history: History, chosen: tuple[list[int], Work], commit: Committer, *, merge_manifests: bool = False
) -> list[CompactionResult]:
    """One job of the chosen live partitions, one plan each, in one commit (which merges the
    table's manifests too, with ``merge_manifests``: a transaction, retried over the writer's
    commits as they land)."""
    ranks, work = chosen
    config = history.config
    loaded = table_metadata(config)
    live = sorted(loaded.partitions.values(), key=lambda p: loaded.layout.partition_path(_key(loaded.layout, p)))
    keys = [_key(loaded.layout, live[r]) for r in ranks if r < len(live)]
    if not keys:
        return []
    compaction = CompactionJob(
        history.stream.spark,
        history.table,
        loaded.layout,
        keys,
        config.catalog.properties,
        config.compactor.target_file_size_bytes,
        merge_manifests=merge_manifests,
    )
    listed = compaction.files()
    assert listed is not None
    plans = [plan_rewrite(files, work, config.compactor) for files in listed]
    results = compaction.run(plans, {summary.COMPACTOR: "property-test"}, commit=commit)
    if any(r.committed for r in results):
        touched = sum(not p.empty for p in plans)
        event(f"one commit for {min(touched, 3)}{'+' if touched > 3 else ''} partitions")
    return results


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    steps=history,
    format_version=st.sampled_from([2, 3]),
    large_file_ratio=st.sampled_from([0.75, 0.03]),
    merge_manifests=st.booleans(),
)
# Four partitions in one job while the writer moves rows between two of them.
@example(
    steps=[
        ([(k, REGIONS[k % 2], k % 3 % 2, k) for k in range(1, 9)], None),
        ([(1, "eu", 1, 5), (2, None, 0, 0)], (([0, 1, 2, 3], Work.DELETE_MERGE), [(3, "eu", 0, 7), (4, None, 0, 0)])),
        ([(5, "us", 0, 9)], (([1, 3], Work.DELETE_MERGE), None)),
    ],
    format_version=3,
    large_file_ratio=0.03,
    merge_manifests=True,
)
def test_random_histories_with_jobs_of_several_partitions_keep_every_row(
    spark, stack_config, steps, format_version, large_file_ratio, merge_manifests
):
    unique = f"jobs{time.monotonic_ns()}"
    config = orders_of_format(
        compactor_config(stack_config, unique, target_file_size_bytes=64 * KB, large_file_ratio=large_file_ratio), format_version
    )
    run_history(
        spark,
        config,
        [(k, REGIONS[k % 2], k // 2 % 2, k) for k in range(1, 41)],
        steps,
        functools.partial(compact, merge_manifests=merge_manifests),
    )


def _key(layout, partition) -> tuple:
    return tuple(partition.partition.get(term.name) for term in layout.partition)


def test_small_settled_partitions_are_compacted_by_one_job_and_one_commit(spark, stack_config, unique):
    # Every partition settled at once (none is hot, which would give it a job of its own).
    settle = {"min_seconds": 0, "initial_seconds": 0, "max_seconds": 0.001}
    config = compactor_config(stack_config, unique, settle=settle, partitions_per_job=4)
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        # Nine partitions (three regions by three days), each written by all three batches, with
        # updates, moves between partitions and deletes.
        for n in range(3):
            upserts = [src.upsert(k, REGIONS[(k // 3 + n) % 3], 10 * k + n, k % 3) for k in range(1, 60)]
            stream(upserts + [src.delete(k) for k in range(n + 1, 60, 13) if k in src.rows])
        before = table_rows(spark, name)
        sidecar = create_sidecar(config, spark)
        turns = []
        while events := sidecar.run_once(poll_timeout=0.5):
            turns.append(events)
        sidecar.close()

    assert [len(t) for t in turns] == [4, 4, 1], turns  # four partitions a job at most
    for events in turns:
        assert {e.outcome for e in events} == {CompactionOutcome.COMMITTED}, events
        assert len({e.snapshot_id for e in events}) == 1, "one commit a job"
    first = turns[0][0].snapshot_id
    [tags] = spark.sql(f"SELECT summary FROM {name}.snapshots WHERE snapshot_id = {first}").collect()
    assert sorted(orjson.loads(tags.summary[summary.PARTITIONS])) == sorted(e.partition_path for e in turns[0])
    files = spark.sql(f"SELECT partition, content, count(*) AS n FROM {name}.files GROUP BY partition, content").collect()
    assert len(files) == 9 and all(r.content == 0 and r.n == 1 for r in files), files  # one file a partition, no deletes
    assert table_rows(spark, name) == before == src.expected_rows()
    assert_compactions_kept_rows(spark, name, [e for events in turns for e in events])
    assert all(e.data_files_added == 1 and e.data_files_rewritten == 3 for events in turns for e in events), turns
    assert not [r for r in files if r.content == EQUALITY_DELETES]


def test_the_arrow_and_spark_engines_merge_a_partition_to_the_same_rows_and_file_statistics(spark, stack_config, unique):
    """One partition with updates, deletes and moves out, merged by each engine from the same
    snapshot (rolled back between the two): the same rows, the model's, and the arrow engine's
    file carries the same Iceberg column statistics as Spark's (read from its footer)."""
    config = compactor_config(stack_config, unique, target_file_size_bytes=1 << 20)
    name = qualified(config)
    table_name = config.tables[0].name
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        stream([src.upsert(k, "eu", k, 0) for k in range(1, 200)])
        stream([src.upsert(k, "eu", 1000 + k, 0) for k in range(1, 200, 3)] + [src.delete(k) for k in range(2, 200, 17)])
        stream([src.upsert(k, "us", 5, 0) for k in range(4, 200, 11) if k in src.rows])  # moves out of eu
    expected = src.expected_rows()
    loaded = table_metadata(config)
    eu = next(_key(loaded.layout, p) for p in loaded.partitions.values() if p.partition.get("region") == "eu")
    table = IcebergTable(JavaBridge(spark), config.table_ref(table_name))
    table.refresh()
    start = table.current_snapshot()
    assert start is not None
    results = {}
    for engine in (RewriteEngine.ARROW, RewriteEngine.SPARK):
        spark.sql(f"CALL {config.catalog.name}.system.rollback_to_snapshot('{table_name}', {start.snapshot_id})")
        job = PartitionCompaction(spark, table, loaded.layout, eu, config.catalog.properties, 1 << 20, engine)
        files = job.files()
        assert files is not None
        result = job.run(plan_rewrite(files, Work.DELETE_MERGE, config.compactor), {summary.COMPACTOR: "engine-test"})
        assert result.committed is not None and result.counts.data_files_added == 1
        new = spark.sql(
            f"SELECT file_path, record_count, lower_bounds, upper_bounds FROM {name}.files WHERE partition.region = 'eu'"
        ).collect()
        results[engine] = (table_rows(spark, name), [(r.record_count, r.lower_bounds, r.upper_bounds) for r in new], new)
    arrow, spark_engine = results[RewriteEngine.ARROW], results[RewriteEngine.SPARK]
    assert arrow[0] == spark_engine[0] == expected
    assert arrow[1] == spark_engine[1]  # one file, same count and the same bounds on every column
    assert arrow[2][0].file_path.endswith("-compacted.parquet")  # written by the arrow engine
