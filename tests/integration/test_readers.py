"""Readers that cannot apply equality deletes (pyiceberg's own scan, DuckDB's iceberg extension),
on tables the real ingester writes and the sidecar keeps portable beside it. Checked against the
independent model of the rows (tests/cdc.py): once the writer stops and the sidecar is idle,
both read exactly what the change stream implies; while it writes, each probe records whether
each reader was exact, and none may read rows the model does not hold without saying so."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyiceberg.table.snapshots import ancestors_of

from icecdc.bench.engine_readers import Reader, duckdb_connection, read_all, read_pyiceberg
from icecdc.bench.portability import ReadOutcome, exactness
from icecdc.compactor.metadata import head_snapshot
from icecdc.compactor.sidecar import create_sidecar
from icecdc.domain import summary
from icecdc.portable_snapshot import portable_snapshot, portable_snapshots
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config, TableConfig
from tests.cdc import REGIONS, SourceDatabase, orders_table
from tests.integration.test_compactor import EQUALITY_DELETES, Stream, compactor_config, running, until_answered
from tests.integration.test_global_deletes import global_delete_files, key_only_table, moving_changes
from tests.integration.test_ingest_writer import batch_writer, qualified

COLUMNS = ("id", "region", "amount", "updated_at")
KB = 1024


def with_format(config: Config, format_version: int) -> Config:
    table = config.tables[0]
    spec = {**orders_table(table.name, table.topic), "format_version": format_version}
    return config.model_copy(update={"tables": [TableConfig.model_validate(spec)]})


def probe(config: Config, source: SourceDatabase, connection: Any) -> dict[Reader, ReadOutcome]:
    """Both readers on the table's current snapshot, against the model's rows."""
    table = pyiceberg_catalog(config).load_table(config.table_ref(config.tables[0]).identifier)
    return outcomes(read_all(table, COLUMNS, connection), source.expected_rows())


def outcomes(reads, expected) -> dict[Reader, ReadOutcome]:
    return {
        read.reader: exactness(expected, None if read.rows is None else [tuple(r.values()) for r in read.rows.to_pylist()])
        for read in reads
    }


def batch_snapshot(table, snapshot_id: int) -> int | None:
    """The newest snapshot the writer committed at or before ``snapshot_id`` in its history: a
    compactor's commit holds the rows of the batch before it."""
    for snapshot in ancestors_of(table.snapshot_by_id(snapshot_id), table.metadata):
        if snapshot.summary.additional_properties.get(summary.WRITER) == summary.INGEST_WRITER:
            return snapshot.snapshot_id
    return None


class PortableProbes:
    """Reads of the newest portable snapshot (``icecdc.portable_snapshot.portable_snapshot``), each against
    the model's rows as of the batch it holds (recorded after every batch by ``batch_written``)."""

    def __init__(self, config: Config, source: SourceDatabase, connection: Any) -> None:
        self.config, self.source, self.connection = config, source, connection
        self.model_at: dict[int, list] = {}  # the writer's snapshot -> the model's rows then
        self.reads: list[dict[Reader, ReadOutcome]] = []

    def _table(self):
        return pyiceberg_catalog(self.config).load_table(self.config.table_ref(self.config.tables[0]).identifier)

    def batch_written(self) -> int:
        table = self._table()
        written = batch_snapshot(table, head_snapshot(table, self.config.table_ref(self.config.tables[0]).branch).snapshot_id)
        assert written is not None, "the writer committed"
        self.model_at[written] = self.source.expected_rows()
        return written

    def read(self, current: bool = False) -> int | None:
        """Both readers on the newest portable snapshot (``current``: on the current snapshot, as
        a reader that cannot name one reads); the writer's snapshot whose rows it holds (None when
        no snapshot is portable yet)."""
        table = self._table()
        portable = portable_snapshot(table)
        if portable is None:
            return None
        holds = batch_snapshot(table, portable.snapshot_id)
        assert holds in self.model_at, f"{portable} holds a batch the test did not write"
        assert not current or portable.is_current, f"{portable}: the current snapshot holds equality deletes"
        snapshot_id = None if current else portable.snapshot_id
        self.reads.append(outcomes(read_all(table, COLUMNS, self.connection, snapshot_id), self.model_at[holds]))
        return holds

    def until_holds(self, written: int, seconds: float, current: bool = False) -> None:
        """Read the newest portable snapshot (``current``: the current one) until it holds the
        batch ``written``, for at most ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.read(current) != written:
            assert time.monotonic() < deadline, f"no portable snapshot held batch {written} within {seconds:.0f}s"
            time.sleep(0.5)


def drain_bound(config: Config) -> float:
    """How long the sidecar may take to answer what the writer committed: settle windows, then a
    turn per partition (a join, a quiet wait per commit attempt)."""
    coordination = config.coordinator
    return (
        config.compactor.settle.max_seconds
        + 3 * coordination.session_timeout_seconds
        + coordination.commit_attempts * (coordination.max_quiet_wait_seconds + coordination.commit_backoff_max_seconds)
    )


def live_equality_deletes(spark, config: Config) -> int:
    name = qualified(config)
    spark.sql(f"REFRESH TABLE {name}")
    return int(spark.sql(f"SELECT count(*) FROM {name}.delete_files WHERE content = {EQUALITY_DELETES}").first()[0])


def test_a_live_global_equality_delete_is_refused_by_pyiceberg_and_applied_by_duckdb(spark, stack_config, unique):
    """Without the sidecar, a source with key-only before-images leaves equality deletes under
    the table's unpartitioned spec (the hardest kind): pyiceberg refuses the table rather than
    misreading it, so the probes below can tell a live equality delete; DuckDB 1.5 applies it."""
    config = key_only_table(compactor_config(stack_config, unique), ["region"])
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        source = stream.source
        stream([source.upsert(k, REGIONS[k % 3], k, 0) for k in range(1, 40)])
        stream(moving_changes(source, 1))
    assert global_delete_files(spark, config) > 0
    assert probe(config, source, duckdb_connection()) == {Reader.PYICEBERG: ReadOutcome.REFUSED, Reader.DUCKDB: ReadOutcome.EXACT}
    refused = read_pyiceberg(pyiceberg_catalog(config).load_table(config.table_ref(config.tables[0]).identifier)).refused
    assert refused is not None and "equality deletes" in refused.reason


# v3 here, v2 staged below: both formats' position deletes read by both readers, in both modes.
@pytest.mark.parametrize("format_version", [3])
def test_readers_read_exactly_while_writing_and_once_the_sidecar_is_idle(spark, stack_config, unique, format_version):
    """The sidecar beside the writer (conversions on a tight read budget), a probe after every
    batch; then the writer stops and the sidecar drains: no equality delete is left, and both
    readers read the model's rows (v2: position deletes; v3: deletion vectors)."""
    config = with_format(
        compactor_config(stack_config, unique, target_file_size_bytes=64 * KB, hot_read_budget=2), format_version
    )
    connection = duckdb_connection()
    probes: list[dict[Reader, ReadOutcome]] = []
    drain_seconds = drain_bound(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        source = stream.source
        portable = PortableProbes(config, source, connection)
        stream([source.upsert(k, REGIONS[k % 3], k, 0) for k in range(1, 60)])
        portable.batch_written()
        with running(create_sidecar(config, spark), drain_seconds) as sidecar:
            for n in range(1, 5):
                stream(moving_changes(source, n))
                written = portable.batch_written()
                probes.append(probe(config, source, connection))
                # Readers that choose their snapshot: exact on every read, and the batch is in
                # one within the bound the sidecar drains in.
                portable.until_holds(written, drain_seconds)
            until_answered(sidecar, write, drain_seconds, lambda: live_equality_deletes(spark, config) == 0)
    # While writing, a reader may refuse (pyiceberg, on a live equality delete), never misread;
    # DuckDB applies equality deletes, so it is exact throughout.
    assert all(ReadOutcome.WRONG not in p.values() for p in probes), probes
    assert all(p[Reader.DUCKDB] is ReadOutcome.EXACT for p in probes), probes
    assert portable.reads and all(set(p.values()) == {ReadOutcome.EXACT} for p in portable.reads), portable.reads
    assert live_equality_deletes(spark, config) == 0
    assert probe(config, source, connection) == {Reader.PYICEBERG: ReadOutcome.EXACT, Reader.DUCKDB: ReadOutcome.EXACT}
    assert portable_snapshots(config)[config.tables[0].name].is_current  # `icecdc portable-snapshot`'s answer


@pytest.mark.parametrize("format_version", [2])
def test_a_staged_tables_main_is_exact_for_every_reader_while_writing(spark, stack_config, unique, format_version):
    """Staged commits: the writer and the sidecar commit to the staging branch, and the sidecar
    moves main behind them. After every batch, pyiceberg (which refuses a live equality delete)
    and DuckDB read main's current snapshot, as Snowflake or Databricks would, until it holds that
    batch: every read exact against the model's rows as of the batch main holds. Once the writer
    stops, main is the branch's head and holds every row."""
    base = with_format(compactor_config(stack_config, unique, target_file_size_bytes=64 * KB, hot_read_budget=2), format_version)
    staged = base.tables[0].model_copy(update={"staging_branch": "icecdc-staged"})
    config = base.model_copy(update={"tables": [staged]})
    ref = config.table_ref(staged)
    drain_seconds = drain_bound(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        source = stream.source
        main = PortableProbes(config, source, duckdb_connection())
        stream([source.upsert(k, REGIONS[k % 3], k, 0) for k in range(1, 60)])
        first = main.batch_written()
        table = main._table()
        assert table.current_snapshot() is None and table.snapshot_by_name(ref.branch).snapshot_id == first, "main waits"
        with running(create_sidecar(config, spark), drain_seconds) as sidecar:
            main.until_holds(first, drain_seconds, current=True)
            for n in range(1, 5):
                stream(moving_changes(source, n))
                main.until_holds(main.batch_written(), drain_seconds, current=True)
            until_answered(sidecar, write, drain_seconds)
    assert len(main.reads) >= 5 and all(set(r.values()) == {ReadOutcome.EXACT} for r in main.reads), main.reads
    table = main._table()
    assert table.current_snapshot().snapshot_id == table.snapshot_by_name(ref.branch).snapshot_id
    assert probe(config, source, duckdb_connection()) == {Reader.PYICEBERG: ReadOutcome.EXACT, Reader.DUCKDB: ReadOutcome.EXACT}
    assert live_equality_deletes(spark, config) == 0  # Spark reads main too
