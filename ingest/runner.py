"""``icecdc ingest``: wire the session, the tables, the Kafka clients and a source to the writer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from icecdc.domain.errors import UserError
from icecdc.ingest.kafka_reader import (
    DirectKafkaSource,
    kafka_connector_available,
    kafka_stream,
    run_direct,
    run_streaming,
)
from icecdc.ingest.publish import CommitEventPublisher
from icecdc.ingest.writer import BatchTiming, BatchWriter, IngestStats
from icecdc.runtime import kafka
from icecdc.runtime.catalog import catalog_check, ensure_tables
from icecdc.runtime.config import Config
from icecdc.runtime.health import Health, serving
from icecdc.runtime.lifecycle import stop_on_signals, stop_reason
from icecdc.runtime.outages import CatalogRetry
from icecdc.runtime.spark import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def run_ingest(
    config: Config,
    until_idle: float | None = None,
    spark: SparkSession | None = None,
    stop: threading.Event | None = None,
    observe: Callable[[BatchTiming], None] | None = None,
) -> IngestStats:
    """Ingest until stopped (SIGTERM/SIGINT finish the current batch first) or idle; ``observe``
    sees each batch the direct reader writes."""
    if not config.ingested_tables:
        raise UserError("the configuration lists no table with a topic to ingest")
    with (
        serving(config.ingest.http, {"catalog": catalog_check(config)}, pending={"source": "not reading yet"}) as health,
        spark_session(config, "icecdc-ingest", spark) as session,
    ):
        return _ingest(config, until_idle, session, stop or stop_on_signals(), health, observe)


def _ingest(
    config: Config,
    until_idle: float | None,
    spark: SparkSession,
    stop: threading.Event,
    health: Health,
    observe: Callable[[BatchTiming], None] | None,
) -> IngestStats:
    retry = CatalogRetry(config.catalog.retry, "ingest", health)
    ensure_tables(spark, config, retry)
    kafka.ensure_topics(config.kafka, [config.commit_topic, config.dead_letter_topic])
    producer = kafka.producer(config.kafka)
    publisher = CommitEventPublisher(producer, config.commit_topic)
    use_streaming = config.ingest.source == "streaming" or (config.ingest.source == "auto" and kafka_connector_available(spark))
    writer = BatchWriter(spark, config, producer, publisher, "streaming" if use_streaming else "direct", retry)
    try:
        if use_streaming:
            checkpoint = str(config.state_dir / "checkpoints" / "ingest")
            log.info("ingesting with Spark's Kafka source (checkpoint %s)", checkpoint)
            run_streaming(
                kafka_stream(spark, config),
                writer,
                checkpoint,
                config.ingest.min_commit_interval_seconds,
                until_idle,
                stop,
                health,
                retry.waits,
            )
        else:
            start = writer.topic_positions(writer.committed_offsets())
            log.info("ingesting with the direct Kafka reader (no spark-sql-kafka connector on the classpath)")
            source = DirectKafkaSource(config, start)
            try:
                run_direct(spark, config, source, writer, until_idle, stop, health, retry.waits, observe)
            finally:
                source.close()
    finally:
        publisher.close()
    stats = writer.stats
    log.info(
        "ingest finished (%s): %d batches, %d records, %d commits, %d dead letters (%s), %d commit events published",
        stop_reason(stop),
        stats.batches,
        stats.records,
        stats.commits,
        stats.dead_letters,
        dict(stats.dead_letters_by_reason),
        publisher.published,
    )
    return stats
