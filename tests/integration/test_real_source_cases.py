"""The real Debezium connector's cases (issue 28), each table checked against PostgreSQL's own
rows after ``run_ingest`` to idle: default and FULL replica identity with row moves between
partitions, multi-row statements, rolled-back transactions and key changes; truncates on a one-
and a multi-partition topic; ADD COLUMN and ALTER COLUMN TYPE mid-stream; the column types; all
tables in one connector, and the connector killed in the middle and replaying from its offsets.

One cluster, one connector and one workload for every case, to keep the suite's time down: the
engine runs three times (phase 1 ends with a clean stop, phase 2 with a SIGKILL while its
offsets are still at the phase's start, so that phase 3 starts by replaying all of phase 2) and
the ingester runs to idle after each phase; the test functions then compare one table each.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from icecdc.ingest import metrics
from icecdc.ingest.batch_decisions import IngestStats
from icecdc.ingest.runner import run_ingest
from icecdc.runtime import kafka
from icecdc.runtime.config import Config, TableConfig
from icecdc.testbed.connector import DebeziumPostgresSource
from icecdc.testbed.postgres import ThrowawayPostgres
from tests.integration.test_ingest_process import UNTIL_IDLE_SECONDS
from tests.integration.test_real_source import CONTEXT_HEADERS, read_changes, wait_for_key

pytestmark = pytest.mark.slow

# Partitions of the topics but the one-partition cases' (all made before the connector starts).
PARTITIONS = 3
# The engine commits its offsets on its first batch and on a clean stop, and otherwise not for an
# hour: the SIGKILL after phase 2 makes the restart replay all of phase 2, every time.
NO_PERIODIC_FLUSH = {"offset.flush.interval.ms": "3600000"}
REGIONS = "(ARRAY['eu', 'us', 'apac'])"
ROTATE = "CASE region WHEN 'eu' THEN 'us' WHEN 'us' THEN 'apac' ELSE 'eu' END"


@dataclass(frozen=True)
class Case:
    """One PostgreSQL table, its Iceberg table, and the columns compared (PostgreSQL expression,
    Spark expression: the same value once both are in one form)."""

    table: str
    columns: str  # the CREATE TABLE column list
    schema: dict[str, str]
    compared: tuple[tuple[str, str], ...]
    partition_by: tuple[str, ...] = ()
    before_image: str = "key"
    one_partition: bool = False


def same(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, n) for n in names)


MOVES = "id int PRIMARY KEY, region text NOT NULL, qty int NOT NULL, note text"
MOVES_SCHEMA = {"id": "int", "region": "string", "qty": "int", "note": "string"}
KEYED_TEXT = "id int PRIMARY KEY, v text"
KEYED_TEXT_SCHEMA = {"id": "int", "v": "string"}
CASES = {
    c.table: c
    for c in (
        Case("identity_default", MOVES, MOVES_SCHEMA, same(*MOVES_SCHEMA), ("region",)),
        Case("identity_full", MOVES, MOVES_SCHEMA, same(*MOVES_SCHEMA), ("region",), before_image="full"),
        Case(
            "types",
            "id int PRIMARY KEY, amount numeric(12, 4), price numeric, moment timestamptz, stamp timestamp, day date,"
            " clock time, ident uuid, doc jsonb, blob bytea, tags text[], scores int[]",
            {
                "id": "int",
                "amount": "decimal(12, 4)",
                "price": "string",
                "moment": "timestamptz",
                "stamp": "timestamp",
                "day": "date",
                "clock": "long",
                "ident": "string",
                "doc": "string",
                "blob": "binary",
            },
            (
                *same("id", "amount"),
                ("price::text", "price"),
                ("(extract(epoch FROM moment) * 1000000)::bigint", "unix_micros(moment)"),
                *same("stamp", "day"),
                ("(extract(epoch FROM clock) * 1000000)::bigint", "clock"),
                ("ident::text", "ident"),
                ("doc::text", "doc"),
                ("blob", "blob"),
            ),
        ),
        Case(
            "evolve",
            "id int PRIMARY KEY, n integer, ratio real",
            {"id": "int", "n": "int", "ratio": "float"},
            same("id", "n", "ratio", "note"),
        ),
        Case("trunc_one", KEYED_TEXT, KEYED_TEXT_SCHEMA, same("id", "v"), one_partition=True),
        Case("trunc_multi", KEYED_TEXT, KEYED_TEXT_SCHEMA, same("id", "v")),
        Case("trunc_mixed", KEYED_TEXT, KEYED_TEXT_SCHEMA, same("id", "v")),
    )
}
SENTINEL = "sentinel"  # written last in each phase, on a one-partition topic; not ingested


def execute(db: Any, *statements: str) -> None:
    for statement in statements:
        db.execute(statement)


def snapshot(db: Any) -> None:
    for table in ("identity_default", "identity_full"):
        db.execute(f"INSERT INTO {table} SELECT g, {REGIONS}[g % 3 + 1], g, 'n' || g FROM generate_series(1, 30) g")
    execute(
        db,
        "INSERT INTO types (id, amount, price, moment, day) VALUES"
        " (1, 1.5, 2.25, '2025-01-01 00:00:00+00', '2025-01-01'), (2, NULL, NULL, NULL, NULL)",
        "INSERT INTO evolve SELECT g, g * 10, g * 0.1 FROM generate_series(1, 10) g",
        "INSERT INTO trunc_one SELECT g, 'snap ' || g FROM generate_series(1, 5) g",
        "INSERT INTO trunc_multi SELECT g, 'snap ' || g FROM generate_series(1, 20) g",
    )


def phase_1(db: Any) -> None:
    for table in ("identity_default", "identity_full"):
        db.execute(f"INSERT INTO {table} SELECT g, {REGIONS}[g % 3 + 1], g, NULL FROM generate_series(31, 45) g")
        db.execute(f"UPDATE {table} SET region = {ROTATE}, qty = qty + 1 WHERE id % 4 = 0")  # rows move partition
        with db.transaction(force_rollback=True):  # rolled back: nothing of it may land
            db.execute(f"UPDATE {table} SET region = 'eu', qty = -1")
            db.execute(f"DELETE FROM {table} WHERE id < 10")
            db.execute(f"INSERT INTO {table} VALUES (900, 'us', 900, 'rolled back')")
        db.execute(f"UPDATE {table} SET id = id + 1000, region = 'apac' WHERE id % 7 = 0")  # key changes, moved
        db.execute(f"DELETE FROM {table} WHERE id % 5 = 0")
        with db.transaction():
            db.execute(f"INSERT INTO {table} VALUES (60, 'eu', 60, 'in a transaction')")
            db.execute(f"UPDATE {table} SET region = 'us', note = 'moved twice' WHERE id = 60")
            db.execute(f"UPDATE {table} SET region = 'apac' WHERE id = 60")
            db.execute(f"DELETE FROM {table} WHERE id = 1")
    execute(
        db,
        "INSERT INTO types VALUES"
        " (3, -12345678.1234, 0.0000001, '2025-03-30 01:30:00.123456+02', '2025-03-30 01:30:00.654321', '1900-01-01',"
        "  '23:59:59.999999', '6f1c3a52-9d4e-4c1b-8a3e-2b7f0c9d1e5a', '{\"b\": [1, 2], \"a\": \"x\"}', '\\x00ff10',"
        "  ARRAY['a', 'b'], ARRAY[1, 2]),"
        " (4, 0, 123456789012345678901234567890.5, '1969-12-31 23:59:59.999999+00', '1969-12-31 23:59:59.999999',"
        "  '2100-12-31', '00:00:00', '00000000-0000-0000-0000-000000000000', '[]', '\\x', ARRAY[]::text[], NULL)",
        "UPDATE types SET doc = '{\"k\": null}', blob = '\\xdeadbeef', clock = '12:00:00.5' WHERE id = 1",
        "UPDATE evolve SET n = n + 1 WHERE id <= 5",
        "INSERT INTO evolve VALUES (11, 110, 1.25), (12, 120, 0.3)",
        "UPDATE trunc_multi SET v = 'changed ' || id WHERE id % 2 = 0",
    )


def phase_2(db: Any) -> None:
    """Replayed after the engine is killed."""
    for table in ("identity_default", "identity_full"):
        db.execute(f"UPDATE {table} SET region = 'eu', note = 'phase 2' WHERE id % 3 = 1")
        db.execute(f"UPDATE {table} SET id = id - 500 WHERE id > 1000")  # back under 1000, to new keys
        with db.transaction(force_rollback=True):
            db.execute(f"DELETE FROM {table}")
        db.execute(f"DELETE FROM {table} WHERE id % 11 = 0")
        db.execute(f"INSERT INTO {table} SELECT g, {REGIONS}[g % 3 + 1], g, 'p2' FROM generate_series(46, 55) g")
    db.execute("UPDATE types SET amount = amount * 2, moment = moment + interval '1 day', day = day + 1 WHERE id IN (1, 3)")
    db.execute('INSERT INTO types (id, ident, doc) VALUES (5, gen_random_uuid(), \'{"nested": {"deep": [true, 1.5]}}\')')
    db.execute("ALTER TABLE evolve ADD COLUMN note text")
    db.execute("UPDATE evolve SET note = 'added ' || id WHERE id % 2 = 0")  # rows last changed before the widenings
    db.execute("ALTER TABLE evolve ALTER COLUMN n TYPE bigint")
    db.execute("UPDATE evolve SET n = 5000000000 + id WHERE id % 3 = 0")
    db.execute("ALTER TABLE evolve ALTER COLUMN ratio TYPE double precision")
    db.execute("UPDATE evolve SET ratio = id / 3.0 WHERE id % 4 = 0")
    db.execute("INSERT INTO evolve VALUES (13, 6000000000, 0.1, 'after both')")
    db.execute("TRUNCATE trunc_multi")  # every row before it went to Iceberg in an earlier batch
    db.execute("INSERT INTO trunc_multi SELECT g, 'after ' || g FROM generate_series(5, 15) g")


def phase_3(db: Any) -> None:
    for table in ("identity_default", "identity_full"):
        db.execute(f"UPDATE {table} SET region = {ROTATE}, qty = qty * 2 WHERE id % 2 = 0")
        db.execute(f"UPDATE {table} SET id = id + 2000 WHERE id % 13 = 1")
        db.execute(
            f"INSERT INTO {table} SELECT g, 'us', g, 'upsert' FROM generate_series(1, 60) g"
            " ON CONFLICT (id) DO UPDATE SET qty = EXCLUDED.qty + 1, region = EXCLUDED.region"
        )
        db.execute(f"DELETE FROM {table} WHERE id BETWEEN 20 AND 25")
    db.execute("DELETE FROM types WHERE id = 2")
    db.execute("UPDATE evolve SET n = n + 1, note = 'phase 3' WHERE id IN (1, 6)")
    db.execute("UPDATE trunc_multi SET v = 'phase 3' WHERE id % 3 = 0")
    # In one ingest batch with what came before them:
    db.execute("INSERT INTO trunc_one SELECT g, 'before ' || g FROM generate_series(6, 10) g")
    db.execute("UPDATE trunc_one SET v = 'updated' WHERE id = 2")
    db.execute("TRUNCATE trunc_one")
    db.execute("INSERT INTO trunc_one SELECT g, 'after ' || g FROM generate_series(3, 6) g")
    db.execute("INSERT INTO trunc_mixed SELECT g, 'before ' || g FROM generate_series(1, 12) g")
    db.execute("TRUNCATE trunc_mixed")
    db.execute("INSERT INTO trunc_mixed SELECT g, 'after ' || g FROM generate_series(20, 25) g")


@dataclass
class Outcome:
    config: Config
    prefix: str
    source: DebeziumPostgresSource
    expected: dict[str, list[tuple[Any, ...]]]
    runs: list[IngestStats] = field(default_factory=list)
    seconds: float = 0.0


def ingest_config(stack_config: Config, prefix: str) -> Config:
    tables = [
        TableConfig.model_validate(
            {
                "name": f"it.{prefix}_{case.table}",
                "topic": f"{prefix}.public.{case.table}",
                "primary_key": ["id"],
                "schema": case.schema,
                "partition_by": list(case.partition_by),
                "before_image": case.before_image,
            }
        )
        for case in CASES.values()
    ]
    # A floor long enough that each run's first batch takes all that the topics hold (the floor
    # counts from the reader's start), so the batches (and the truncate cases) are the same on
    # every run of the test.
    ingest = stack_config.ingest.model_copy(update={"source": "direct", "min_commit_interval_seconds": 3.0})
    return stack_config.model_copy(
        update={"tables": tables, "commit_topic": f"commits-{prefix}", "dead_letter_topic": f"dlq-{prefix}", "ingest": ingest}
    )


def wait_for_sentinel(db: Any, config: Config, source: DebeziumPostgresSource, key: int) -> None:
    """Write a sentinel row and wait for it: every change before it has been handed to the
    producer, and a clean stop then flushes them all."""
    db.execute(f"INSERT INTO {SENTINEL} VALUES (%s)", (key,))
    wait_for_key(config, source.topic(SENTINEL), {"id": key})


@pytest.fixture(scope="module")
def outcome(stack_config: Config, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    started = time.monotonic()
    prefix = f"m{uuid.uuid4().hex[:8]}"
    config = ingest_config(stack_config, prefix)
    with ThrowawayPostgres() as postgres:
        with postgres.connect() as db:
            for case in CASES.values():
                db.execute(f"CREATE TABLE {case.table} ({case.columns})")
            db.execute("ALTER TABLE identity_full REPLICA IDENTITY FULL")
            db.execute(f"CREATE TABLE {SENTINEL} (id int PRIMARY KEY)")
            snapshot(db)
        # Made first, as a deployment would: the ingester reads the topics of tables not changed yet.
        one_partition = [c.table for c in CASES.values() if c.one_partition] + [SENTINEL]
        kafka.ensure_topics(config.kafka, [f"{prefix}.public.{t}" for t in one_partition], partitions=1)
        kafka.ensure_topics(config.kafka, [t.topic for t in config.tables], partitions=PARTITIONS)
        source = DebeziumPostgresSource(
            tmp_path_factory.mktemp("engine"),
            postgres,
            config.kafka,
            topic_prefix=prefix,
            slot_name=prefix,
            properties=NO_PERIODIC_FLUSH,
        )
        runs: list[IngestStats] = []

        def ingest() -> None:
            runs.append(run_ingest(config, until_idle=UNTIL_IDLE_SECONDS, spark=spark))

        def phase(number: int, workload: Callable[[Any], None], end: Callable[[], None]) -> None:
            source.start()
            source.wait_streaming()
            with postgres.connect() as db:
                # The engine commits its offsets on its first batch (then not for an hour): a
                # batch of this sentinel alone, so that a kill replays all of the workload.
                wait_for_sentinel(db, config, source, 10 * number)
                workload(db)
                wait_for_sentinel(db, config, source, number)
            end()
            ingest()

        try:
            phase(1, phase_1, source.stop)
            phase(2, phase_2, source.kill)  # offsets at the phase's start: phase 3's engine replays phase 2
            phase(3, phase_3, source.stop)
        finally:
            source.kill()  # after a failure; nothing left to stop otherwise
        with postgres.connect() as db:
            expected = {
                case.table: sorted(
                    db.execute(f"SELECT {', '.join(p for p, _ in case.compared)} FROM {case.table}").fetchall(),
                    key=lambda row: row[0],
                )
                for case in CASES.values()
            }
    return Outcome(config, prefix, source, expected, runs, time.monotonic() - started)


def iceberg_rows(spark: Any, config: Config, prefix: str, case: Case) -> list[tuple[Any, ...]]:
    name = config.table_ref(f"it.{prefix}_{case.table}").qualified
    rows = spark.table(name).selectExpr(*(s for _, s in case.compared)).collect()
    return sorted((tuple(bytes(v) if isinstance(v, bytearray) else v for v in row) for row in rows), key=lambda row: row[0])


def assert_matches(spark: Any, outcome: Outcome, table: str) -> None:
    case = CASES[table]
    assert iceberg_rows(spark, outcome.config, outcome.prefix, case) == outcome.expected[table]


def test_every_ingest_run_writes_every_change_and_dead_letters_none(outcome):
    print(f"\nthe connector's cases took {outcome.seconds:.0f}s")
    assert [run.dead_letters for run in outcome.runs] == [0, 0, 0], [dict(r.dead_letters_by_reason) for r in outcome.runs]
    assert all(run.commits > 0 for run in outcome.runs)


@pytest.mark.parametrize("table", ["identity_default", "identity_full"])
def test_row_moves_key_changes_multi_row_statements_and_rollbacks_match(outcome, spark, table):
    """REPLICA IDENTITY DEFAULT (updates without a before-image, key-only deletes: global
    deletes) and FULL (whole before-images, ``before_image: full``)."""
    assert_matches(spark, outcome, table)


def test_types_match_and_arrays_are_counted_not_written(outcome, spark):
    assert_matches(spark, outcome, "types")
    qualified = outcome.config.table_ref(f"it.{outcome.prefix}_types").qualified
    assert set(spark.table(qualified).columns) == set(CASES["types"].schema), "an array has no column type"
    counted = {
        sample.labels["column"]
        for metric in metrics.UNKNOWN_COLUMNS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["table"].endswith(f"{outcome.prefix}_types") and sample.value > 0
    }
    assert counted == {"tags", "scores"}


def test_added_column_and_widened_types_match(outcome, spark):
    assert_matches(spark, outcome, "evolve")
    types = {
        f.name: f.dataType.simpleString()
        for f in spark.table(outcome.config.table_ref(f"it.{outcome.prefix}_evolve").qualified).schema
    }
    assert types == {"id": "int", "n": "bigint", "ratio": "double", "note": "string"}


def test_truncate_on_a_one_partition_topic_matches(outcome, spark):
    assert_matches(spark, outcome, "trunc_one")


def test_truncate_on_a_multi_partition_topic_after_a_committed_batch_matches(outcome, spark):
    """The truncate is replayed too, on whichever partition the restarted engine's producer picks."""
    assert_matches(spark, outcome, "trunc_multi")


def test_truncate_on_a_multi_partition_topic_within_one_batch_matches(outcome, spark):
    """The changes before the truncate on the other partitions are dropped by their LSNs."""
    assert_matches(spark, outcome, "trunc_mixed")


def test_one_connector_s_tables_share_its_context_headers_and_the_restart_replayed(outcome):
    sentinels = read_changes(outcome.config, outcome.source.topic(SENTINEL), 7)
    assert [c.key_payload["id"] for c in sentinels] == [10, 1, 20, 2, 2, 30, 3], "the killed engine's phase is sent again"
    sentinels = [c for c in sentinels if c.key_payload["id"] < 10]
    for change in sentinels:
        assert set(change.headers) >= CONTEXT_HEADERS
        assert change.headers["__debezium.context.connectorLogicalName"] == outcome.prefix.encode()
    runs = [c.headers["__debezium.context.runId"] for c in sentinels]
    assert runs[0] != runs[1] != runs[2] == runs[3], "each engine run has its own id"
    for case in CASES.values():
        (first,) = read_changes(outcome.config, outcome.source.topic(case.table), 1)
        assert first.headers["__debezium.context.connectorLogicalName"] == outcome.prefix.encode()
