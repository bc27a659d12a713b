"""Kafka clients built from the config, and topic creation.

Every client gets ``kafka.bootstrap_servers`` plus ``kafka.properties`` verbatim, so TLS, SASL
and any other librdkafka setting reach all of them through configuration alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from icecdc.runtime.config import KafkaConfig, ScalarProperty

PRODUCER_DEFAULTS: dict[str, ScalarProperty] = {"linger.ms": 5}
# A shorter session than librdkafka's 45 s bounds how long a dead member holds its partitions
# (and the embedded broker completes a group join in about half a session timeout).
CONSUMER_DEFAULTS: dict[str, ScalarProperty] = {
    "session.timeout.ms": 10000,
    "heartbeat.interval.ms": 1000,
    "auto.offset.reset": "earliest",
}


def producer(kafka: KafkaConfig, **overrides: ScalarProperty) -> Producer:
    # Idempotence: a retried send after a lost ack must not duplicate a commit event.
    return Producer(kafka.client_config(PRODUCER_DEFAULTS, **{"enable.idempotence": True, **overrides}))


def consumer(kafka: KafkaConfig, group_id: str, **overrides: ScalarProperty) -> Consumer:
    # Offsets are committed explicitly, after the work they cover is durable.
    return Consumer(kafka.client_config(CONSUMER_DEFAULTS, **{"group.id": group_id, "enable.auto.commit": False, **overrides}))


def admin(kafka: KafkaConfig) -> AdminClient:
    return AdminClient(kafka.client_config())


def ensure_topics(
    kafka: KafkaConfig, topics: Iterable[str], partitions: int = 1, replication_factor: int = -1, timeout: float = 30.0
) -> list[str]:
    """Create the topics that do not exist yet; returns the ones created. A replication factor of
    -1 takes the broker's default, which suits single-node and production clusters alike."""
    client = admin(kafka)
    existing = set(client.list_topics(timeout=timeout).topics)
    wanted = [t for t in dict.fromkeys(topics) if t not in existing]
    if not wanted:
        return []
    futures = client.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=replication_factor) for t in wanted],
        request_timeout=timeout,
    )
    created = []
    for topic, future in futures.items():
        try:
            future.result(timeout)
            created.append(topic)
        except KafkaException as exc:
            # Another process created it between our listing and our request: that is success.
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def partition_count(kafka: KafkaConfig, topic: str, timeout: float = 30.0) -> int:
    metadata = admin(kafka).list_topics(topic, timeout=timeout).topics[topic]
    if metadata.error is not None:
        raise KafkaException(metadata.error)
    return len(metadata.partitions)


def tail_consumer(kafka: KafkaConfig, group_id: str, topics: Iterable[str], tail: int) -> Consumer:
    """A consumer of every partition of ``topics`` from their last ``tail`` records, outside any
    group (each reader sees everything; nothing is committed). ``group_id`` only names it."""
    client = consumer(kafka, group_id)
    assignment = []
    for topic in topics:
        for partition in range(partition_count(kafka, topic)):
            # The embedded broker's high watermark is off by a few: the tail is approximate.
            low, high = client.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            assignment.append(TopicPartition(topic, partition, max(low, high - tail)))
    client.assign(assignment)
    return client
