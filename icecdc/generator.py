"""``icecdc generate``: a synthetic upstream database for demos and deployments without one. It
sends Debezium change events for an ``orders`` table (``workload.OrdersWorkload``) to the
table's topic: a snapshot, then a steady rate of changes, moving to a new day every
``seconds_per_day`` so that older day partitions cool down."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from confluent_kafka import Producer

from icecdc.runtime import kafka
from icecdc.runtime.config import Config
from icecdc.workload import Change, OrdersWorkload

log = logging.getLogger(__name__)


def send(producer: Producer, topic: str, changes: Iterable[Change]) -> int:
    count = 0
    for change in changes:
        producer.produce(topic, key=change.record[0], value=change.record[1])
        producer.poll(0)
        count += 1
    producer.flush(30)
    return count


def run_generator(
    config: Config,
    table: str | None,
    rate: float,
    snapshot_rows: int,
    seconds_per_day: float,
    limit: int | None,
    stop: threading.Event,
) -> int:
    """Returns the number of change events sent."""
    target = config.table(table) if table else config.tables[0]
    kafka.ensure_topics(config.kafka, [target.source_topic])
    producer = kafka.producer(config.kafka)
    workload = OrdersWorkload(recent_keys=max(1, int(rate * seconds_per_day)))
    sent = send(producer, target.source_topic, workload.load(snapshot_rows))
    log.info("snapshot: %d orders sent to %s", sent, target.source_topic)
    started = time.monotonic()
    while not stop.is_set() and (limit is None or sent < limit):
        workload.today = workload.days + int((time.monotonic() - started) // seconds_per_day)
        count = max(1, round(rate)) if limit is None else min(max(1, round(rate)), limit - sent)
        sent += send(producer, target.source_topic, workload.changes(count))
        log.info("%d changes sent to %s (day %d, %d in all)", count, target.source_topic, workload.today + 1, sent)
        stop.wait(1.0)
    return sent
