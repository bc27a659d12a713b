"""Slot leases from Kafka's consumer-group protocol.

Each replica is a member of the compactor consumer group on the lease topic, whose partitions
are the slots. The group coordinator (the broker) gives each slot to exactly one member; a member
that stops heartbeating for ``session_timeout_seconds`` (dead, frozen, cut off) is removed and its
slots go to the others at the next rebalance. Nothing is ever produced to the lease topic.

The eager assignment protocol makes a handover clean between live members: a member gives its
slots up only when it next polls, that is between compactions, and no member gets them before it
has. A member that was removed while frozen does not know it yet when it wakes up; the lease
check before every commit (``confirm``) asks the broker, with a synchronous offset commit that
the broker refuses from a member that is no longer in the current generation. A pause between
that check and the catalog's compare-and-set is covered by Iceberg itself (docs/coordinator.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from icecdc.coordinator.errors import LeaseLost
from icecdc.coordinator.ownership import Ownership
from icecdc.runtime import kafka
from icecdc.runtime.config import Config, ScalarProperty

log = logging.getLogger(__name__)


class PartitionLeases:
    def __init__(self, config: Config, replica: str) -> None:
        settings = config.coordinator
        self._topic = settings.lease_topic
        self._replica = replica
        kafka.ensure_topics(config.kafka, [self._topic], partitions=settings.lease_slots)
        slots = kafka.partition_count(config.kafka, self._topic)
        if slots != settings.lease_slots:
            log.warning(
                "lease topic %s has %d partitions, not the configured %d; using %d slots "
                "(the count is fixed when the topic is created)",
                self._topic,
                slots,
                settings.lease_slots,
                slots,
            )
        self.ownership = Ownership(slots)
        self.joined = False
        # When this replica last asked to join the group (subscribing, or giving its slots up for
        # a rebalance). A rebalance completes only once every live member has joined it, and a
        # member joins only between two pieces of work; so when this replica is given slots, every
        # run that started before it asked, on any replica, has ended or was cut off by a death.
        self._joining_since = time.time()
        self.work_over_before = float("-inf")
        group_settings: dict[str, ScalarProperty] = {
            "session.timeout.ms": int(settings.session_timeout_seconds * 1000),
            "heartbeat.interval.ms": max(100, int(settings.session_timeout_seconds * 100)),
            "max.poll.interval.ms": int(settings.max_compaction_seconds * 1000),
            # Round-robin spreads slots evenly. Eager: every member releases its slots (from its
            # main loop, between two pieces of work) before any is handed out again.
            "partition.assignment.strategy": "roundrobin",
        }
        self._consumer = kafka.consumer(config.kafka, config.compactor.consumer_group, **group_settings)
        self._consumer.subscribe([self._topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)

    def _assigned(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.joined = True
        self.work_over_before = self._joining_since
        self.ownership.assign({p.partition for p in partitions})
        log.info(
            "replica %s holds %d of %d slots: %s",
            self._replica,
            len(partitions),
            self.ownership.slots,
            sorted(self.ownership.held),
            extra={"replica": self._replica},
        )

    def _revoked(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._joining_since = time.time()
        self.ownership.revoke()
        log.info("replica %s gave up its slots for a rebalance", self._replica, extra={"replica": self._replica})

    def _lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._joining_since = time.time()
        self.ownership.revoke()
        log.warning(
            "replica %s lost its slots (it was out of the group, e.g. paused past the session timeout)",
            self._replica,
            extra={"replica": self._replica},
        )

    def poll(self) -> None:
        """Serve the group protocol: rebalance callbacks run only from here."""
        self._consumer.poll(0)

    def owns(self, table: str, partition_path: str) -> bool:
        return self.ownership.owns(table, partition_path)

    def owns_maintenance(self, table: str) -> bool:
        return self.ownership.owns_maintenance(table)

    def confirm(self, slot: int, what: str) -> None:
        """Raise LeaseLost unless the broker still counts this replica as the slot's owner."""
        if slot not in self.ownership.held:
            raise LeaseLost(f"slot {slot} is no longer held by {self._replica}")
        try:
            # The broker accepts an offset commit only from a member of the current generation.
            self._consumer.commit(
                offsets=[TopicPartition(self._topic, slot, 0, metadata=f"{self._replica}: {what}"[:200])], asynchronous=False
            )
        except KafkaException as exc:
            self.ownership.revoke()
            raise LeaseLost(
                f"the group no longer counts {self._replica} as the owner of slot {slot}: {exc.args[0].str()}"
            ) from None

    def close(self) -> None:
        self._consumer.close()
