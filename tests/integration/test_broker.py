"""The embedded broker, started by the code: topics, produce, group consume, commit, resume."""

import subprocess
import sys
import time

from confluent_kafka import TopicPartition

from icecdc.runtime import kafka
from icecdc.runtime.broker import EmbeddedBroker, free_port


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
