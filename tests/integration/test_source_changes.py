"""A source that changes its columns, and truncates, on the real stack: the table follows what
the Connect schema wrapper says (a new column, a widened type, a dropped field), a change Iceberg
cannot make is dead-lettered while the stream goes on, a crash between a schema commit and the
batch's data commit loses and duplicates nothing, the compactor keeps working across schema
versions, and a truncate empties the table at its offset. Checked against an independent model of
the source's rows."""

from __future__ import annotations

import base64
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import HealthCheck, event, example, given, settings

from icecdc.compactor.plans import plan_conversion, plan_rewrite
from icecdc.compactor.policy import Work
from icecdc.domain.errors import CommitConflict
from icecdc.domain.events import CommitEvent
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable
from icecdc.runtime import kafka
from icecdc.runtime.config import Config, TableConfig
from tests.integration.test_compactor import Stream, compaction_of, compactor_config, table_metadata
from tests.integration.test_ingest_process import ingest_process, produce
from tests.integration.test_ingest_writer import batch_writer, qualified, read_topic
from tests.processes import write_config

COLUMNS = ("id", "region", "amount", "n", "note")


def connect_field(column: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"field": column, "type": kind, "optional": column != "id", **extra}


def decimal_field(column: str, precision: int) -> dict[str, Any]:
    return connect_field(
        column,
        "bytes",
        name="org.apache.kafka.connect.data.Decimal",
        version=1,
        parameters={"scale": "2", "connect.decimal.precision": str(precision)},
    )


# The source table's columns, version by version, as Debezium's schema wrapper describes them.
VERSIONS = {
    1: [
        connect_field("id", "int64"),
        connect_field("region", "string"),
        decimal_field("amount", 10),
        connect_field("n", "int32"),
    ],
    # ALTER TABLE ADD COLUMN note text; ALTER COLUMN n TYPE bigint; ALTER COLUMN amount TYPE numeric(12, 2)
    2: [
        connect_field("id", "int64"),
        connect_field("region", "string"),
        decimal_field("amount", 12),
        connect_field("n", "int64"),
        connect_field("note", "string"),
    ],
    # ALTER TABLE DROP COLUMN note
    3: [
        connect_field("id", "int64"),
        connect_field("region", "string"),
        decimal_field("amount", 12),
        connect_field("n", "int64"),
    ],
}


@dataclass
class EvolvingSource:
    """A PostgreSQL table (REPLICA IDENTITY FULL) whose columns change; its Debezium records
    carry the schema wrapper of the version they were written with."""

    version: int = 1
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)

    def _envelope(self, op: str, before: dict | None, after: dict | None, fields: list[dict] | None = None) -> bytes:
        fields = fields or VERSIONS[self.version]
        row = {"type": "struct", "optional": True, "fields": fields}
        schema = {
            "type": "struct",
            "name": "shop.public.t.Envelope",
            "fields": [{**row, "field": "before"}, {**row, "field": "after"}],
        }

        def encode(image: dict | None) -> dict | None:
            if image is None:
                return None
            unscaled = int(Decimal(image["amount"]) * 100)
            names = {f["field"] for f in fields}
            out = {k: v for k, v in image.items() if k in names}
            out["amount"] = base64.b64encode(unscaled.to_bytes(8, "big", signed=True)).decode()
            return out

        payload = {"op": op, "before": encode(before), "after": encode(after), "source": {"connector": "postgresql"}}
        return orjson.dumps({"schema": schema, "payload": payload})

    def upsert(self, key: int, region: str, amount: str, n: int, note: str | None = None) -> tuple[bytes, bytes]:
        before = self.rows.get(key)
        after = {"id": key, "region": region, "amount": amount, "n": n}
        if self.version == 2:
            after["note"] = note
        self.rows[key] = after
        return orjson.dumps({"id": key}), self._envelope("u" if before else "c", before, after)

    def delete(self, key: int) -> tuple[bytes, bytes]:
        return orjson.dumps({"id": key}), self._envelope("d", self.rows.pop(key), None)

    def expected_rows(self) -> list[tuple[Any, ...]]:
        return sorted((r["id"], r["region"], Decimal(r["amount"]), r["n"], r.get("note")) for r in self.rows.values())


TRUNCATE = (None, orjson.dumps({"op": "t", "source": {"connector": "postgresql"}, "ts_ms": 1}))


def evolving_table(config: Config, format_version: int = 2) -> Config:
    table = TableConfig.model_validate(
        {
            "name": config.tables[0].name,
            "topic": config.tables[0].topic,
            "primary_key": ["id"],
            "partition_by": ["region"],
            "schema": {"id": "long", "region": "string", "amount": "decimal(10, 2)", "n": "int"},
            "before_image": "full",
            "format_version": format_version,
        }
    )
    return config.model_copy(update={"tables": [table]})


def rows(spark, name: str) -> list[tuple[Any, ...]]:
    spark.sql(f"REFRESH TABLE {name}")
    columns = [c for c in COLUMNS if c in spark.table(name).columns]
    found = spark.table(name).select(*columns).collect()
    return sorted(tuple(r) + (None,) * (len(COLUMNS) - len(columns)) for r in found)


def test_the_table_follows_added_widened_and_dropped_columns_and_the_compactor_reads_every_version(spark, stack_config, unique):
    config = evolving_table(compactor_config(stack_config, unique, target_file_size_bytes=256 * 1024))
    name = qualified(config)
    source = EvolvingSource()
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        stream([source.upsert(k, ("eu", "us")[k % 2], f"{k}.50", k) for k in range(1, 21)])
        assert rows(spark, name) == source.expected_rows()

        source.version = 2
        big = 2**40  # needs the widened column, as 1234567890.25 needs numeric(12, 2)
        stream([source.upsert(k, "eu", "1234567890.25", big + k, note=f"v2-{k}") for k in range(1, 6)] + [source.delete(20)])
        assert rows(spark, name) == source.expected_rows()

        source.version = 3  # the source no longer has `note`: written as null, the column stays
        stream([source.upsert(k, "us", "1.00", k) for k in range(4, 9)])
        # A change Iceberg cannot make: `region` as an integer. Those records go to the
        # dead-letter topic with the reason; the others of the batch commit.
        bad_fields = [*VERSIONS[3][:1], connect_field("region", "int32"), *VERSIONS[3][2:]]
        bad = (
            orjson.dumps({"id": 99}),
            source._envelope("c", None, {"id": 99, "region": 7, "amount": "1.00", "n": 1}, bad_fields),
        )
        stream([bad, source.upsert(10, "eu", "2.00", 10)])
        assert rows(spark, name) == source.expected_rows()
    assert write.stats.dead_letters_by_reason == {"incompatible-schema-change": 1}
    [letter] = read_topic(config, config.dead_letter_topic, 1)
    assert b"region" in dict(letter.headers())["icecdc.detail"] and letter.value() == bad[1]

    table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
    assert table.column_types() == {"id": "long", "region": "string", "amount": "decimal(12, 2)", "n": "long", "note": "string"}
    # One data commit per batch: the schema changes are metadata commits of their own.
    assert spark.sql(f"SELECT count(*) FROM {name}.snapshots").first()[0] == 4
    assert len(read_topic(config, config.commit_topic, 4)) == 4

    # The compactor merges files of all three schema versions.
    loaded = table_metadata(config)
    for path, partition in loaded.partitions.items():
        compaction = compaction_of(
            spark,
            config,
            loaded.layout,
            tuple(partition.partition[t.name] for t in loaded.layout.partition),
            config.compactor.target_file_size_bytes,
        )
        files = compaction.files()
        assert files is not None
        assert compaction.run(plan_rewrite(files, Work.DELETE_MERGE, config.compactor), {"icecdc.compactor": "test"}).committed, (
            path
        )
    assert rows(spark, name) == source.expected_rows()


@pytest.mark.slow
def test_a_crash_between_the_schema_commit_and_the_data_commit_loses_and_duplicates_nothing(
    spark, stack_config, unique, tmp_path
):
    config = evolving_table(compactor_config(stack_config, unique))
    config = config.model_copy(
        update={
            "ingest": config.ingest.model_copy(
                update={"source": "direct", "min_commit_interval_seconds": 0.5, "max_batch_records": 30}
            ),
            "dead_letter_topic": f"dlq-{unique}",
        }
    )
    topic = config.tables[0].topic
    kafka.ensure_topics(config.kafka, [topic])
    source = EvolvingSource()
    events = [source.upsert(k, ("eu", "us")[k % 2], f"{k}.00", k) for k in range(1, 31)]
    source.version = 2
    events += [source.upsert(k, "us", "3.00", 2**35 + k, note=f"n{k}") for k in range(5, 40)]
    produce(config, topic, events)
    path = write_config(config, tmp_path / "icecdc.yaml")
    # The first schema change of the second batch is committed, then the process dies.
    crashed = ingest_process(path, "after-schema-change:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    finished = ingest_process(path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    name = config.table_ref(config.tables[0]).qualified
    assert rows(spark, name) == source.expected_rows()
    summary = spark.sql(f"SELECT summary FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").first().summary
    assert sum(orjson.loads(summary["icecdc.offsets"])[topic].values()) == len(events)


def test_a_truncate_empties_the_table_at_its_offset(spark, stack_config, unique):
    config = evolving_table(compactor_config(stack_config, unique))
    name = qualified(config)
    source = EvolvingSource()
    truncate = TRUNCATE
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        stream([source.upsert(k, ("eu", "us")[k % 2], f"{k}.00", k) for k in range(1, 11)])
        # In one batch: changes before the truncate (gone with it), the truncate, changes after.
        before = [source.upsert(1, "us", "9.00", 1), source.delete(2)]
        source.rows.clear()
        after = [source.upsert(k, "eu", "5.00", k) for k in (3, 11)]
        stream([*before, truncate, *after])
        assert rows(spark, name) == source.expected_rows()
        stream([source.upsert(12, "us", "1.00", 12), source.delete(3)])
    assert rows(spark, name) == source.expected_rows()
    assert write.stats.dead_letters == 0
    operations = [r.operation for r in spark.sql(f"SELECT operation FROM {name}.snapshots ORDER BY committed_at").collect()]
    assert operations[1] == "overwrite"  # the truncate and what followed it, one commit
    events = [CommitEvent.from_json(m.value()) for m in read_topic(config, config.commit_topic, 3)]
    assert [e.truncated for e in events] == [False, True, False]


def test_without_the_schema_wrapper_new_fields_are_counted_or_typed_from_their_values(spark, stack_config, unique):
    def bare(key: int, **extra: Any) -> tuple[bytes, bytes]:
        after = {"id": key, "region": "eu", "amount": "1.00", "n": key, **extra}
        return orjson.dumps({"id": key}), orjson.dumps({"op": "c", "before": None, "after": after})

    config = evolving_table(compactor_config(stack_config, unique))
    with batch_writer(spark, config) as write:
        Stream(spark, config, write)([bare(1, note="x"), bare(2, note="y", score=1.5)])
    [event] = [CommitEvent.from_json(m.value()) for m in read_topic(config, config.commit_topic, 1)]
    assert event.unknown_columns == {"note": 2, "score": 1}
    assert "note" not in IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0])).column_types()

    table = TableConfig.model_validate({**config.tables[0].model_dump(by_alias=True), "infer_new_columns": True})
    inferred = config.model_copy(update={"tables": [table]})
    with batch_writer(spark, inferred) as write:
        stream = Stream(spark, inferred, write)
        stream.offset = 2
        stream([bare(3, note="z", score=2.5)])
    types = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0])).column_types()
    assert types["note"] == "string" and types["score"] == "double"
    found = spark.table(qualified(config)).where("id = 3").select("note", "score").first()
    assert (found.note, found.score) == ("z", 2.5)


# One source operation: an upsert (key, region, amount) or a delete of a key, the source's next
# schema version (v2 adds `note` and widens `n` and `amount`, v3 drops `note`), or a truncate.
operation = st.one_of(
    st.tuples(st.just("upsert"), st.integers(1, 8), st.sampled_from(["eu", "us"]), st.integers(0, 999)),
    st.tuples(st.just("delete"), st.integers(1, 8)),
    st.just(("evolve",)),
    st.just(("truncate",)),
)
source_batch = st.lists(operation, min_size=1, max_size=6)
# After a batch, maybe a conversion or a delete merge of one region, maybe with a writer batch
# (schema changes and truncates included) committed between its start and its commit.
schema_history = st.lists(
    st.tuples(
        source_batch,
        st.one_of(
            st.none(),
            st.tuples(st.sampled_from(["convert", "merge"]), st.sampled_from(["eu", "us"]), st.one_of(st.none(), source_batch)),
        ),
    ),
    min_size=1,
    max_size=6,
)


def source_records(source: EvolvingSource, batch: list[tuple]) -> list[tuple[bytes | None, bytes]]:
    records: list[tuple[bytes | None, bytes]] = []
    for op, *args in batch:
        if op == "upsert":
            key, region, cents = args
            # From v2 on, values that need the widened types.
            n, amount = (
                (key, f"{cents // 100}.{cents % 100:02d}")
                if source.version == 1
                else (2**40 + key, f"12345678{cents % 100:02d}.25")
            )
            records.append(source.upsert(key, region, amount, n, note=f"n{cents}"))
        elif op == "delete" and args[0] in source.rows:
            records.append(source.delete(args[0]))
        elif op == "evolve" and source.version < 3:
            source.version += 1
        elif op == "truncate":
            source.rows.clear()
            records.append(TRUNCATE)
    return records


def common_rows(spark, name: str, snapshot_id: int, columns: list[str]) -> list[tuple[Any, ...]]:
    found = spark.sql(f"SELECT {', '.join(columns)} FROM {name} VERSION AS OF {snapshot_id}").collect()
    return sorted(map(tuple, found))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=schema_history, format_version=st.sampled_from([2, 3]))
# A table a truncate emptied has a snapshot without manifests: its metadata must still be read.
@example(steps=[([("truncate",)], None), ([("truncate",)], ("convert", "eu", None))], format_version=2)
# A schema change and a truncate land between a merge's start and its commit.
@example(
    steps=[([("upsert", 2, "eu", 5)], ("merge", "eu", [("evolve",), ("upsert", 2, "eu", 7), ("truncate",)]))], format_version=3
)
def test_random_histories_of_schema_changes_and_truncates_with_maintenance_interleaved_keep_every_row(
    spark, stack_config, steps, format_version
):
    unique = f"evolve{time.monotonic_ns()}"
    config = evolving_table(compactor_config(stack_config, unique, target_file_size_bytes=64 * 1024), format_version)
    name = qualified(config)
    source = EvolvingSource()
    maintenance_snapshots: list[CommittedSnapshot] = []
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)

        def write_batch(batch: list[tuple]) -> None:
            records = source_records(source, batch)
            if records:
                stream(records)

        write_batch([("upsert", k, ("eu", "us")[k % 2], k) for k in range(1, 9)])
        for batch, maintain in steps:
            write_batch(batch)
            if maintain is None:
                continue
            kind, region, during = maintain
            loaded = table_metadata(config)
            compaction = compaction_of(spark, config, loaded.layout, (region,), config.compactor.target_file_size_bytes)
            files = compaction.files()
            if files is None:
                continue
            chosen = plan_conversion(files) if kind == "convert" else plan_rewrite(files, Work.DELETE_MERGE, config.compactor)

            def commit(attempt: Callable[[], CommittedSnapshot], during=during) -> CommittedSnapshot:
                if during:
                    write_batch(during)  # schema changes, truncates and data after the maintenance's start
                return attempt()

            # The writer never fails; only a truncate (which removes files) may fail the maintenance.
            truncating = any(op[0] == "truncate" for op in during or ())
            try:
                result = compaction.run(chosen, {"icecdc.compactor": "property-test"}, commit=commit)
            except CommitConflict:
                assert truncating, "only a truncate may fail a maintenance commit"
                event("maintenance lost to a truncate")
                continue
            if result.committed is not None:
                maintenance_snapshots.append(result.committed)
                event(f"committed {result.work.value}{' during a writer commit' if during else ''}")
        assert write.stats.dead_letters == 0

    assert rows(spark, name) == source.expected_rows()
    # Every maintenance snapshot holds its parent's rows (in the columns both schemas have).
    parents = {r.snapshot_id: r.parent_id for r in spark.sql(f"SELECT snapshot_id, parent_id FROM {name}.snapshots").collect()}
    for committed in maintenance_snapshots:
        parent = parents[committed.snapshot_id]
        columns = ["id", "region", "amount", "n"]
        assert common_rows(spark, name, committed.snapshot_id, columns) == common_rows(spark, name, parent, columns), committed
