"""The embedded broker, started by the code: topics, produce, group consume, commit, resume; and
the direct reader's batches against it."""

import subprocess
import sys
import time

from confluent_kafka import TopicPartition
from prometheus_client import REGISTRY

from icecdc.ingest.batch_cadence import BatchEnd
from icecdc.ingest.kafka_reader import BLOCK_SECONDS, DirectKafkaSource, cadence_of
from icecdc.runtime import kafka
from icecdc.runtime.broker import EmbeddedBroker, free_port
from icecdc.runtime.config import TableConfig
from tests.cdc import orders_table


def consume(consumer, count: int, timeout: float = 60.0) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            got.append((message.offset(), message.value()))
    return got


def test_group_consumer_resumes_from_committed_offset(stack_config, unique):
    topic, group = f"resume-{unique}", f"group-{unique}"
    assert kafka.ensure_topics(stack_config.kafka, [topic]) == [topic]
    assert kafka.ensure_topics(stack_config.kafka, [topic]) == []  # second call: nothing to do

    producer = kafka.producer(stack_config.kafka)
    for i in range(10):
        producer.produce(topic, key=b"k", value=f"v{i}".encode())
    assert producer.flush(10) == 0

    first = kafka.consumer(stack_config.kafka, group)
    first.subscribe([topic])
    got = consume(first, 4)
    assert [v for _, v in got] == [b"v0", b"v1", b"v2", b"v3"]
    # Commit exactly up to what was processed (the next offset to read), then go away.
    first.commit(offsets=[TopicPartition(topic, 0, got[-1][0] + 1)], asynchronous=False)
    first.close()

    second = kafka.consumer(stack_config.kafka, group)
    second.subscribe([topic])
    try:
        rest = consume(second, 6)
        assert [v for _, v in rest] == [f"v{i}".encode() for i in range(4, 10)]
        committed = second.committed([TopicPartition(topic, 0)], timeout=10)
        assert committed[0].offset == 4
    finally:
        second.close()


def test_cli_starts_and_stops_a_broker(tmp_path):
    port = free_port()
    cli = [sys.executable, "-m", "icecdc.cli", "broker"]
    args = ["--state-dir", str(tmp_path), "--port", str(port)]
    assert "started" in subprocess.run([*cli, "start", *args], check=True, capture_output=True, text=True).stdout
    broker = EmbeddedBroker(tmp_path / "broker", port)
    try:
        assert broker.is_running()
        assert "already running" in subprocess.run([*cli, "start", *args], check=True, capture_output=True, text=True).stdout
        assert subprocess.run([*cli, "status", *args], check=False).returncode == 0
    finally:
        assert "stopped" in subprocess.run([*cli, "stop", *args], check=True, capture_output=True, text=True).stdout
    assert not broker.is_running()
    assert subprocess.run([*cli, "status", *args], check=False, capture_output=True).returncode == 3


def test_port_taken_by_someone_else_is_a_clear_error(broker, tmp_path):
    import pytest

    from icecdc.runtime.broker import BrokerError

    with pytest.raises(BrokerError, match=f"port {broker.port} .* is taken"):
        EmbeddedBroker(tmp_path, broker.port).start()


def batch_ends() -> dict[BatchEnd, float]:
    return {end: REGISTRY.get_sample_value("icecdc_ingest_batch_ends_total", {"reason": end.value}) or 0.0 for end in BatchEnd}


def test_the_direct_reader_ends_a_batch_when_full_or_caught_up_and_never_empty(stack_config, unique):
    topic = f"cadence-{unique}"
    kafka.ensure_topics(stack_config.kafka, [topic])
    config = stack_config.model_copy(
        update={
            "tables": [TableConfig.model_validate(orders_table(f"it.cadence_{unique}", topic))],
            "ingest": stack_config.ingest.model_copy(
                update={"max_batch_records": 100, "min_commit_interval_seconds": 0.5, "max_commit_delay_seconds": 30}
            ),
        }
    )
    cadence = cadence_of(config)
    producer = kafka.producer(config.kafka)

    def send(count: int, start: int) -> None:
        for i in range(start, start + count):
            producer.produce(topic, key=b"%d" % i, value=b"v%d" % i)
        assert producer.flush(10) == 0

    send(250, 0)
    source = DirectKafkaSource(config, {})
    try:
        before = batch_ends()
        started = time.monotonic()
        batches = [source.poll_batch(cadence) for _ in range(3)]
        # A backlog: full batches at once, then what is left once the floor has passed.
        assert [len(b) for b in batches] == [100, 100, 50]
        assert [r["offset"] for b in batches for r in b] == list(range(250))
        assert time.monotonic() - started >= cadence.min_commit_interval_seconds
        after = batch_ends()
        assert {end: after[end] - before[end] for end in BatchEnd} == {
            BatchEnd.FULL: 2,
            BatchEnd.CAUGHT_UP: 1,
            BatchEnd.DELAY_REACHED: 0,
        }

        # Nothing to read: no batch, after one short blocking consume.
        asked = time.monotonic()
        assert source.poll_batch(cadence) == []
        assert time.monotonic() - asked < cadence.max_commit_delay_seconds

        # A quiet stream: a lone record is committed as soon as it is read, not after the delay.
        send(1, 250)
        sent, lone = time.monotonic(), []
        while not lone and time.monotonic() - sent < cadence.max_commit_delay_seconds:
            lone = source.poll_batch(cadence)
        assert [r["offset"] for r in lone] == [250]
        assert time.monotonic() - sent < cadence.max_commit_delay_seconds - BLOCK_SECONDS
        assert batch_ends()[BatchEnd.CAUGHT_UP] - after[BatchEnd.CAUGHT_UP] == 1
    finally:
        source.close()
