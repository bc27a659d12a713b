"""Reads against a compacted copy, for the benches that write a table while it is read: a full
count, an aggregation and point lookups on the table, over the same queries on a copy of its
current rows in one file per partition, read by the same session (docs/BENCHMARKS.md, rows
"Reads while writing" and "Reads beside other writers")."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

# The goal of docs/BENCHMARKS.md's read rows: every query within this of the compacted copy.
READ_RATIO_GOAL = 1.5
# Enough queries a probe that the writer's jobs on the same cores fall on the table and the copy alike.
LOOKUPS = 12  # point lookups a probe
REPEATS = 5  # counts and aggregations a probe
# The probe's Spark scheduler pool (the session in FAIR mode): the writer's jobs take the next free core.
PROBE_POOL = "read-probe"


@dataclass(frozen=True)
class ReadShape:
    """What the probes read of a table: its partition column, the aggregation ({t}: the table)
    and the key column the lookups pick rows by."""

    partition_by: str
    aggregation: str
    key: str


ORDERS_READS = ReadShape("region", "SELECT region, status, count(*), sum(amount) FROM {t} GROUP BY region, status", "id")


class Query(Enum):
    COUNT = "count"
    AGGREGATION = "aggregation"
    LOOKUP = "lookup"


@dataclass(frozen=True)
class ReadRatios:
    """The table's median latency over the compacted copy's, per query."""

    count: float
    aggregation: float
    lookup: float

    def of(self, query: Query) -> float:
        return float(getattr(self, query.value))


def _ms(query: str, spark: Any) -> float:
    started = time.perf_counter()
    spark.sql(query).collect()
    return (time.perf_counter() - started) * 1000


def query_latency(
    spark: Any, names: dict[str, str], keys: list[int], repeats: int, shape: ReadShape = ORDERS_READS
) -> dict[str, dict[str, float]]:
    """Median latency, per table, of a full count (deletes applied), an aggregation and point
    lookups; the tables take turns, so that the machine's other work falls on all of them alike."""
    queries: dict[str, list[str]] = {  # {t}: the table
        "count_ms": ["SELECT count(*) FROM {t}"] * repeats,
        "aggregate_ms": [shape.aggregation] * repeats,
        "lookup_ms": [f"SELECT * FROM {{t}} WHERE {shape.key} = {k}" for k in keys],
    }
    timings: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in names}
    for metric, runs in queries.items():
        for query in runs:
            for strategy, name in names.items():
                timings[strategy][metric].append(_ms(query.format(t=name), spark))
    return {s: {metric: statistics.median(values) for metric, values in t.items()} for s, t in timings.items()}


def copy_compacted(spark: Any, source: str, copy: str, partition_by: str, format_version: int) -> None:
    """``copy``: the rows ``source`` has at this moment, rewritten into one file per partition."""
    spark.sql(
        f"CREATE OR REPLACE TABLE {copy} USING iceberg PARTITIONED BY ({partition_by}) "
        f"TBLPROPERTIES ('format-version' = '{format_version}') AS SELECT * FROM {source}"
    )


def read_ratios(reader: Any, name: str, copy: str, keys: list[int], shape: ReadShape, format_version: int) -> ReadRatios:
    """The table against a copy of its rows at this moment, rewritten into one file per partition
    (rebuilt at every probe, so that both hold the same rows)."""
    reader.sql(f"REFRESH TABLE {name}")
    copy_compacted(reader, name, copy, shape.partition_by, format_version)
    latency = query_latency(reader, {"table": name, "copy": copy}, keys, REPEATS, shape)
    table, compacted = latency["table"], latency["copy"]
    return ReadRatios(
        table["count_ms"] / compacted["count_ms"],
        table["aggregate_ms"] / compacted["aggregate_ms"],
        table["lookup_ms"] / compacted["lookup_ms"],
    )


def reader_session(spark: Any) -> Any:
    """A session of its own, so that the writer keeps its catalog cache; every table counted by
    reading it, as a count with deletes applied must be."""
    reader = spark.newSession()
    reader.conf.set("spark.sql.iceberg.aggregate-push-down.enabled", "false")
    return reader


@dataclass(frozen=True)
class ReadSample:
    t: float  # seconds into the load at the probe's start
    writing: bool
    ratios: ReadRatios


class ReadProbes:
    """Probes a table against its compacted copy every ``every_seconds`` on a thread of its own
    while it is written (``start`` to ``stop``), and once more on demand (``after``). A failed
    probe fails the bench when the probes stop."""

    def __init__(
        self,
        spark: Any,
        name: str,
        copy: str,
        keys: Callable[[random.Random], list[int]],
        every_seconds: float,
        shape: ReadShape,
        format_version: int,
    ) -> None:
        self._reader, self._name, self._copy, self._keys = reader_session(spark), name, copy, keys
        self._every, self._shape, self._format_version = every_seconds, shape, format_version
        self._random = random.Random(0)
        self.samples: list[ReadSample] = []
        self._started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="read-probe", daemon=True)
        self._error: BaseException | None = None

    def _probe(self, writing: bool) -> None:
        context = self._reader.sparkContext
        context.setLocalProperty("spark.scheduler.pool", PROBE_POOL)
        try:
            began = time.monotonic() - self._started
            ratios = read_ratios(
                self._reader, self._name, self._copy, self._keys(self._random), self._shape, self._format_version
            )
            self.samples.append(ReadSample(round(began, 1), writing, ratios))
        finally:
            context.setLocalProperty("spark.scheduler.pool", None)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._every):
                self._probe(writing=True)
        except BaseException as exc:  # noqa: BLE001 - carried to the bench's thread, which raises it
            self._error = exc

    def start(self, started: float) -> None:
        """``started``: the load's start (monotonic seconds)."""
        self._started = started
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._error is not None:
            raise self._error

    def after(self) -> None:
        """One probe once the writes have stopped."""
        self._probe(writing=False)

    def drop_copy(self) -> None:
        self._reader.sql(f"DROP TABLE IF EXISTS {self._copy} PURGE")


def ratio_range(samples: list[ReadSample], query: Query, writing: bool) -> tuple[float, float, float] | None:
    """The median, lowest and highest ratio of one query over the probes while writing or after."""
    values = [s.ratios.of(query) for s in samples if s.writing is writing]
    return (statistics.median(values), min(values), max(values)) if values else None


def reads_said(samples: list[ReadSample], writing: bool) -> str:
    """Each query's median ratio (lowest-highest) over the probes while writing or after; "-" with none."""
    ranges = [(q, ratio_range(samples, q, writing)) for q in Query]
    said = [f"{q.value} {r[0]:.2f}x" + (f" ({r[1]:.2f}-{r[2]:.2f})" if r[1] != r[2] else "") for q, r in ranges if r]
    return ", ".join(said) if said else "-"


def reads_verdict(samples: list[ReadSample]) -> str:
    """Whether every query's median ratio while writing is within ``READ_RATIO_GOAL``, with the figures."""
    medians = {q: r[0] for q in Query if (r := ratio_range(samples, q, True)) is not None}
    if not medians:
        return "No read was probed while writing."
    figures = f"{reads_said(samples, True)}, median (lowest-highest) of {sum(s.writing for s in samples)} probes"
    over = [q.value for q, m in medians.items() if m > READ_RATIO_GOAL]
    if not over:
        return f"Reads while writing were within {READ_RATIO_GOAL:g}x of the compacted copy: {figures}."
    return f"Reads while writing were not within {READ_RATIO_GOAL:g}x of the compacted copy ({', '.join(over)} over): {figures}."


def plot_ratios(ax: Any, runs: dict[str, list[ReadSample]]) -> None:
    """Each query's ratio over the probes while writing, per run, against the goal."""
    for label, samples in runs.items():
        writing = [s for s in samples if s.writing]
        for query, marker in zip(Query, "o^s", strict=True):
            ax.plot(
                [s.t for s in writing],
                [s.ratios.of(query) for s in writing],
                marker=marker,
                ms=3,
                lw=1,
                label=f"{label} {query.value}",
            )
    ax.axhline(READ_RATIO_GOAL, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("latency over the compacted copy's")
    ax.set_title("reads while writing", fontsize=9)
