"""What a replica tells the others: its compaction and maintenance events, keyed by table. A
``started`` event is flushed before the work it announces goes on (maintenance waits on the
compactions announced, and expiry spares their starting snapshots); the replica's own view of
what is in flight is updated at once, before the topic echoes the event back."""

from __future__ import annotations

from typing import Protocol

from icecdc.compactor.feed import EventTopics
from icecdc.coordinator.activity import TableActivity
from icecdc.domain.events import CompactionEvent, CompactionOutcome, MaintenanceEvent, MaintenanceOutcome


class EventProducer(Protocol):
    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> None: ...
    def poll(self, timeout: float) -> int: ...
    def flush(self, timeout: float) -> int: ...


class EventPublisher:
    def __init__(self, producer: EventProducer, topics: EventTopics, activity: TableActivity) -> None:
        self._producer = producer
        self._topics = topics
        self._activity = activity

    def compaction(self, event: CompactionEvent) -> None:
        self._activity.on_compaction(event)
        self._send(self._topics.compactions, event.table, event.to_json(), event.outcome is CompactionOutcome.STARTED)

    def maintenance(self, event: MaintenanceEvent) -> None:
        self._activity.on_maintenance(event)
        self._send(self._topics.maintenance, event.table, event.to_json(), event.outcome is MaintenanceOutcome.STARTED)

    def _send(self, topic: str, table: str, value: bytes, wait: bool) -> None:
        self._producer.produce(topic, key=table.encode(), value=value)
        if wait:
            self._producer.flush(10)
        else:
            self._producer.poll(0)

    def close(self, timeout: float = 30.0) -> None:
        self._producer.flush(timeout)
