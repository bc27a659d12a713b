"""What every bench shares: a stack scoped to the run (an embedded broker, its config, one Spark
session), configs cloned with a run's own tables, the ingester's writer fed like a source."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from icecdc.domain.tableref import TableRef
from icecdc.runtime import kafka
from icecdc.runtime.broker import EmbeddedBroker, free_port
from icecdc.runtime.catalog import ensure_tables
from icecdc.runtime.config import Config, embedded_config

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from icecdc.ingest.records import PolledRecords
    from icecdc.ingest.writer import BatchResult, BatchWriter


def progress(bench: str) -> Callable[[str], None]:
    """Progress lines of one benchmark, flushed at once (runs last minutes)."""

    def say(message: str) -> None:
        print(f"[bench {bench}] {message}", flush=True)

    return say


@dataclass(frozen=True)
class BenchStack:
    config: Config  # the embedded default, pointed at this run's broker
    spark: SparkSession
    run_id: int  # suffixes the run's tables and topics, so runs never collide

    def ref(self, table: str) -> TableRef:
        return self.config.table_ref(table)


@contextmanager
def bench_stack(name: str, state_dir: Path, *, broker: bool = True, **overrides: Any) -> Iterator[BenchStack]:
    """The run's stack; the broker stops when the block ends, so Kafka clients stay inside it."""
    from icecdc.runtime.spark import spark_session

    embedded = EmbeddedBroker(state_dir / "broker", free_port()) if broker else None
    if embedded is not None:
        embedded.start()
    try:
        config = embedded_config(state_dir, embedded.port if embedded else 0, **overrides)
        with spark_session(config, f"icecdc-bench-{name}") as spark:
            yield BenchStack(config, spark, int(time.time()))
    finally:
        if embedded is not None:
            embedded.stop()


def differing_rows(table: Any, expected: Any) -> int:
    """Rows in which two DataFrames differ, counted both ways by Spark (a key twice is a delete
    not applied), since at users' partition sizes the rows do not fit in Python."""
    return int(table.exceptAll(expected).count() + expected.exceptAll(table).count())


def clone(config: Config, **updates: Any) -> Config:
    """``config`` with top-level keys replaced (tables, topics, compactor settings...)."""
    return Config.model_validate({**config.model_dump(by_alias=True), **updates})


class FeedWriter:
    """The ingester's micro-batch writer, fed (key, value) records as a source would deliver
    them: each table reads the same records from its own topic, one Spark job and one commit per
    table per batch, at offsets that continue from batch to batch."""

    def __init__(self, spark: SparkSession, config: Config, source_name: str = "bench") -> None:
        from icecdc.ingest.publish import CommitEventPublisher
        from icecdc.ingest.writer import BatchWriter

        ensure_tables(spark, config)
        kafka.ensure_topics(config.kafka, [config.commit_topic, config.dead_letter_topic])
        self._spark = spark
        self._producer = kafka.producer(config.kafka)
        self.writer: BatchWriter = BatchWriter(
            spark, config, self._producer, CommitEventPublisher(self._producer, config.commit_topic), source_name
        )
        self._topics = [t.source_topic for t in config.ingested_tables]
        self._offset = 0

    def frame(self, pairs: Sequence[tuple[bytes | None, bytes | None]], topics: Sequence[str] | None = None) -> Any:
        """The next batch as the DataFrame a source hands ``foreachBatch``, the same records on every
        table's topic (build it outside any timer)."""
        return self.polled_by_topic(dict.fromkeys(topics or self._topics, pairs)).frame(self.writer.prefixes)

    def polled_by_topic(self, pairs: Mapping[str, Sequence[tuple[bytes | None, bytes | None]]]) -> PolledRecords:
        """The next batch with each topic's own records, as the direct reader hands it over."""
        from icecdc.ingest.kafka_reader import source_rows
        from icecdc.ingest.records import PolledRecords

        rows = [row for topic, records in pairs.items() for row in source_rows(topic, records, self._offset)]
        self._offset += max((len(records) for records in pairs.values()), default=0)
        return PolledRecords(self._spark, rows)

    def write(self, pairs: Sequence[tuple[bytes | None, bytes | None]], batch_id: int) -> BatchResult:
        return self.writer(self.frame(pairs), batch_id)

    def close(self) -> None:
        self._producer.flush(10)


@dataclass(frozen=True)
class CompactorCounts:
    """A compactor process's work on one table, scraped from its metrics endpoint."""

    compactions: int
    compactions_not_committed: int
    commit_attempts: int
    commit_conflicts: int
    commit_retries: int
    gave_up: int
    conflict_rate: float
    quiet_wait_mean_seconds: float


class CompactorProcess:
    """``icecdc compact`` in its own process, as deployed: it shares the cores, not the JVM."""

    def __init__(self, config: Config, name: str, out: Path, ready_seconds: float = 120.0) -> None:
        self.port = free_port()
        data = config.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["compactor"]["http"] = {"host": "127.0.0.1", "port": self.port}
        path = out / f"compactor-{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(data))  # JSON is YAML
        self.log = out / f"compactor-{name}.log"
        with self.log.open("w") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "icecdc.cli", "compact", "--config", str(path)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + ready_seconds
        while not self._ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._process.kill()
                raise RuntimeError(f"the {name} compactor did not become ready; see {self.log}")
            time.sleep(0.5)

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, b""
        except OSError:
            return 0, b""

    def _ready(self) -> bool:
        return self._get("/readyz")[0] == 200

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        _, body = self._get("/metrics")
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
        }

    def counts(self, *tables: str) -> CompactorCounts:
        """The sidecar's figures over ``tables``."""
        metrics = self.metrics()

        def total(name: str, **labels: str) -> float:
            return sum(
                v
                for (n, ls), v in metrics.items()
                if n == name and dict(ls).get("table") in tables and all(dict(ls).get(k) == x for k, x in labels.items())
            )

        attempts = total("icecdc_compactor_commit_attempts_total")
        conflicts = total("icecdc_compactor_commit_conflicts_total")
        return CompactorCounts(
            compactions=int(total("icecdc_compactions_total", outcome="committed")),
            compactions_not_committed=int(
                total("icecdc_compactions_total") - total("icecdc_compactions_total", outcome="committed")
            ),
            commit_attempts=int(attempts),
            commit_conflicts=int(conflicts),
            commit_retries=int(total("icecdc_compactor_commit_retries_total")),
            gave_up=int(total("icecdc_compactor_commit_gave_up_total")),
            conflict_rate=conflicts / attempts if attempts else 0.0,
            quiet_wait_mean_seconds=(
                total("icecdc_compactor_quiet_wait_seconds_sum") / max(1.0, total("icecdc_compactor_quiet_wait_seconds_count"))
            ),
        )

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(120)
