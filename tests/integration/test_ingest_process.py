"""``icecdc ingest`` as a process: crash and replay at every stage of a batch, and the
Structured Streaming path against the direct Kafka path."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from icecdc.ingest.kafka_reader import run_streaming
from icecdc.ingest.publish import CommitEventPublisher
from icecdc.ingest.runner import run_ingest
from icecdc.ingest.stage_rows import KAFKA_SCHEMA
from icecdc.ingest.writer import BatchWriter
from icecdc.runtime import kafka
from icecdc.runtime.catalog import ensure_tables
from icecdc.runtime.config import Config, TableConfig
from tests.cdc import REGIONS, SourceDatabase, kafka_records, orders_table, table_rows
from tests.processes import icecdc_process, write_config


def history(source: SourceDatabase, keys: int, rounds: int) -> list[tuple[bytes, bytes]]:
    """Inserts, updates that move rows between partitions, deletes and re-inserts."""
    events = [source.upsert(k, REGIONS[k % 3], k, 0) for k in range(keys)]
    for r in range(1, rounds + 1):
        for k in range(keys):
            if (k + r) % 5 == 0 and k in source.rows:
                events.append(source.delete(k))
            else:
                events.append(source.upsert(k, REGIONS[(k + r) % 3], k * r, r % 3))
    return events


def produce(config: Config, topic: str, events: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = kafka.producer(config.kafka)
    for key, value in events:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


# The idle window also covers the time before the first records arrive: the first fetch from
# every partition of several topics took over 3 s on a loaded machine (a crash run then found
# "nothing new" and exited cleanly). A run that finishes pays it once, at its end.
UNTIL_IDLE_SECONDS = 10


def ingest_process(config_path: Path, failpoint: str | None = None) -> subprocess.CompletedProcess:
    return icecdc_process("ingest", "--config", str(config_path), "--until-idle", str(UNTIL_IDLE_SECONDS), failpoint=failpoint)


@pytest.mark.slow
def test_sigkill_at_every_stage_then_restart_loses_and_duplicates_nothing(spark, stack_config, unique, tmp_path):
    # Three tables, so a batch commits to several at once (ingest.commit_threads): a kill after
    # a table's commit may land while the others' are in flight.
    tables = [TableConfig.model_validate(orders_table(f"it.crash_{t}_{unique}", f"crash-{t}-{unique}")) for t in "abc"]
    config = stack_config.model_copy(
        update={
            "tables": tables,
            "commit_topic": f"commits-{unique}",
            "dead_letter_topic": f"dlq-{unique}",
            "ingest": stack_config.ingest.model_copy(
                update={"max_batch_records": 120, "min_commit_interval_seconds": 0.5, "source": "direct"}
            ),
        }
    )
    source = SourceDatabase()
    events = history(source, keys=30, rounds=6)
    events.insert(50, (b"k", b"{broken"))  # one dead letter, to exercise the dead-letter stage
    for table in tables:
        kafka.ensure_topics(config.kafka, [table.topic], partitions=3)  # keyed: a key's changes share a partition
        produce(config, table.topic, events)
    config_path = write_config(config, tmp_path / "icecdc.yaml")

    # Each run commits at most a batch or two (120 records, of 633): the failpoints below are met
    # whatever share of each topic a batch happens to take.
    for failpoint in ("after-files:2", "after-dead-letters:2", "after-commit:2", "after-files:1"):
        crashed = ingest_process(config_path, failpoint)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    finished = ingest_process(config_path)
    assert finished.returncode == 0, finished.stderr[-3000:]

    referenced: set[str] = set()
    for table in tables:
        name = config.table_ref(table).qualified
        spark.sql(f"REFRESH TABLE {name}")
        assert table_rows(spark, name) == source.expected_rows(), name
        summary = spark.sql(f"SELECT summary FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0].summary
        offsets = orjson.loads(summary["icecdc.offsets"])[table.topic]
        assert sum(offsets.values()) == len(events), name  # every record of every partition, once
        referenced |= {r.file_path for r in spark.sql(f"SELECT file_path FROM {name}.all_files").collect()}
    # Each crash before a commit left written files behind that no snapshot references.
    on_disk = {str(p) for p in Path(config.catalog.properties["warehouse"]).rglob("*.parquet") if f"_{unique}" in str(p)}
    assert referenced < on_disk


def test_streaming_path_and_direct_path_build_identical_tables(spark, stack_config, unique, tmp_path):
    source = SourceDatabase()
    events = [*history(source, keys=25, rounds=4), (b"k", b"{broken")]

    # Structured Streaming over a file source whose rows have the Kafka source's schema, one
    # micro-batch per file, stopped half way and restarted from its checkpoint.
    streamed = TableConfig.model_validate(orders_table(f"it.streamed_{unique}", f"orders-{unique}"))
    stream_config = stack_config.model_copy(
        update={"tables": [streamed], "commit_topic": f"commits-{unique}", "dead_letter_topic": f"dlq-{unique}"}
    )
    ensure_tables(spark, stream_config)
    kafka.ensure_topics(stream_config.kafka, [stream_config.commit_topic, stream_config.dead_letter_topic])
    inbox, checkpoint = tmp_path / "inbox", str(tmp_path / "checkpoint")
    inbox.mkdir()
    chunks = [events[i : i + 30] for i in range(0, len(events), 30)]

    def drop_files(numbers: range) -> None:
        for n in numbers:
            rows = kafka_records(streamed.topic, chunks[n], first_offset=30 * n)
            spark.createDataFrame(rows, KAFKA_SCHEMA).coalesce(1).write.parquet(str(inbox / f"part-{n:03d}"))

    def stream_once() -> BatchWriter:
        producer = kafka.producer(stream_config.kafka)
        writer = BatchWriter(
            spark, stream_config, producer, CommitEventPublisher(producer, stream_config.commit_topic), "streaming"
        )
        stream = (
            spark.readStream.schema(KAFKA_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .option("recursiveFileLookup", "true")
            .parquet(str(inbox))
        )
        run_streaming(stream, writer, checkpoint, min_commit_interval_seconds=0.2, until_idle=4)
        return writer

    half = len(chunks) // 2
    drop_files(range(half))
    first = stream_once()
    assert first.stats.commits == half
    # Forget that Spark finished the last batch: the restart replays it, and the table must
    # recognise it as committed.
    commit_log = Path(checkpoint, "commits")
    last = max(int(p.name) for p in commit_log.iterdir() if p.name.isdigit())
    (commit_log / str(last)).unlink()
    (commit_log / f".{last}.crc").unlink(missing_ok=True)
    drop_files(range(half, len(chunks)))
    second = stream_once()
    assert second.stats.batches_skipped == 1
    assert second.stats.commits == len(chunks) - half

    # The direct Kafka path, from the broker, over the same events.
    direct = TableConfig.model_validate(orders_table(f"it.direct_{unique}", f"direct-{unique}"))
    direct_config = stream_config.model_copy(
        update={
            "tables": [direct],
            "ingest": stream_config.ingest.model_copy(update={"source": "direct", "min_commit_interval_seconds": 0.5}),
        }
    )
    kafka.ensure_topics(direct_config.kafka, [direct.topic])
    produce(direct_config, direct.topic, events)
    stats = run_ingest(direct_config, until_idle=3, spark=spark)
    assert stats.dead_letters == 1

    expected = source.expected_rows()
    assert table_rows(spark, stream_config.table_ref(streamed).qualified) == expected
    assert table_rows(spark, direct_config.table_ref(direct).qualified) == expected
