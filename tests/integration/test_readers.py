"""Readers that cannot apply equality deletes (pyiceberg's own scan, DuckDB's iceberg extension),
on tables the real ingester writes and the sidecar keeps portable beside it. Checked against the
independent model of the rows (tests/cdc.py): once the writer stops and the sidecar is idle,
both read exactly what the change stream implies; while it writes, each probe records whether
each reader was exact, and none may read rows the model does not hold without saying so."""

from __future__ import annotations

import time
from typing import Any

import pytest

from icecdc.bench.portability import ReadOutcome, exactness
from icecdc.bench.readers import Reader, duckdb_connection, read_all, read_pyiceberg
from icecdc.compactor.sidecar import create_sidecar
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config, TableConfig
from tests.cdc import REGIONS, SourceDatabase, orders_table
from tests.integration.test_compactor import EQUALITY_DELETES, Stream, compactor_config, running
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
    expected = source.expected_rows()
    return {
        read.reader: exactness(expected, None if read.rows is None else [tuple(r.values()) for r in read.rows.to_pylist()])
        for read in read_all(table, COLUMNS, connection)
    }


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


@pytest.mark.parametrize("format_version", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_readers_read_exactly_while_writing_and_once_the_sidecar_is_idle(spark, stack_config, unique, format_version):
    """The sidecar beside the writer (conversions on a tight read budget), a probe after every
    batch; then the writer stops and the sidecar drains: no equality delete is left, and both
    readers read the model's rows (v2: position deletes; v3: deletion vectors)."""
    config = with_format(
        compactor_config(stack_config, unique, target_file_size_bytes=64 * KB, hot_read_budget=2), format_version
    )
    connection = duckdb_connection()
    probes: list[dict[Reader, ReadOutcome]] = []
    # Settle windows, then a turn per partition (a join, a quiet wait per commit attempt).
    coordination = config.coordinator
    drain_seconds = (
        config.compactor.settle.max_seconds
        + 3 * coordination.session_timeout_seconds
        + coordination.commit_attempts * (coordination.max_quiet_wait_seconds + coordination.commit_backoff_max_seconds)
    )
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        source = stream.source
        stream([source.upsert(k, REGIONS[k % 3], k, 0) for k in range(1, 60)])
        with running(create_sidecar(config, spark), drain_seconds) as sidecar:
            for n in range(1, 5):
                stream(moving_changes(source, n))
                probes.append(probe(config, source, connection))
            deadline = time.monotonic() + drain_seconds
            while time.monotonic() < deadline and not (sidecar.idle(2.0) and live_equality_deletes(spark, config) == 0):
                time.sleep(0.5)
    # While writing, a reader may refuse (pyiceberg, on a live equality delete), never misread;
    # DuckDB applies equality deletes, so it is exact throughout.
    assert all(ReadOutcome.WRONG not in p.values() for p in probes), probes
    assert all(p[Reader.DUCKDB] is ReadOutcome.EXACT for p in probes), probes
    assert live_equality_deletes(spark, config) == 0
    assert probe(config, source, connection) == {Reader.PYICEBERG: ReadOutcome.EXACT, Reader.DUCKDB: ReadOutcome.EXACT}
