"""Tables kept for writers that are not ours, on the real stack, with the sidecar beside them.

Each table is configured by name alone and written by a job that knows nothing of icecdc
(icecdc/testbed/writers/, icecdc/testbed/upsert_sink/): a Structured Streaming ``foreachBatch`` running ``MERGE
INTO`` / ``UPDATE`` / ``DELETE`` in merge-on-read mode (position deletes on v2, deletion vectors
on v3) or copy-on-write mode, an append job adding many small files a commit, and a Flink-style
upsert sink writing equality deletes with Iceberg's own Java writers. For each: no writer commit
is refused, the table equals the model of the writer's changes, every snapshot the sidecar
committed reads its parent's rows, and once the writes stop every partition ends compacted
within its settle window and a bound from the configuration (docs/compactor.md, "Beside other
writers")."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from icecdc.compactor.sidecar import CompactorSidecar, create_sidecar
from icecdc.coordinator.maintenance import TableMaintenance
from icecdc.domain import summary as summary_keys
from icecdc.domain.writer_commits import WriterKind
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import IcebergTable
from icecdc.runtime.config import Config, MaintenanceConfig, TableConfig
from icecdc.testbed.upsert_sink import UpsertSink, create_table
from icecdc.testbed.writers.jobs import JobSettings, Writer, WriterJob, writer_job
from icecdc.testbed.writers.table_checks import compacted, live_files, sidecar_snapshots_changing_rows
from tests.integration.test_compactor import compactor_config, running

pytestmark = pytest.mark.slow

WRITER_COMMITS = 16  # after the two the writer makes before the sidecar joins
TRIGGER_SECONDS = 1.0
CHANGES = 40  # a batch's changes
# A busy machine runs a MERGE slower than its trigger: the wait for the writer's commits allows
# this much beyond one trigger interval per commit.
WRITER_MARGIN_SECONDS = 300.0
# After the writes stop, a partition ends compacted within its settle window and this bound: a
# watch interval to see the last commit, the sidecar's turn, one job and its commit per partition.
COMPACTED_WITHIN_SECONDS = 60.0


def kept_config(stack_config: Config, unique: str, name: str) -> Config:
    """A sidecar that keeps one table, configured by name only; its hot rules as eager as can be
    (a budget of 1 and a ceiling of 2 delete files), so the rules for icecdc's own tables would
    work on every hot partition the writer deletes from."""
    config = compactor_config(
        stack_config,
        unique,
        watch_interval_seconds=0.5,
        hot_read_budget=1.0,
        hot_max_delete_files=2,
        # Longer than a MERGE takes on a busy machine, so that a partition settles only once the
        # writer has really left it, not while its next MERGE is in flight.
        settle={"cadence_multiple": 3, "min_seconds": 10, "initial_seconds": 12, "max_seconds": 20},
    )
    return config.model_copy(update={"tables": [TableConfig(name=name)]})


@dataclass(frozen=True)
class Case:
    writer: Writer
    format_version: int
    kind: WriterKind  # what the sidecar must find the writer to be


CASES = [
    Case(Writer.MERGE_ON_READ, 2, WriterKind.DELETES_IN_PLACE),
    Case(Writer.MERGE_ON_READ, 3, WriterKind.DELETES_IN_PLACE),
    Case(Writer.COPY_ON_WRITE, 2, WriterKind.REPLACES_FILES),
    Case(Writer.APPENDS, 2, WriterKind.APPENDS),
    Case(Writer.UPSERT_SINK, 2, WriterKind.EQUALITY_DELETES),
    # On v3 the sink writes equality deletes only (no DVs in Flink's 1.10.2 sink).
    Case(Writer.UPSERT_SINK, 3, WriterKind.EQUALITY_DELETES),
]


def job_for(case: Case, spark: Any, table: str, work_dir: Path) -> WriterJob:
    settings = JobSettings(
        format_version=case.format_version,
        trigger_seconds=TRIGGER_SECONDS,
        changes=CHANGES,
        refresh=True,  # the sidecar commits in this process
        margin_seconds=WRITER_MARGIN_SECONDS,
    )
    return writer_job(case.writer, spark, table, work_dir, settings)


def wait_compacted(spark: Any, table: str, config: Config) -> tuple[dict[tuple[str, int], int], float]:
    written = time.monotonic()
    deadline = written + config.compactor.settle.max_seconds + COMPACTED_WITHIN_SECONDS
    files = live_files(spark, table)
    while time.monotonic() < deadline and not compacted(files):
        time.sleep(1.0)
        files = live_files(spark, table)
    return files, time.monotonic() - written


def report(case: Case, sidecar: CompactorSidecar, commits: int, refused: list[Any], seconds: float) -> None:
    gate = sidecar.compactions._gate.stats
    print(
        f"{case}: {commits} writer commits, {len(refused)} refused; sidecar {sidecar.stats.outcomes}, "
        f"{gate.attempts} commit attempts, {gate.conflicts} conflicts; compacted {seconds:.0f} s after the last write"
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.writer.value}-v{c.format_version}")
def test_a_writer_that_is_not_ours_is_never_refused_beside_the_sidecar(spark, stack_config: Config, unique: str, tmp_path, case):
    table = f"it.kept_{unique}"
    config = kept_config(stack_config, unique, table)
    name = config.table_ref(config.tables[0]).qualified
    job = job_for(case, spark, name, tmp_path)
    # The sidecar joins a writer already running: its history tells what kind of writer it is (a
    # writer's first delete in place cannot be foreseen; docs/compactor.md, "Limits known today").
    job.begin()
    sidecar = create_sidecar(config, spark)
    with running(sidecar, join_seconds=config.coordinator.max_compaction_seconds):
        job.write(WRITER_COMMITS)
        job.wait()
        files, seconds = wait_compacted(spark, name, config)
    end = job.end()
    # The sidecar's conflicts (printed) depend on how its commits and the writer's interleave on a
    # busy machine, a figure for a benchmark; the test asserts what holds at any pace.
    report(case, sidecar, end.commits, end.refused, seconds)
    assert end.refused == []
    assert end.differences == []
    assert sidecar.tracker.writer_kind(table) is case.kind
    assert compacted(files), f"not compacted {seconds:.0f} s after the last write: {files}"
    # A copy-on-write writer rewrites the files it changes, leaving the sidecar nothing to do.
    assert sidecar.stats.committed >= 1 or case.writer is Writer.COPY_ON_WRITE
    assert sidecar_snapshots_changing_rows(spark, name) == []


def test_expiry_keeps_the_newest_exactly_once_marker_of_a_flink_job_and_of_a_kafka_connect_sink(spark, stack_config, unique):
    """A kept table's writers recover from their newest marker snapshot: maintenance expires the
    snapshots before the oldest of those markers, and none from it on."""
    config = kept_config(stack_config, unique, f"it.markers_{unique}")
    ref = config.table_ref(config.tables[0])
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ref.catalog}.it")
    create_table(spark, ref.qualified, 2)
    sink = UpsertSink(spark, ref.qualified, changes_per_checkpoint=20)
    checkpoints = [sink.commit_checkpoint(50), sink.commit_checkpoint(), sink.commit_checkpoint()]
    assert all(checkpoints)
    marker = f"{summary_keys.KAFKA_CONNECT_OFFSETS_PREFIX}control-iceberg.connect-group"
    appends = spark.createDataFrame(
        [(10_000 + n, "eu", n, "new") for n in range(3)], "id long, region string, amount long, status string"
    )
    appends = appends.selectExpr("*", "current_timestamp() AS updated_at")
    appends.writeTo(ref.qualified).option(f"snapshot-property.{marker}", '{"0": 7}').append()
    for _ in range(3):
        appends.selectExpr("id + 100 AS id", "region", "amount", "status", "updated_at").writeTo(ref.qualified).append()
    table = IcebergTable(JavaBridge(spark), ref)
    table.refresh()
    marked = table.newest_recovery_snapshots()
    assert set(marked) == {"flink", "kafka-connect"} and marked["flink"].snapshot_id == checkpoints[-1].snapshot_id
    before = set(table.snapshot_times_ms())
    time.sleep(0.01)
    result = TableMaintenance(table, {}).expire(
        int(time.time() * 1000), MaintenanceConfig(snapshot_retention_seconds=0, retain_last=1), []
    )
    after = set(table.snapshot_times_ms())
    assert {c.snapshot_id for c in checkpoints[:2]} == before - after, "only the snapshots before the oldest marker go"
    assert checkpoints[-1].snapshot_id in after and marked["kafka-connect"].snapshot_id in after
    assert set(result.protected_snapshot_ids) >= {checkpoints[-1].snapshot_id, marked["kafka-connect"].snapshot_id}
