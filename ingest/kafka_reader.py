"""Where micro-batches come from. Both sources feed the same ``BatchWriter``:

- ``run_streaming``: a Spark Structured Streaming query with ``foreachBatch``. In production its
  input is ``readStream.format("kafka")`` (the spark-sql-kafka connector, resolved through
  ``spark.jars.packages``); tests drive the same function from a file stream with the Kafka
  source's schema. Spark's checkpoint replays an unfinished batch after a crash; the writer's
  offset filter turns an already committed replay into a no-op.
- ``DirectKafkaSource`` + ``run_direct``: confluent-kafka reading bounded micro-batches, for
  machines without the connector, each written as soon as ``batch_cadence`` says it is worth a
  commit. It starts at the offsets the tables committed (the tables, not the consumer group, are
  the source of truth); the group's offsets are committed after each batch only so that
  standard lag tools see progress.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from icecdc.domain.errors import UserError
from icecdc.domain.idle import CatalogWaits
from icecdc.domain.sourcespec import UnavailableValues
from icecdc.ingest import metrics
from icecdc.ingest.batch_cadence import Cadence, Collecting, batch_end, next_check
from icecdc.ingest.debezium import NEW_KEY_HEADER, OLD_KEY_HEADER
from icecdc.ingest.records import PolledRecords
from icecdc.ingest.writer import BatchTiming
from icecdc.jvm.bridge import JavaBridge
from icecdc.runtime import kafka
from icecdc.runtime.config import Config
from icecdc.runtime.health import Health
from icecdc.runtime.lifecycle import UntilIdle

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

KAFKA_PROVIDER_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
# (micro-batch, batch id): Structured Streaming hands a DataFrame and numbers its batches, the
# direct reader hands the records it polled and names them.
BatchFunction = Callable[["DataFrame | PolledRecords", "int | str"], Any]
# The longest blocking consume: the loop beats its health and sees a stop at least this often.
BLOCK_SECONDS = 0.5
CONSUME_MAX = 10_000  # records one consume call returns at most


def kafka_connector_available(spark: SparkSession) -> bool:
    return JavaBridge(spark).class_available(KAFKA_PROVIDER_CLASS)


class MissingTopicError(UserError):
    pass


class DirectKafkaSource:
    """Bounded micro-batches of records from the configured topics."""

    def __init__(self, config: Config, start_offsets: Mapping[tuple[str, int], int]) -> None:
        self._consumer = kafka.consumer(config.kafka, config.ingest.consumer_group)
        metadata = self._consumer.list_topics(timeout=30)
        assignment = []
        for table in config.ingested_tables:
            topic = metadata.topics.get(table.source_topic)
            if topic is None or topic.error is not None:
                raise MissingTopicError(
                    f"topic {table.source_topic} (table {table.name}) does not exist on {config.kafka.bootstrap_servers}"
                )
            for partition in sorted(topic.partitions):
                assignment.append(
                    TopicPartition(
                        table.source_topic, partition, start_offsets.get((table.source_topic, partition), OFFSET_BEGINNING)
                    )
                )
        self._assignment = assignment
        self.partition_count = len(assignment)
        self._consumer.assign(assignment)
        self._positions: dict[tuple[str, int], int] = {}
        self._headers = reads_headers(config)
        # The reader's start counts as the previous batch's (docs/ingest.md, "When a batch ends").
        self._batch_started = time.monotonic()

    def poll_batch(self, cadence: Cadence) -> list[dict[str, Any]]:
        """The next batch's records, once it is worth a commit (``batch_cadence.batch_end``); none
        when nothing arrives within one blocking consume, so the caller's loop goes on."""
        records: list[dict[str, Any]] = []
        first_record_at: float | None = None
        drained = False
        while True:
            now = time.monotonic()
            batch = Collecting(len(records), self._batch_started, first_record_at, drained)
            end = batch_end(batch, now, cadence)
            if end is not None:
                log.debug(
                    "batch of %d records ends (%s): %.3fs since the previous batch started, %.3fs since its first record",
                    len(records),
                    end.value,
                    now - self._batch_started,
                    now - (first_record_at or now),
                )
                metrics.BATCH_ENDS.labels(end.value).inc()
                self._batch_started = now
                return records
            if not records:
                # Waits for the first record only: a blocking consume returns early only when full.
                asked, timeout = 1, BLOCK_SECONDS
            else:
                asked = min(cadence.max_batch_records - len(records), CONSUME_MAX)
                # Caught up before the floor: wait for the floor, taking what arrives meanwhile.
                timeout = min(next_check(batch, now, cadence), BLOCK_SECONDS) if drained else 0
            messages = self._consumer.consume(asked, timeout=timeout)
            if not records and not messages:
                return records
            self._append(records, messages)
            if first_record_at is None and records:
                first_record_at = time.monotonic()
            drained = len(messages) < asked

    def _append(self, records: list[dict[str, Any]], messages: list[Any]) -> None:
        for message in messages:
            if message.error() is not None:
                log.warning("kafka: %s", message.error())
                continue
            kind, millis = message.timestamp()
            topic, partition, offset = message.topic() or "", message.partition() or 0, message.offset() or 0
            records.append(
                {
                    "key": message.key(),
                    "value": message.value(),
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "timestamp": dt.datetime.fromtimestamp(millis / 1000, dt.timezone.utc) if millis >= 0 else None,
                    "timestampType": kind,
                }
            )
            if self._headers:
                records[-1]["headers"] = _key_change_headers(message.headers())
            self._positions[(topic, partition)] = offset + 1

    def lag(self) -> int | None:
        """Records behind the high watermarks (approximate: the embedded broker's watermarks can
        be a few records off, so this is for progress display only)."""
        total = 0
        for tp in self._assignment:
            try:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=5, cached=False)
            except Exception:  # noqa: BLE001 - lag is informational; any client error means "unknown"
                return None
            total += max(0, high - self._positions.get((tp.topic, tp.partition), max(tp.offset, 0)))
        return total

    def commit_group_offsets(self) -> None:
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._positions.items()]
        if offsets:
            self._consumer.commit(offsets=offsets, asynchronous=True)

    def close(self) -> None:
        self._consumer.close()


def source_rows(
    topic: str, pairs: Sequence[tuple[bytes | None, bytes | None]], first_offset: int, partition: int = 0
) -> list[dict[str, Any]]:
    """(key, value) pairs as rows with the Kafka source's schema, as if read from one partition
    starting at ``first_offset`` (the benchmarks feed the writer this way)."""
    now = dt.datetime.now(dt.timezone.utc)
    return [
        {
            "key": k,
            "value": v,
            "topic": topic,
            "partition": partition,
            "offset": first_offset + i,
            "timestamp": now,
            "timestampType": 0,
        }
        for i, (k, v) in enumerate(pairs)
    ]


def reads_headers(config: Config) -> bool:
    """Whether the source reads record headers: only the key-change headers matter, and only to
    tables that resolve unavailable values."""
    return any(t.unavailable_values is UnavailableValues.RESOLVE for t in config.ingested_tables)


def _key_change_headers(headers: Any) -> list[tuple[str, Any]]:
    """The headers the parse stage reads (a primary-key change's) of librdkafka's (name, value)
    list, in Spark's shape; the rest left out."""
    return [(name, value) for name, value in headers or () if name in (OLD_KEY_HEADER, NEW_KEY_HEADER)]


def cadence_of(config: Config) -> Cadence:
    ingest = config.ingest
    return Cadence(ingest.max_batch_records, ingest.min_commit_interval_seconds, ingest.max_commit_delay_seconds)


def run_direct(
    spark: SparkSession,
    config: Config,
    source: DirectKafkaSource,
    write: BatchFunction,
    until_idle: float | None,
    stop: threading.Event | None = None,
    health: Health | None = None,
    catalog_waits: Callable[[], CatalogWaits] = CatalogWaits,
    observe: Callable[[BatchTiming], None] | None = None,
) -> int:
    """Poll, write, repeat; returns the number of batches written. ``catalog_waits`` (the
    command's ``CatalogRetry.waits``) keeps time blocked on the catalog out of ``until_idle``;
    ``observe`` is handed each written batch's timing (the latency bench splits its path with it)."""
    run = uuid.uuid4().hex[:8]
    batches = 0
    idle = UntilIdle(until_idle, catalog_waits)
    health = health or Health(float("inf"))
    health.mark("source", True, f"Kafka consumer assigned {source.partition_count} topic partitions")
    cadence = cadence_of(config)
    while stop is None or not stop.is_set():
        health.beat()
        records = source.poll_batch(cadence)
        if records:
            polled_at = time.time()
            result = write(PolledRecords(spark, records), f"{run}-{batches}")
            if observe is not None:
                observe(BatchTiming(polled_at, result))
            source.commit_group_offsets()
            batches += 1
            idle.active()
            lag = source.lag()
            if lag is not None:
                metrics.LAG.set(lag)
                log.info("lag: about %d records behind the high watermarks", lag)
        elif idle.reached():
            log.info("no new records for %.0fs: stopping", idle.seconds)
            break
    return batches


def kafka_stream(spark: SparkSession, config: Config) -> DataFrame:
    """Spark's Kafka source over the configured topics. Starting at the earliest offsets is safe:
    the writer drops what the tables already committed."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka.bootstrap_servers)
        .option("subscribe", ",".join(t.source_topic for t in config.ingested_tables))
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(config.ingest.max_batch_records))
    )
    if reads_headers(config):
        reader = reader.option("includeHeaders", "true")
    for key, value in config.kafka.properties.items():
        reader = reader.option(f"kafka.{key}", str(value))
    return reader.load()


def run_streaming(
    stream: DataFrame,
    write: BatchFunction,
    checkpoint: str,
    min_commit_interval_seconds: float,
    until_idle: float | None,
    stop: threading.Event | None = None,
    health: Health | None = None,
    catalog_waits: Callable[[], CatalogWaits] = CatalogWaits,
) -> None:
    """Run a Structured Streaming query with ``write`` as its foreachBatch function until it is
    idle for ``until_idle`` seconds (time blocked on the catalog not counted, as in
    ``run_direct``), or until ``stop`` is set. A micro-batch starts every
    ``min_commit_interval_seconds``, or as soon as the previous one ends when it took longer."""
    query = (
        stream.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{min_commit_interval_seconds} seconds")
        .start()
    )
    idle = UntilIdle(until_idle, catalog_waits)
    health = health or Health(float("inf"))
    try:
        while query.isActive:
            health.mark("source", True, f"streaming query {query.id} active")
            health.beat()
            query.awaitTermination(0.5)  # type: ignore[arg-type]  # seconds; PySpark's hint says int, it takes any number
            status = query.status
            # Stop only between batches: interrupting one is safe (the replay is recognised) but wasted.
            if status.get("isTriggerActive") or status.get("isDataAvailable"):
                idle.active()
                continue
            if stop is not None and stop.is_set():
                break
            if idle.reached():
                log.info("no new records for %.0fs: stopping the query", idle.seconds)
                break
    finally:
        health.mark("source", False, "streaming query stopped")
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
