"""What only the investigations use: memory and CPU readings from /proc, Spark's stage costs,
a table of tiny integer-partitioned rows, and a line plot. The product never imports it."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from icecdc.bench.harness import BenchStack, clone
from icecdc.bench.report import markdown_table, pyplot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def settled_config(stack: BenchStack, prefix: str, tables: Sequence[dict[str, Any]], batch_records: int, **compactor: Any) -> Any:
    """The stack's config for ``tables``, with topics, state and consumer group named by ``prefix``,
    for a sidecar that compacts settled partitions: every partition settled at once, and no
    portability conversion going first (a feed's equality deletes are older than half the target
    by the time the sidecar starts)."""
    return clone(
        stack.config,
        tables=list(tables),
        commit_topic=f"{prefix}-commits-{stack.run_id}",
        compaction_topic=f"{prefix}-compactions-{stack.run_id}",
        state_dir=str(Path(stack.config.state_dir) / prefix),
        ingest={"max_batch_records": batch_records},
        compactor={
            "consumer_group": f"{prefix}-{stack.run_id}",
            "http": {"port": None},
            "settle": {"min_seconds": 0, "initial_seconds": 0, "max_seconds": 0.001},
            "portable_within_seconds": 1e6,
            **compactor,
        },
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


@contextlib.contextmanager
def column_figure(path: Path, ylabel: str, title: str, size: tuple[float, float] = (6, 4)) -> Iterator[Any]:
    """The axes of one figure of columns (one per setting or stage), saved to ``path`` when the block ends."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    yield ax
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def line_plot(
    path: Path, x: list[float], lines: dict[str, list[float]], xlabel: str, ylabel: str, size: tuple[float, float] = (6, 4)
) -> None:
    """One line per label over a shared x axis, y from 0."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    for label, ys in lines.items():
        ax.plot(x, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
