"""Compactions keep a table's declared sort order (``ALTER TABLE ... WRITE ORDERED BY id``) on the
real stack, with both rewrite engines, on format v2 and v3: batches whose ids interleave across
files (and arrive in no order within them) are compacted by the sidecar, and then every live data
file holds its rows sorted by id, the table holds the model's rows, every compaction kept its
parent's rows, and a point lookup on id has one data file per partition whose id bounds admit it.
A table ordered by a transform the arrow engine cannot apply is rewritten by Spark's engine."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from icecdc.compactor.sidecar import create_sidecar
from icecdc.domain.events import CompactionOutcome
from icecdc.domain.sort_order import SortDirection
from icecdc.runtime.config import RewriteEngine
from tests.cdc import REGIONS, table_rows
from tests.integration.test_compaction_jobs import orders_of_format
from tests.integration.test_compactor import Stream, assert_compactions_kept_rows, compactor_config, table_metadata
from tests.integration.test_ingest_writer import batch_writer, qualified

BATCHES = 4
KEYS = 120


ID = "id"
# A transform the arrow engine cannot apply: such a table is rewritten by Spark's engine. Sorted
# by truncate(10, id) and then id is sorted by id.
TRUNCATED = "truncate(10, id), id"


@pytest.mark.parametrize(
    ("format_version", "engine", "partitions_per_job", "order_by"),
    [
        (2, RewriteEngine.ARROW, 4, ID),
        (2, RewriteEngine.SPARK, 4, ID),
        (2, RewriteEngine.SPARK, 1, ID),  # one partition a job: no fanout writer
        (3, RewriteEngine.SPARK, 4, ID),  # v3 always rewrites through Spark, lineage kept
        (2, RewriteEngine.ARROW, 4, TRUNCATED),
    ],
)
def test_compactions_write_every_file_sorted_by_the_table_s_sort_order(
    spark, stack_config, unique, format_version, engine, partitions_per_job, order_by
):
    # Every partition settled at once, so that the sidecar compacts them all in a few turns.
    settle = {"min_seconds": 0, "initial_seconds": 0, "max_seconds": 0.001}
    config = orders_of_format(
        compactor_config(stack_config, unique, settle=settle, partitions_per_job=partitions_per_job, rewrite_engine=engine.value),
        format_version,
    )
    name = qualified(config)
    with batch_writer(spark, config) as write:
        spark.sql(f"ALTER TABLE {name} WRITE ORDERED BY {order_by}")
        stream = Stream(spark, config, write)
        src = stream.source
        # Batch n writes ids n, n + BATCHES, ... in descending order, over three regions: each
        # file's id range overlaps every other's. Later batches update and delete some of them.
        for n in range(BATCHES):
            upserts = [src.upsert(k, REGIONS[k % 3], 100 * k + n, 0) for k in reversed(range(n, KEYS, BATCHES))]
            updates = [src.upsert(k, REGIONS[k % 3], 7 * k, 0) for k in range(0, n * 10, 3)] if n else []
            deletes = [src.delete(k) for k in range(n, KEYS, 17) if k in src.rows] if n > 1 else []
            stream(upserts + updates + deletes)
        order = table_metadata(config).layout.sort_order
        assert [f.column for f in order.fields][-1] == "id" and {f.direction for f in order.fields} == {SortDirection.ASC}
        assert order.applies is (order_by == ID)
        lineage = _lineage(spark, name) if format_version >= 3 else None
        sidecar = create_sidecar(config, spark)
        events = []
        while turn := sidecar.run_once(poll_timeout=0.5):
            events += turn
        sidecar.close()

    assert events and {e.outcome for e in events} == {CompactionOutcome.COMMITTED}, events
    files = spark.sql(
        f"SELECT content, file_path, partition.region AS region, readable_metrics.id.lower_bound AS low, "
        f"readable_metrics.id.upper_bound AS high FROM {name}.files"
    ).collect()
    data = [f for f in files if f.content == 0]
    assert len(data) == 3 and not [f for f in files if f.content != 0], files  # one file a partition, no deletes left
    arrow = engine is RewriteEngine.ARROW and format_version < 3 and order_by == ID
    for f in data:
        assert f.file_path.endswith("-compacted.parquet") is arrow, f.file_path  # which engine wrote it
        ids = pq.read_table(f.file_path.removeprefix("file:"), columns=["id"]).column("id").to_pylist()
        assert ids == sorted(ids), f.file_path
    assert table_rows(spark, name) == src.expected_rows()
    assert_compactions_kept_rows(spark, name, events)
    if lineage is not None:
        assert _lineage(spark, name) == lineage  # each row keeps its _row_id through the rewrites
    for key in (1, KEYS // 2, KEYS - 2):
        for region in REGIONS:
            admitting = [f for f in data if f.region == region and f.low <= key <= f.high]
            assert len(admitting) <= 1, (key, region, admitting)


def _lineage(spark, name: str) -> dict[int, int]:
    return {r.id: r._row_id for r in spark.sql(f"SELECT id, _row_id FROM {name}").collect()}
