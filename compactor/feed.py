"""The events every replica reads: the ingester's commit events (the writers' and partitions'
cadences, the files each commit added) and every replica's compaction and maintenance events
(what is in flight). Read in full, outside any consumer group, from the last ``EVENT_TAIL``
events of each topic partition at start; ownership comes from the group (``coordinator.leases``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from icecdc.compactor import metrics
from icecdc.compactor.tracker import PartitionTracker
from icecdc.coordinator.activity import TableActivity
from icecdc.domain.cadence import WriteCadence
from icecdc.domain.events import CommitEvent, CompactionEvent, MaintenanceEvent

log = logging.getLogger(__name__)

# On start, a replica reads this many of the latest events of each topic partition: the writers'
# cadences and the compactions and maintenance runs in flight.
EVENT_TAIL = 10_000


class Message(Protocol):
    def error(self) -> object: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def value(self) -> bytes | None: ...


class EventConsumer(Protocol):
    def consume(self, num_messages: int, timeout: float) -> Sequence[Message]: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class EventTopics:
    commits: str
    compactions: str
    maintenance: str


class EventFeed:
    def __init__(
        self,
        consumer: EventConsumer,
        topics: EventTopics,
        tables: Collection[str],
        tracker: PartitionTracker,
        activity: TableActivity,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._consumer = consumer
        self._topics = topics
        self._tables = set(tables)
        self._tracker = tracker
        self._activity = activity
        self._clock = clock
        self._writers: dict[str, WriteCadence] = {}
        self.commit_events = 0
        self.bad_commit_events = 0
        self.last_commit_event = clock()

    def writer(self, table: str) -> WriteCadence:
        """The commit cadence of a table's writer (for the coordinator's quiet windows)."""
        return self._writers.setdefault(table, WriteCadence())

    def poll(self, timeout: float) -> int:
        """Apply the events that arrive within ``timeout``; returns how many commit events."""
        count = 0
        for message in self._consumer.consume(500, timeout):
            if message.error() is not None:
                log.warning("event topics: %s", message.error())
                continue
            topic, value = message.topic(), message.value() or b""
            try:
                if topic == self._topics.commits:
                    count += self._on_commit(CommitEvent.from_json(value))
                elif topic == self._topics.compactions:
                    self._activity.on_compaction(CompactionEvent.from_json(value))
                else:
                    self._activity.on_maintenance(MaintenanceEvent.from_json(value))
            except Exception as exc:  # noqa: BLE001 - a bad event must not stop the sidecar
                if topic == self._topics.commits:
                    self.bad_commit_events += 1
                    metrics.COMMIT_EVENTS.labels("invalid").inc()
                log.warning("ignoring an invalid event at %s[%s]@%s: %s", topic, message.partition(), message.offset(), exc)
        if count:
            self.last_commit_event = self._clock()
        return count

    def found(self, event: CommitEvent) -> None:
        """A commit of another writer, found in the catalog (``watcher``): applied as its commit
        event would be."""
        if self._on_commit(event):
            self.last_commit_event = self._clock()

    def _on_commit(self, event: CommitEvent) -> int:
        if event.table not in self._tables:
            return 0
        self._tracker.on_commit(event)
        self.writer(event.table).record(event.commit_time_ms / 1000)
        self.commit_events += 1
        metrics.COMMIT_EVENTS.labels("applied").inc()
        metrics.writer_committed(event)
        return 1

    def close(self) -> None:
        self._consumer.close()
