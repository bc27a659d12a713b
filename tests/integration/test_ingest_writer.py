"""The micro-batch writer against real Spark, Iceberg, the SQLite catalog and the broker: what
needs real tables and files (exactly-once on a real table, the files' metadata, partition values,
events against Iceberg's own metadata). The order of work and the writer's decisions (truncates,
schema-change redos, spec recovery, several tables, failures) are unit tests with fakes
(tests/unit/test_batch_writer.py)."""

from __future__ import annotations

import datetime as dt
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from confluent_kafka import TopicPartition
from hypothesis import HealthCheck, given, settings

from icecdc.domain import summary as summary_keys
from icecdc.domain.events import CommitEvent
from icecdc.ingest.filemeta import FOOTER_FIELD, FileKind, describe, parquet_footer
from icecdc.ingest.prefixes import CUT_PREFIX, SchemaPrefixes
from icecdc.ingest.publish import CommitEventPublisher
from icecdc.ingest.records import PolledRecords, records_to_dataframe
from icecdc.ingest.writer import BatchWriter
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable
from icecdc.runtime import kafka
from icecdc.runtime.catalog import ensure_tables
from icecdc.runtime.config import Config, TableConfig
from tests.cdc import REGIONS, SourceDatabase, flavoured_batches, flavoured_history, kafka_records, orders_table, table_rows


def qualified(config: Config, index: int = 0) -> str:
    """The Spark name of a configured table (``lake.it.orders_...``)."""
    return config.table_ref(config.tables[index]).qualified


def config_for(stack_config: Config, unique: str) -> Config:
    table = TableConfig.model_validate(orders_table(f"it.orders_{unique}", f"orders-{unique}"))
    return stack_config.model_copy(
        update={
            "tables": [table],
            "commit_topic": f"commits-{unique}",
            "dead_letter_topic": f"dlq-{unique}",
        }
    )


@contextmanager
def batch_writer(spark, config: Config):
    ensure_tables(spark, config)
    kafka.ensure_topics(config.kafka, [config.commit_topic, config.dead_letter_topic])
    producer = kafka.producer(config.kafka)
    publisher = CommitEventPublisher(producer, config.commit_topic)
    yield BatchWriter(spark, config, producer, publisher, "test")
    assert publisher.close() == 0


def read_topic(config: Config, topic: str, expected: int, timeout: float = 30.0):
    consumer = kafka.consumer(config.kafka, f"reader-{time.monotonic_ns()}")
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages = []
    deadline = time.monotonic() + timeout
    while len(messages) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            messages.append(message)
    consumer.close()
    return messages


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(history=flavoured_history)
def test_random_histories_end_in_the_state_they_imply(spark, stack_config, history):
    """Two tables, each sent the history, in the same batches: each commits its own files and
    offsets, side by side on the commit threads."""
    unique = f"p{time.monotonic_ns()}"
    config = config_for(stack_config, unique)
    second = TableConfig.model_validate(orders_table(f"it.orders_b_{unique}", f"orders-b-{unique}"))
    config = config.model_copy(update={"tables": [*config.tables, second]})
    topics = [table.topic for table in config.tables]
    source = SourceDatabase()
    with batch_writer(spark, config) as write:
        offset = 0
        for number, pairs in enumerate(flavoured_batches(source, history)):
            records = [record for topic in topics for record in kafka_records(topic, pairs, offset)]
            # In turns: the direct reader's batch run in the driver; the same on Spark, its
            # known wrapper prefixes cut in the driver; Spark's Kafka source's, cut on the JVM.
            path = number % 3
            write.job.driver_batch_records = 0 if path else config.ingest.driver_batch_records
            batch = PolledRecords(spark, records) if path < 2 else records_to_dataframe(spark, records)
            assert write(batch, number).job_in_driver == (path == 0)
            offset += len(pairs)
    for index in range(len(topics)):
        name = qualified(config, index)
        assert table_rows(spark, name) == source.expected_rows(), name
        contents = {r.content for r in spark.sql(f"SELECT content FROM {name}.files").collect()}
        assert 1 not in contents  # never position deletes


def test_the_jvm_cuts_known_prefixes_as_the_direct_reader_does(spark):
    prefixes = SchemaPrefixes()
    prefixes.learn({"a": b'{"schema":1,"payload":', "b": b'{"schema":22,"payload":'})
    prefixes.learn({"a": b'{"schema":3,"payload":'})
    values = [b'{"schema":3,"payload":{}}', b'{"schema":1,"payload":{}}', b'{"schema":22,"payload":{}}', None, b"{}"]
    records = [{"key": None, "value": v, "topic": t} for t in ("a", "b", "c") for v in values]
    rows = [(r["topic"], r["value"], r[CUT_PREFIX]) for r in prefixes.cut_records([dict(r) for r in records])]
    frame = spark.createDataFrame(records, "key binary, value binary, topic string")
    jvm = [
        (r.topic, bytes(r.value) if r.value is not None else None, r[CUT_PREFIX])
        for r in prefixes.cut_frame(frame, ["a", "b", "c"]).collect()
    ]
    assert jvm == rows
    assert [cut for _, _, cut in rows].count(None) == len(rows) - 2  # the newest prefix of a, and b's


def test_updates_and_deletes_are_equality_deletes_and_bucket_pruning_agrees(spark, stack_config, unique):
    table = TableConfig.model_validate(
        {**orders_table(f"it.bucketed_{unique}", f"bucketed-{unique}"), "partition_by": ["bucket(4, id)", "days(updated_at)"]}
    )
    config = stack_config.model_copy(
        update={"tables": [table], "commit_topic": f"commits-{unique}", "dead_letter_topic": f"dlq-{unique}"}
    )
    source = SourceDatabase()
    first = [source.upsert(k, "eu", 100 * k, 0) for k in range(1, 21)]
    second = [source.upsert(k, "us", 7, 1) for k in range(1, 11)] + [source.delete(k) for k in range(15, 21)]
    with batch_writer(spark, config) as write:
        write(records_to_dataframe(spark, kafka_records(table.topic, first)), 0)
        write(records_to_dataframe(spark, kafka_records(table.topic, second, len(first))), 1)
    name = qualified(config)
    assert table_rows(spark, name) == source.expected_rows()
    files = spark.sql(f"SELECT content, count(*) AS n FROM {name}.files GROUP BY content").collect()
    counts = {r.content: r.n for r in files}
    assert counts.get(2, 0) > 0 and counts.get(1, 0) == 0
    # Point lookups prune by bucket; a bucket computed differently from Iceberg's would miss.
    for key in (1, 7, 12):
        assert [r.id for r in spark.sql(f"SELECT id FROM {name} WHERE id = {key}").collect()] == [key]


def test_replayed_batch_is_skipped(spark, stack_config, unique):
    config = config_for(stack_config, unique)
    topic = config.tables[0].topic
    source = SourceDatabase()
    pairs = [source.upsert(k, "eu", k, 0) for k in range(1, 6)] + [source.upsert(2, "us", 5, 1), source.delete(3)]
    with batch_writer(spark, config) as write:
        records = kafka_records(topic, pairs)
        first = write(records_to_dataframe(spark, records), 0)
        snapshots = spark.sql(f"SELECT count(*) AS n FROM {qualified(config)}.snapshots").collect()[0].n
        again = write(records_to_dataframe(spark, records), 0)  # e.g. Spark replaying after a crash
        # A batch overlapping the committed range: only its new part is written.
        source_more = [source.upsert(4, "apac", 9, 2)]
        partly = write(records_to_dataframe(spark, records + kafka_records(topic, source_more, len(pairs))), 1)
    assert first.records == len(pairs) and again.records == 0 and not again.commits
    assert partly.records == 1
    name = qualified(config)
    assert spark.sql(f"SELECT count(*) AS n FROM {name}.snapshots").collect()[0].n == snapshots + 1
    assert table_rows(spark, name) == source.expected_rows()


def test_bad_input_goes_to_the_dead_letter_topic_and_good_input_commits(spark, stack_config, unique):
    config = config_for(stack_config, unique)
    # A delete whose old partition is unknown is dead-lettered (an explicit choice; by default it
    # would delete its key in every partition).
    table = TableConfig.model_validate({**config.tables[0].model_dump(by_alias=True), "unknown_partition": "dead-letter"})
    config = config.model_copy(update={"tables": [table]})
    topic = config.tables[0].topic
    source = SourceDatabase()
    good = [source.upsert(1, "eu", 100, 0), source.upsert(2, "us", 200, 1)]
    bad = [
        (b"k", b"{not json", "unparseable-json"),
        (b"k", orjson.dumps({"op": "x", "after": {"id": 5}}), "unknown-op"),
        (None, orjson.dumps({"op": "c", "after": {"region": "eu"}}), "missing-key"),
        (b"k", orjson.dumps({"op": "c", "after": {"id": None, "region": "eu"}}), "null-key"),
        (b"k", orjson.dumps({"op": "c", "after": {"id": 6, "region": "eu", "amount": "lots"}}), "bad-value"),
        (b"k", orjson.dumps({"op": "d", "before": {"id": 1}}), "missing-partition-value"),
    ]
    records = kafka_records(topic, [good[0], *[(k, v) for k, v, _ in bad], good[1], (b"tombstone", None)])
    records += kafka_records(f"unmapped-{unique}", [(b"k", good[0][1])])
    with batch_writer(spark, config) as write:
        result = write(records_to_dataframe(spark, records), 0)
    assert result.dead_letters == len(bad) + 1
    assert table_rows(spark, qualified(config)) == source.expected_rows()

    letters = read_topic(config, config.dead_letter_topic, len(bad) + 1)
    by_reason = {dict(m.headers())["icecdc.reason"].decode(): m for m in letters}
    assert set(by_reason) == {reason for _, _, reason in bad} | {"unknown-table"}
    for key, value, reason in bad:
        message = by_reason[reason]
        headers = dict(message.headers())
        assert message.value() == value and message.key() == key  # the original bytes
        assert headers["icecdc.source.topic"] == topic.encode()
        assert int(headers["icecdc.source.offset"]) == next(r["offset"] for r in records if r["value"] == value)
        assert headers["icecdc.detail"]
    assert dict(by_reason["unknown-table"].headers())["icecdc.source.topic"] == f"unmapped-{unique}".encode()


def test_commit_events_match_the_snapshot_metadata(spark, stack_config, unique):
    config = config_for(stack_config, unique)
    topic = config.tables[0].topic
    source = SourceDatabase()
    first = [source.upsert(k, REGIONS[k % 3], k, k % 2) for k in range(1, 13)]
    second = [source.upsert(k, "eu", 1, 3) for k in range(1, 5)] + [source.delete(9)]
    with batch_writer(spark, config) as write:
        write(records_to_dataframe(spark, kafka_records(topic, first)), 0)
        write(records_to_dataframe(spark, kafka_records(topic, second, len(first))), 1)
    events = [CommitEvent.from_json(m.value()) for m in read_topic(config, config.commit_topic, 2)]  # validates the schema
    assert len(events) == 2
    name = qualified(config)
    for event, next_offset in zip(events, (len(first), len(first) + len(second)), strict=True):
        assert event.table == config.tables[0].name and event.writer == "icecdc-ingest"
        assert event.source_offsets == {topic: {"0": next_offset}}
        snapshot = spark.sql(
            f"SELECT sequence_number FROM {name}.entries WHERE snapshot_id = {event.snapshot_id} LIMIT 1"
        ).collect()
        assert snapshot[0].sequence_number == event.sequence_number
        added = spark.sql(f"""
            SELECT data_file.partition AS p, data_file.content AS content, count(*) AS files,
                   sum(data_file.record_count) AS records, sum(data_file.file_size_in_bytes) AS bytes
            FROM {name}.entries WHERE snapshot_id = {event.snapshot_id} AND status = 1
            GROUP BY data_file.partition, data_file.content""").collect()
        expected = {}
        for r in added:
            day = (r.p.updated_at_day - __import__("datetime").date(1970, 1, 1)).days
            counts = expected.setdefault((r.p.region, day), {})
            if r.content == 0:
                counts.update(data_files=r.files, data_records=r.records, data_bytes=r.bytes)
            else:
                counts.update(equality_delete_files=r.files, equality_delete_records=r.records)
        reported = {
            (p.partition["region"], p.partition["updated_at_day"]): {
                k: v for k, v in vars(p).items() if k not in ("partition", "partition_path", "spec_id") and v
            }
            for p in event.partitions
        }
        assert reported == expected


def test_identity_partitions_of_every_type_hold_their_exact_values(spark, stack_config, unique):
    """Spark reads identity partition values from metadata, not from the files: a partition
    value that Iceberg parsed differently from what the file holds would show here."""
    import datetime as dt
    from decimal import Decimal

    table = TableConfig.model_validate(
        {
            "name": f"it.identity_{unique}",
            "topic": f"identity-{unique}",
            "primary_key": ["id"],
            "partition_by": ["label", "day", "flag", "amount", "n"],
            "schema": {
                "id": "long",
                "label": "string",
                "at": "timestamp",
                "day": "date",
                "flag": "boolean",
                "amount": "decimal(8, 3)",
                "n": "long",
            },
        }
    )
    config = stack_config.model_copy(
        update={"tables": [table], "commit_topic": f"commits-{unique}", "dead_letter_topic": f"dlq-{unique}"}
    )
    rows = [
        {
            "id": 1,
            "label": "e u/x=1&%",
            "at": 1_735_787_045_123_456,
            "day": 20090,
            "flag": True,
            "amount": "12.345",
            "n": 5_000_000_000,
        },
        {"id": 2, "label": "null", "at": 0, "day": -1, "flag": False, "amount": "-0.001", "n": -1},
        {"id": 3, "label": None, "at": None, "day": None, "flag": None, "amount": None, "n": None},
    ]
    records = kafka_records(table.topic, [(None, orjson.dumps({"op": "c", "after": r})) for r in rows])
    with batch_writer(spark, config) as write:
        write(records_to_dataframe(spark, records), 0)
    epoch = dt.datetime(1970, 1, 1)
    expected = [
        (
            1,
            "e u/x=1&%",
            epoch + dt.timedelta(microseconds=1_735_787_045_123_456),
            dt.date(2025, 1, 2),
            True,
            Decimal("12.345"),
            5_000_000_000,
        ),
        (2, "null", epoch, dt.date(1969, 12, 31), False, Decimal("-0.001"), -1),
        (3, None, None, None, None, None, None),
    ]
    got = sorted(tuple(r) for r in spark.table(qualified(config)).collect())
    assert got == expected


@pytest.mark.parametrize(
    "metrics",
    [
        {},
        {
            "write.metadata.metrics.default": "counts",
            "write.metadata.metrics.column.id": "full",
            "write.metadata.metrics.column.region": "truncate(1)",
            "write.metadata.metrics.column.amount": "none",
        },
    ],
    ids=["default-modes", "table-modes"],
)
def test_file_metrics_described_on_executors_equal_icebergs_own(spark, stack_config, unique, metrics):
    """The files are registered from executor-side descriptions (ingest/filemeta.py), not by
    reading footers on the driver: their counts and bounds must equal what Iceberg reads, with
    the metrics modes the table's properties set."""
    config = config_for(stack_config, unique)
    table_config = config.tables[0].model_copy(update={"properties": metrics})
    config = config.model_copy(update={"tables": [table_config]})
    source = SourceDatabase()
    first = [source.upsert(k, REGIONS[k % 3], 100 * k, k % 2) for k in range(1, 40)]
    second = [source.upsert(k, REGIONS[(k + 1) % 3], 7, 1) for k in range(1, 20)] + [source.delete(k) for k in range(30, 35)]
    with batch_writer(spark, config) as write:
        write(records_to_dataframe(spark, kafka_records(config.tables[0].topic, first)), 0)
        write(records_to_dataframe(spark, kafka_records(config.tables[0].topic, second, len(first))), 1)
    name = qualified(config)
    # Iceberg's own footer reader, through the adapter's table handle: the independent oracle.
    handle = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
    table, iceberg = handle._java, handle.bridge.iceberg
    metrics_config = iceberg.MetricsConfig.forTable(table)
    rows = spark.sql(
        f"SELECT file_path, record_count, value_counts, null_value_counts, lower_bounds, upper_bounds FROM {name}.files"
    ).collect()
    assert len(rows) > 4
    for row in rows:
        footer = iceberg.parquet.ParquetUtil.fileMetrics(table.io().newInputFile(row.file_path), metrics_config)
        assert row.record_count == footer.recordCount()
        assert row.value_counts == dict(footer.valueCounts())
        assert row.null_value_counts == dict(footer.nullValueCounts())
        for registered, read in ((row.lower_bounds, footer.lowerBounds()), (row.upper_bounds, footer.upperBounds())):
            assert {k: bytes(v) for k, v in registered.items()} == {int(k): bytes(read.get(k).array()) for k in read.keySet()}
    field = {name: int(table.schema().findField(name).fieldId()) for name in ("id", "region", "amount", "updated_at")}
    for row in rows:
        bounded = set(row.lower_bounds)
        if metrics:  # counts by default: bounds for the key in full and the region cut to 1 character
            assert field["amount"] not in bounded and field["updated_at"] not in bounded
            assert field["id"] in bounded
            assert all(len(bytes(v)) <= 1 for k, v in row.upper_bounds.items() if k == field["region"])
        else:
            assert field["id"] in bounded


def test_a_local_warehouse_sets_permissions_in_process_as_hadoop_would(spark, stack_config, unique, tmp_path):
    """A writer on a local warehouse puts icecdc's raw local file system under the JVM's cached
    one (java/IcecdcLocalFiles.java): files it creates and permissions it sets end with the
    modes Hadoop gives them, without a checksum file; and the table's commits still land."""
    config = config_for(stack_config, unique)
    source = SourceDatabase()
    with batch_writer(spark, config) as write:
        write(records_to_dataframe(spark, kafka_records(config.tables[0].topic, [source.upsert(1, REGIONS[0], 5, 1)])), 0)
    assert spark.table(qualified(config)).count() == 1
    jvm = JavaBridge(spark).jvm
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())
    assert local.getRawFileSystem().getClass().getName().endswith("$InProcessChmod")
    created = tmp_path / "created"
    local.create(jvm.org.apache.hadoop.fs.Path(str(created)), False).close()
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(created.stat().st_mode) == 0o666 & ~umask
    assert not (tmp_path / ".created.crc").exists()
    for symbolic, mode in (("-rw-r-----", 0o640), ("-rwx------", 0o700), ("-r--r--r--", 0o444)):
        local.setPermission(
            jvm.org.apache.hadoop.fs.Path(str(created)), jvm.org.apache.hadoop.fs.permission.FsPermission.valueOf(symbolic)
        )
        assert stat.S_IMODE(created.stat().st_mode) == mode


def test_a_file_description_without_its_footer_is_refused_and_nothing_commits(spark, stack_config, unique):
    """The JVM computes a file's metrics from the footer its description carries; a description
    without one would register a file with no bounds or counts, so the commit is refused."""
    config = config_for(stack_config, unique)
    source = SourceDatabase()
    with batch_writer(spark, config) as write:
        write(records_to_dataframe(spark, kafka_records(config.tables[0].topic, [source.upsert(1, REGIONS[0], 5, 1)])), 0)
        layout = write.layouts[config.tables[0].name]
    name = qualified(config)
    before = spark.sql(f"SELECT count(*) FROM {name}.snapshots").first()[0]
    registered = spark.sql(f"SELECT file_path, partition FROM {name}.files WHERE content = 0").first()
    data = Path(registered.file_path.removeprefix("file:")).read_bytes()
    # Spark shows a day partition as a date; the layout's partition key holds days since 1970.
    partition = tuple((v - dt.date(1970, 1, 1)).days if isinstance(v, dt.date) else v for v in registered.partition)
    whole = describe(layout, FileKind.DATA, registered.file_path, partition, len(data), 1, parquet_footer(data))
    without = {k: v for k, v in orjson.loads(whole).items() if k != FOOTER_FIELD}
    handle = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
    with pytest.raises(Exception, match="has no icecdc-parquet-footer"):
        handle.commit_files("no footer", [orjson.dumps(without).decode()], [], {})
    assert spark.sql(f"SELECT count(*) FROM {name}.snapshots").first()[0] == before


def test_a_commit_finds_itself_and_counts_the_commits_that_landed_while_it_was_made(spark, stack_config, unique):
    """The adapter finds a commit's snapshot by its commit id in the JVM, in one py4j call
    (``IcecdcUpdates.findTagged``), counting the commits by others it was applied on top of; the
    offsets read takes the summaries back to the newest that has offsets, in one call too."""
    config = config_for(stack_config, unique)
    source = SourceDatabase()
    with batch_writer(spark, config) as write:
        write(records_to_dataframe(spark, kafka_records(config.tables[0].topic, [source.upsert(1, REGIONS[0], 5, 1)])), 0)
    ref = config.table_ref(config.tables[0])
    ours, theirs = IcebergTable(JavaBridge(spark), ref), IcebergTable(JavaBridge(spark), ref)

    def build_while_two_others_land(table):
        for n in range(2):
            theirs.commit(
                f"theirs {n}", lambda table: table.newAppend(), {"who": f"theirs {n}"}
            )  # no files: a snapshot all the same
        return table.newAppend()

    landed = ours.commit("ours", build_while_two_others_land, {"who": "ours"})
    ours.refresh()
    newest, their_second, their_first, ingested = list(ours.history())
    assert landed == CommittedSnapshot(
        newest.snapshot_id, their_second.snapshot_id, newest.sequence_number, newest.timestamp_ms, newest.operation, interleaved=2
    )
    assert (newest.summary["who"], their_second.summary["who"], their_first.summary["who"]) == ("ours", "theirs 1", "theirs 0")

    # With no stop (-1) every older snapshot counts; a commit older than where the walk stops is not looked for.
    assert ours._find(newest.summary[summary_keys.COMMIT_ID], stop_at=-1).interleaved == 3
    assert ours._find(their_first.summary[summary_keys.COMMIT_ID], stop_at=their_second.snapshot_id) is None

    back_to_offsets = ours.summaries_back_to(summary_keys.OFFSETS)
    assert [s.get("who") for s in back_to_offsets] == ["ours", "theirs 1", "theirs 0", None]
    assert back_to_offsets[-1] == dict(ingested.summary)
    assert ours.summaries_back_to("no snapshot has this") == [dict(s.summary) for s in ours.history()]
