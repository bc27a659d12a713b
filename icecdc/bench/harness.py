"""What every ``icecdc bench`` shares: a stack scoped to the run (an embedded broker, the embedded
config pointed at it, one Spark session), configs cloned with a run's own tables and topics, the
ingester's own writer fed like a source, progress lines, and the plot set-up."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
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

from icecdc.bench.report import markdown_table
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
    """The run's stack: the broker stops when the block ends (its Kafka clients must be gone by
    then, so benches keep them inside the block)."""
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


def rss_peak_reset() -> None:
    """Reset the kernel's peak-RSS mark of this process (Linux: clear_refs 5)."""
    with contextlib.suppress(OSError):  # not Linux: the peak is since the process started
        Path("/proc/self/clear_refs").write_text("5")


def rss_kib(field_name: str, pid: int | str = "self") -> int:
    """A memory field of a process's /proc status (VmRSS, VmHWM), in KiB; 0 when unknown."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int | str = "self") -> float:
    """A process's CPU time so far, user and system, over all its threads (Linux's /proc: the
    JVM's includes its garbage collector and compilers); 0 when unknown."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}"))


# The JVM's JIT compiler threads ("C1 CompilerThread0", "C2 CompilerThread1", ...; Linux keeps
# the first 15 characters of a thread's name).
JIT_THREAD = re.compile(r"C\d CompilerThre")


def jit_cpu_seconds(pid: int | str) -> dict[str, float]:
    """The CPU time so far of each of a JVM's JIT compiler threads alive now, by thread id; the
    JVM starts and ends them with the work queued (``UseDynamicNumberOfCompilerThreads``), so two
    readings are compared thread by thread (``jit_cpu_between``)."""
    threads: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            if JIT_THREAD.match((task / "comm").read_text()):
                threads[task.name] = _stat_cpu_seconds(task)
    return threads


def jit_cpu_between(before: dict[str, float], after: dict[str, float]) -> float:
    """The JIT compilers' CPU seconds between two readings of ``jit_cpu_seconds``: a thread that
    ended between them is missed (never counted negative), one that started counts whole."""
    return sum(max(0.0, seconds - before.get(thread, 0.0)) for thread, seconds in after.items())


def _stat_cpu_seconds(process: Path) -> float:
    """User and system CPU seconds from a /proc process or task directory; 0 when unknown."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = (process / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


class WorkerMemory:
    """The peak summed resident memory of a process's descendants (Spark's Python workers under
    the JVM), sampled every ``interval`` seconds on a thread while the block runs: workers come
    and go within a job, so no single process's peak mark would tell."""

    def __init__(self, root_pid: int, interval: float = 0.05) -> None:
        self._root, self._interval = root_pid, interval
        self.peak_kib = 0
        self._stop = threading.Event()

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        out, todo = [], list(children.get(self._root, []))
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak_kib = max(self.peak_kib, sum(rss_kib("VmRSS", pid) for pid in self._descendants()))

    def __enter__(self) -> WorkerMemory:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class StageCost:
    """One Spark stage, as Spark's own monitoring API reports it: where a job's time went."""

    stage_id: int
    name: str
    tasks: int
    wall_seconds: float  # submission to completion
    run_seconds: float  # summed over tasks: executor run time
    cpu_seconds: float
    gc_seconds: float
    deserialize_seconds: float  # task deserialization, summed
    input_mb: float
    output_mb: float
    shuffle_read_mb: float
    shuffle_write_mb: float


def _spark_stages(spark: SparkSession) -> list[dict[str, Any]]:
    url = spark.sparkContext.uiWebUrl
    if url is None:
        return []
    with urllib.request.urlopen(f"{url}/api/v1/applications/{spark.sparkContext.applicationId}/stages?status=complete") as reply:
        stages: list[dict[str, Any]] = orjson.loads(reply.read())
    return stages


def last_stage_id(spark: SparkSession) -> int:
    return max((s["stageId"] for s in _spark_stages(spark)), default=-1)


def stages_since(spark: SparkSession, stage_id: int) -> list[StageCost]:
    """The stages completed after ``stage_id`` (``last_stage_id`` before the work), in order."""

    def seconds(text: str) -> float:
        from datetime import datetime

        return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()

    out = []
    for s in sorted(_spark_stages(spark), key=lambda s: s["stageId"]):
        if s["stageId"] <= stage_id:
            continue
        out.append(
            StageCost(
                s["stageId"],
                s["name"].split(" at ")[0],
                s["numTasks"],
                seconds(s["completionTime"]) - seconds(s["submissionTime"]),
                s["executorRunTime"] / 1000,
                s["executorCpuTime"] / 1e9,
                s["jvmGcTime"] / 1000,
                s["executorDeserializeTime"] / 1000,
                s["inputBytes"] / 1e6,
                s["outputBytes"] / 1e6,
                s["shuffleReadBytes"] / 1e6,
                s["shuffleWriteBytes"] / 1e6,
            )
        )
    return out


def stage_table(stages: Sequence[StageCost]) -> str:
    return markdown_table(
        ["stage", "tasks", "wall s", "task run s", "task CPU s", "GC s", "deserialize s", "in MB", "out MB", "shuffle r/w MB"],
        [
            [
                f"{s.stage_id} {s.name}",
                s.tasks,
                f"{s.wall_seconds:.2f}",
                f"{s.run_seconds:.2f}",
                f"{s.cpu_seconds:.2f}",
                f"{s.gc_seconds:.2f}",
                f"{s.deserialize_seconds:.2f}",
                f"{s.input_mb:.1f}",
                f"{s.output_mb:.1f}",
                f"{s.shuffle_read_mb:.1f}/{s.shuffle_write_mb:.1f}",
            ]
            for s in stages
        ],
    )


def int_partitioned_table(name: str, topic: str) -> dict[str, Any]:
    """A table of tiny rows partitioned by an integer column ``p``: any number of partitions,
    with files as small as the bench wants."""
    return {
        "name": name,
        "topic": topic,
        "primary_key": ["id"],
        "partition_by": ["p"],
        "schema": {"id": "long", "p": "int", "v": "string"},
        "before_image": "full",
    }


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
        self._topics = [t.topic for t in config.tables]
        self._offset = 0

    def frame(self, pairs: Sequence[tuple[bytes | None, bytes | None]], topics: Sequence[str] | None = None) -> Any:
        """The next batch as the DataFrame a source hands ``foreachBatch`` (built outside any timer):
        the same records on every table's topic."""
        return self.frame_by_topic(dict.fromkeys(topics or self._topics, pairs))

    def frame_by_topic(self, pairs: Mapping[str, Sequence[tuple[bytes | None, bytes | None]]]) -> Any:
        """The next batch with each topic's own records, as a DataFrame with the known wrapper
        prefixes cut (what the writer makes of a polled batch it runs on Spark)."""
        return self.polled_by_topic(pairs).frame(self.writer.prefixes)

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
    """``icecdc compact`` in its own process, as deployed (a sidecar container): it shares the
    machine's cores with the writer but not its JVM or its interpreter."""

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

    def counts(self, table: str) -> CompactorCounts:
        metrics = self.metrics()

        def total(name: str, **labels: str) -> float:
            return sum(
                v
                for (n, ls), v in metrics.items()
                if n == name and dict(ls).get("table") == table and all(dict(ls).get(k) == x for k, x in labels.items())
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
