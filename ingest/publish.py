"""What the ingester sends to Kafka besides reading: rejected records to the dead-letter topic
(before the batch commits, so a crash can duplicate a dead letter but never lose one) and commit
events (after the commit, retried until delivered)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from confluent_kafka import KafkaError, Message, Producer
from tenacity import RetryCallState, retry, retry_if_result, stop_after_attempt, wait_random_exponential

from icecdc.domain.events import CommitEvent
from icecdc.ingest import metrics
from icecdc.ingest.batch_decisions import DeadLetter

log = logging.getLogger(__name__)

HEADER_REASON = "icecdc.reason"
HEADER_DETAIL = "icecdc.detail"
HEADER_TOPIC = "icecdc.source.topic"
HEADER_PARTITION = "icecdc.source.partition"
HEADER_OFFSET = "icecdc.source.offset"
HEADER_TABLE = "icecdc.table"


class DeliveryError(RuntimeError):
    pass


def _headers(letter: DeadLetter) -> list[tuple[str, str | bytes | None]]:
    headers = [
        (HEADER_REASON, letter.reason),
        (HEADER_DETAIL, letter.detail),
        (HEADER_TOPIC, letter.topic),
        (HEADER_PARTITION, str(letter.partition)),
        (HEADER_OFFSET, str(letter.offset)),
    ]
    if letter.table:
        headers.append((HEADER_TABLE, letter.table))
    return [(name, value.encode()) for name, value in headers]


class DeadLetterTopic:
    """Where rejected records go, with their reason and source position in headers."""

    def __init__(self, producer: Producer, topic: str, timeout: float = 60.0) -> None:
        self._producer = producer
        self.topic = topic
        self._timeout = timeout

    def send(self, letters: Iterable[DeadLetter]) -> int:
        """Produce and wait for every dead letter; raises DeliveryError if any was not delivered,
        so the batch fails before it commits (and is retried) instead of dropping bad records."""
        failures: list[str] = []

        def on_delivery(error: KafkaError | None, _: Message) -> None:
            if error is not None:
                failures.append(str(error))

        count = 0
        for letter in letters:
            self._producer.produce(
                self.topic, key=letter.key, value=letter.value, headers=_headers(letter), on_delivery=on_delivery
            )
            self._producer.poll(0)
            count += 1
        remaining = self._producer.flush(self._timeout)
        if failures or remaining:
            raise DeliveryError(f"{len(failures) + remaining} dead letters were not delivered to {self.topic}: {failures[:3]}")
        return count


class CommitEventPublisher:
    """Publishes commit events keyed by table. librdkafka retries each send itself (idempotent
    producer); a send that still fails is kept and sent again with the next event or at close,
    and counted (``icecdc_ingest_commit_events_retried_total``), so a lost event is never silent. (The compactor also rebuilds its state from
    table metadata, so a lost event delays compaction but cannot corrupt anything.)"""

    def __init__(self, producer: Producer, topic: str) -> None:
        self._producer = producer
        self._topic = topic
        self._retry: list[tuple[str, bytes]] = []
        self.published = 0

    def _send(self, key: str, value: bytes) -> None:
        def on_delivery(error: KafkaError | None, _: Message) -> None:
            if error is None:
                self.published += 1
                metrics.COMMIT_EVENTS.inc()
            else:
                metrics.COMMIT_EVENTS_RETRIED.inc()
                log.warning("commit event for %s not delivered (%s); will retry", key, error)
                self._retry.append((key, value))

        self._producer.produce(self._topic, key=key.encode(), value=value, on_delivery=on_delivery)

    def publish(self, event: CommitEvent) -> None:
        pending, self._retry = self._retry, []
        for key, value in pending:
            self._send(key, value)
        self._send(event.table, event.to_json())
        self._producer.poll(0)

    @property
    def pending(self) -> int:
        return len(self._producer) + len(self._retry)

    def close(self, timeout: float = 30.0) -> int:
        """Deliver everything outstanding; returns how many events could not be delivered."""

        def last_count(state: RetryCallState) -> int:
            return int(state.outcome.result()) if state.outcome is not None else self.pending

        @retry(
            stop=stop_after_attempt(5),
            wait=wait_random_exponential(multiplier=0.5, max=5),
            retry=retry_if_result(lambda left: left > 0),
            retry_error_callback=last_count,
        )
        def drain() -> int:
            pending, self._retry = self._retry, []
            for key, value in pending:
                self._send(key, value)
            self._producer.flush(timeout / 5)
            return self.pending

        left = drain()
        if left:
            log.error(
                "%d commit events could not be delivered to %s; the compactor will find those commits from table metadata",
                left,
                self._topic,
            )
        return left
