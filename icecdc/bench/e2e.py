"""``icecdc bench e2e``: what each maintenance strategy does to reads, to the bill and to the
writer, over one CDC run.

One event stream (an orders table: a hot current day that moves on, changes soon after a row is
placed, a share of late changes to any older day, bursty batch sizes) is written by the
ingester's micro-batch writer into one table per strategy at once
(``icecdc.bench.strategies``), every micro-batch one Spark job and one commit per table, as the
ingester does for several tables. The maintenance of each table runs beside it. Every probe
interval a probe, on a thread of its own while the writer keeps its schedule, measures, per table: file counts (data, small, live
equality- and position-delete files, bytes, manifests) and query latency (a full count with deletes
applied, an aggregation, point lookups by key; medians of repeats), and the same for a fully
compacted copy of the current data as the reference. After the last batch it keeps probing while
maintenance catches up (the drain: at least ``drain_seconds``, and until the sidecar has answered
every partition, at most ``drain_max_seconds``), then checks that every table holds exactly the
stream's final state and reads the rest from each table's snapshot log: bytes ingested, bytes
maintenance wrote, compaction commits, and for every partition left with equality deletes by its
last write, how long until a maintenance commit touched it.

Whether the sidecar's table is portable while it is written: every ``age_sample_seconds`` the age
of its oldest live equality delete (from its metadata), and at every probe a read of it by
readers that cannot apply equality deletes (pyiceberg's scan, DuckDB's iceberg extension,
``icecdc.bench.readers``), compared with Spark's read of the same snapshot. The ``large`` workload
has partitions of users' sizes (a wide text column most updates keep, 16 partitions all written
every batch), where a rewrite costs what the partition costs: its write amplification over the
writing phase is reported beside its read ratios.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyiceberg.manifest import ManifestContent

from icecdc.bench import out_argument, positive_numbers
from icecdc.bench.harness import BenchStack, FeedWriter, bench_stack, clone, progress
from icecdc.bench.portability import (
    AgeSummary,
    KeyDigest,
    ReadOutcome,
    digest_exactness,
    exact_share,
    oldest_equality_delete_age,
    summarise_ages,
    write_amplification,
)
from icecdc.bench.report import machine, markdown_table, percentile, publish, pyplot
from icecdc.bench.strategies import (
    ICECDC,
    THRESHOLD,
    CronRewrite,
    Sidecar,
    Strategy,
    StrategyCounts,
    ThresholdCompaction,
    cron_period,
    strategy_names,
)
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.domain.errors import UserError
from icecdc.domain.files import DataFileContent
from icecdc.domain.summary import COMPACTOR
from icecdc.options import embedded_stack_arguments
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import CompactorConfig, Config
from icecdc.workload import ORDERS_PARTITIONING, OrdersWorkload, orders_table

COLUMNS = ("id", "region", "status", "amount", "updated_at")
METRICS = (
    "count_ms",
    "aggregate_ms",
    "lookup_ms",
    "data_files",
    "small_files",
    "equality_delete_files",
    "position_delete_files",
    "bytes",
    "manifests",
)
TITLES = {
    "count_ms": "full count, deletes applied (ms, median)",
    "aggregate_ms": "aggregation (ms, median)",
    "lookup_ms": "point lookup by key (ms, median)",
    "data_files": "live data files",
    "small_files": "small data files",
    "equality_delete_files": "live equality-delete files",
    "position_delete_files": "live position-delete files",
    "bytes": "live bytes",
    "manifests": "manifests in the current snapshot",
}
REFERENCE = "compacted"
say = progress("e2e")


@dataclass(frozen=True)
class Workload:
    """The stream's shape; the batches are a pure function of it."""

    keys: int = 20_000
    changes: int = 1_500  # per micro-batch outside bursts
    updates: float = 0.7
    inserts: float = 0.2  # deletes: the rest
    late_share: float = 0.002  # a few late changes a batch: each old day reopens now and then
    batches_per_day: int = 6
    burst_share: float = 0.25
    burst_factor: float = 4.0
    seed: int = 17
    # ``days``: region and day, so yesterday's partitions settle as the day moves on; ``region``:
    # four partitions the writer writes every batch, which never settle while it runs;
    # ``buckets``: 16 partitions by key, all written every batch (the large workload's).
    partitioning: str = "days"
    # The large workload's wide text column: characters per row (0: none) and the share of
    # updates that keep it.
    note_chars: int = 0
    note_keep: float = 0.9

    @property
    def partition_by(self) -> list[str]:
        return PARTITIONINGS[self.partitioning]


PARTITIONINGS = {"days": ORDERS_PARTITIONING, "region": ["region"], "buckets": ["bucket(16, id)"]}
# The initial load is written in commits of at most this many rows (one Spark job each).
LOAD_CHUNK_ROWS = 200_000


def large_workload(rows: int, changes: int = 1_500) -> Workload:
    """Users' partition sizes: ``rows`` (20M: about 230 MB a partition, 190 bytes a row as written) over 16 partitions written
    every batch, a 400-character text column nine updates in ten keep, the small workloads'
    change rate; no late changes (every partition is hot anyway)."""
    return Workload(keys=rows, changes=changes, late_share=0.0, partitioning="buckets", note_chars=400, note_keep=0.9)


@dataclass(frozen=True)
class ProbePoint:
    """One table measured by one probe: when (seconds into the run), its files, its latencies."""

    t: float
    t_end: float
    count_ms: float
    aggregate_ms: float
    lookup_ms: float
    data_files: int
    small_files: int
    equality_delete_files: int
    position_delete_files: int
    bytes: int
    manifests: int


@dataclass(frozen=True)
class ReaderProbe:
    """The sidecar's table read by each reader that cannot apply equality deletes, one snapshot."""

    t: float
    snapshot_id: int | None
    outcomes: dict[str, ReadOutcome]  # reader -> exact / wrong / refused, against Spark's read
    read_ms: dict[str, float]


@dataclass(frozen=True)
class Portability:
    """How portable the sidecar's table was, while writing and after."""

    oldest_equality_delete_writing: AgeSummary
    oldest_equality_delete_after: AgeSummary
    exact_writing: dict[str, float | None]  # reader -> share of probes read exactly
    exact_after: dict[str, float | None]


@dataclass(frozen=True)
class SettleToCompacted:
    settled_partitions: int
    compacted: int
    median_seconds: float | None
    seconds: list[float]


@dataclass(frozen=True)
class StrategyResult:
    series: list[ProbePoint]
    commit_seconds: list[tuple[float, float]]  # (seconds into the run, the writer's commit latency)
    writer_failures: list[str]
    rows_match: bool
    ingested_bytes: int
    rewritten_bytes: int
    write_amplification: float
    # (maintenance + writer bytes) / writer bytes, over the commits between the first change
    # batch and the last: what the sidecar costs beside the writer
    writing_amplification: float | None
    compaction_commits: int
    maintenance: StrategyCounts
    writer_commit_p50: float
    writer_commit_p99: float
    writer_commit_max: float
    settle_to_compacted: SettleToCompacted
    settled_partitions_with_equality_deletes: int


@dataclass
class E2EResults:
    machine: str
    minutes: float
    batches: int
    batch_seconds: float
    probe_seconds: float
    cron_seconds: list[float]
    drain_seconds: float
    drain_max_seconds: float
    lookups: int
    repeats: int
    workload: Workload
    format_version: int = 2
    hot_read_budget: float | None = None
    strategies: dict[str, StrategyResult] = field(default_factory=dict)
    reference: list[ProbePoint] = field(default_factory=list)  # the compacted copy, probe by probe
    writes_ended_t: float = 0.0
    drained_seconds: float = 0.0  # how long the drain lasted
    load_compacted_seconds: float | None = None  # how long the sidecar took to compact a load of many commits
    workload_name: str = "small"
    age_sample_seconds: float = 2.0
    # (seconds into the run, age of the sidecar table's oldest live equality delete or None)
    equality_delete_ages: list[tuple[float, float | None]] = field(default_factory=list)
    readers: list[ReaderProbe] = field(default_factory=list)
    portability: Portability | None = None


def batch_sizes(batches: int, workload: Workload) -> list[int]:
    """Changes per micro-batch: ``burst_factor`` times the base in a ``burst_share`` of them."""
    draw = random.Random(workload.seed)
    return [
        round(workload.changes * (workload.burst_factor if draw.random() < workload.burst_share else 1)) for _ in range(batches)
    ]


def new_orders(workload: Workload) -> OrdersWorkload:
    """The model of the stream's rows, before its initial load."""
    return OrdersWorkload(
        seed=workload.seed,
        today=0,
        recent_keys=workload.changes * 2,
        late_share=workload.late_share,
        note_chars=workload.note_chars,
        note_keep=workload.note_keep,
    )


def load_chunks(orders: OrdersWorkload, rows: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """The initial load, made as it is written, ``LOAD_CHUNK_ROWS`` records at a time: at users'
    partition sizes its records do not fit in memory at once."""
    for start in range(0, rows, LOAD_CHUNK_ROWS):
        yield [c.record for c in orders.load(min(LOAD_CHUNK_ROWS, rows - start))]


def change_batches(orders: OrdersWorkload, batches: int, workload: Workload) -> list[list[tuple[bytes, bytes]]]:
    """``batches`` micro-batches of changes after the initial load; ``orders`` then holds the
    state they leave."""
    out = []
    for number, size in enumerate(batch_sizes(batches, workload), 1):
        orders.today = number // workload.batches_per_day
        out.append([c.record for c in orders.changes(size, workload.updates, workload.inserts)])
    return out


def generate(batches: int, workload: Workload) -> tuple[list[list[tuple[bytes, bytes]]], OrdersWorkload]:
    """The initial load and ``batches`` micro-batches of changes, all in memory, and the state
    they leave (the run itself makes the load as it writes it)."""
    orders = new_orders(workload)
    load = [record for chunk in load_chunks(orders, workload.keys) for record in chunk]
    return [load, *change_batches(orders, batches, workload)], orders


def settle_settings(batch_seconds: float) -> dict[str, float]:
    """Settle windows scaled to the benchmark's clock: a partition written every batch is hot,
    one left alone for a few batches has settled (15-60 s for the default 10 s batches)."""
    return {
        "cadence_multiple": 3,
        "min_seconds": 1.5 * batch_seconds,
        "initial_seconds": 3 * batch_seconds,
        "max_seconds": 6 * batch_seconds,
    }


def _config(base: Config, run_id: int, strategies: Sequence[str], run: RunSettings) -> Config:
    slugs = [s.replace("-", "_") for s in strategies]
    tables = [
        {
            **orders_table(f"bench.e2e_{s}_{run_id}", f"e2e-{s}-{run_id}", note=run.workload.note_chars > 0),
            "partition_by": run.workload.partition_by,
            "format_version": run.format_version,
        }
        for s in slugs
    ]
    return clone(
        base,
        tables=tables,
        commit_topic=f"e2e-commits-{run_id}",
        compaction_topic=f"e2e-compactions-{run_id}",
        maintenance_topic=f"e2e-maintenance-{run_id}",
        compactor={
            "consumer_group": f"e2e-{run_id}",
            "http": {"port": None},
            "reconcile_seconds": 10,
            "settle": settle_settings(run.batch_seconds),
            **({"hot_read_budget": run.hot_read_budget} if run.hot_read_budget is not None else {}),
        },
        coordinator={"lease_topic": f"e2e-leases-{run_id}"},
    )


# ---- measuring a table --------------------------------------------------------------------------


def file_counts(table: Any, settings: CompactorConfig) -> dict[str, int]:
    """Live files of a pyiceberg table and the manifests listing them (every query that cannot
    prune a manifest by partition opens it), from its metadata."""
    counts = dict.fromkeys(
        ("data_files", "small_files", "equality_delete_files", "position_delete_files", "bytes", "manifests"), 0
    )
    current = table.current_snapshot()
    if current is None:
        return counts
    counts["manifests"] = len(current.manifests(table.io))
    for row in table.inspect.files().select(["content", "file_size_in_bytes"]).to_pylist():
        size = row["file_size_in_bytes"]
        counts["bytes"] += size
        content = DataFileContent(row["content"])
        if content is DataFileContent.DATA:
            counts["data_files"] += 1
            counts["small_files"] += size_class(size, settings) is SizeClass.SMALL
        elif content is DataFileContent.EQUALITY_DELETES:
            counts["equality_delete_files"] += 1
        else:
            counts["position_delete_files"] += 1
    return counts


def _ms(query: str, spark: Any) -> float:
    started = time.perf_counter()
    spark.sql(query).collect()
    return (time.perf_counter() - started) * 1000


def query_latency(spark: Any, names: dict[str, str], keys: list[int], repeats: int) -> dict[str, dict[str, float]]:
    """Median latency, per table, of a full count (deletes applied), an aggregation and point
    lookups. The tables take turns, query by query and key by key, so that what else the machine
    is doing meanwhile (the writer, the strategies' own rewrites) falls on all of them alike."""
    queries: dict[str, list[str]] = {  # {t}: the table
        "count_ms": ["SELECT count(*) FROM {t}"] * repeats,
        "aggregate_ms": ["SELECT region, status, count(*), sum(amount) FROM {t} GROUP BY region, status"] * repeats,
        "lookup_ms": [f"SELECT * FROM {{t}} WHERE id = {k}" for k in keys],
    }
    timings: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in names}
    for metric, runs in queries.items():
        for query in runs:
            for strategy, name in names.items():
                timings[strategy][metric].append(_ms(query.format(t=name), spark))
    return {s: {metric: statistics.median(values) for metric, values in t.items()} for s, t in timings.items()}


class Probe:
    """Measures every strategy's table and a compacted copy of the current data."""

    def __init__(
        self,
        spark: Any,
        config: Config,
        names: dict[str, str],
        orders: OrdersWorkload,
        lookups: int,
        repeats: int,
        run_id: int,
        started: float,
        partition_by: Sequence[str],
    ) -> None:
        self._spark = spark
        self._started = started
        self._catalog = pyiceberg_catalog(config)
        self._lookups = lookups
        self._orders = orders
        self._repeats = repeats
        self._settings = config.compactor
        self._partitioning = ", ".join(partition_by)
        self.reference = f"{config.catalog.name}.bench.e2e_{REFERENCE}_{run_id}"
        self._names = {**names, REFERENCE: self.reference}
        self.series: dict[str, list[ProbePoint]] = {s: [] for s in self._names}
        self.readers: list[ReaderProbe] = []
        self._duckdb: Any = None  # opened on the first probe, used by one thread at a time
        # Iceberg answers count(*) from file metadata when no delete applies: off, so that every
        # table is counted by reading it, as a count with deletes must be.
        spark.conf.set("spark.sql.iceberg.aggregate-push-down.enabled", "false")

    def __call__(self) -> None:
        began = time.monotonic() - self._started
        # Keys of the stream's final state: mid-run some do not exist yet, which costs a lookup
        # all the same.
        keys = self._orders.sample_keys(random.Random(len(self.series[REFERENCE])), self._lookups)
        # Copied from the sidecar's table at this moment: the same rows, each partition in one file.
        self._spark.sql(
            f"CREATE OR REPLACE TABLE {self.reference} USING iceberg PARTITIONED BY ({self._partitioning}) "
            f"TBLPROPERTIES ('format-version' = '2') AS SELECT * FROM {self._names[ICECDC]}"
        )
        files = {}
        for strategy, name in self._names.items():
            self._spark.sql(f"REFRESH TABLE {name}")
            files[strategy] = file_counts(self._catalog.load_table(name.split(".", 1)[1]), self._settings)
        latency = query_latency(self._spark, self._names, keys, self._repeats)
        self.readers.append(self._read_portably())
        ended = time.monotonic() - self._started
        for strategy in self._names:
            counts, took = files[strategy], latency[strategy]
            self.series[strategy].append(
                ProbePoint(
                    t=round(began, 1),
                    t_end=round(ended, 1),
                    count_ms=took["count_ms"],
                    aggregate_ms=took["aggregate_ms"],
                    lookup_ms=took["lookup_ms"],
                    data_files=counts["data_files"],
                    small_files=counts["small_files"],
                    equality_delete_files=counts["equality_delete_files"],
                    position_delete_files=counts["position_delete_files"],
                    bytes=counts["bytes"],
                    manifests=counts["manifests"],
                )
            )
        line = ", ".join(
            f"{s} {p[-1].count_ms:.0f}/{p[-1].lookup_ms:.0f} ms {p[-1].equality_delete_files} eq-del"
            for s, p in self.series.items()
        )
        readers = ", ".join(f"{r} {o.value}" for r, o in self.readers[-1].outcomes.items())
        say(f"t={began:.0f}-{ended:.0f}s count/lookup: {line}; the sidecar's table read by {readers}")

    def _read_portably(self) -> ReaderProbe:
        """The sidecar's table read by pyiceberg and DuckDB (its keys), against Spark's read of the
        same snapshot (Spark applies equality deletes; the final check holds it to the stream)."""
        from icecdc.bench.readers import duckdb_connection, key_digest, read_duckdb, read_pyiceberg

        name = self._names[ICECDC]
        began = round(time.monotonic() - self._started, 1)
        table = self._catalog.load_table(name.split(".", 1)[1])
        snapshot = table.current_snapshot()
        if snapshot is None:
            return ReaderProbe(began, None, {}, {})
        self._spark.sql(f"REFRESH TABLE {name}")  # Spark's cached table may not know the snapshot yet
        spark_read = self._spark.sql(
            f"SELECT count(*), count(DISTINCT id), coalesce(sum(id), 0) FROM {name} VERSION AS OF {snapshot.snapshot_id}"
        ).first()
        expected = KeyDigest(int(spark_read[0]), int(spark_read[1]), int(spark_read[2]))
        if self._duckdb is None:
            self._duckdb = duckdb_connection()
        outcomes, took = {}, {}
        for read in (lambda: read_pyiceberg(table, ("id",)), lambda: read_duckdb(table, ("id",), self._duckdb)):
            started = time.perf_counter()
            result = read()
            took[result.reader.value] = (time.perf_counter() - started) * 1000
            outcomes[result.reader.value] = digest_exactness(expected, key_digest(result))
        return ReaderProbe(began, snapshot.snapshot_id, outcomes, took)


def equality_delete_age(table: Any, now_ms: int) -> float | None:
    """``portability.oldest_equality_delete_age`` of a pyiceberg table: the snapshot that added
    each live equality-delete file, from the current snapshot's delete manifests (data manifests
    are not opened), and the commit times of the snapshots still listed."""
    current = table.current_snapshot()
    if current is None:
        return None
    added_by = [
        entry.snapshot_id
        for manifest in current.manifests(table.io)
        if manifest.content is ManifestContent.DELETES
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.data_file.content is DataFileContent.EQUALITY_DELETES
    ]
    return oldest_equality_delete_age(added_by, {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}, now_ms)


class AgeSampler:
    """Samples the age of a table's oldest live equality delete every ``every_seconds``, on a
    thread of its own, from ``start`` to ``stop``."""

    def __init__(self, config: Config, name: str, every_seconds: float, started: float) -> None:
        self._catalog = pyiceberg_catalog(config)
        self._identifier = name.split(".", 1)[1]
        self._every, self._started = every_seconds, started
        self.samples: list[tuple[float, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="age-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                table = self._catalog.load_table(self._identifier)
                age = equality_delete_age(table, int(time.time() * 1000))
            except Exception as exc:  # noqa: BLE001 - a lost sample is said, the run goes on
                say(f"age sample failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            self.samples.append((round(time.monotonic() - self._started, 1), age))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# ---- the snapshot log ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotLog:
    ingested_bytes: int  # every writer commit's added files
    rewritten_bytes: int  # every maintenance (replace) commit's added files
    compaction_commits: int
    # partition -> (commit time, whether it left an equality delete), per writer commit
    writes: dict[tuple[Any, ...], list[tuple[float, bool]]]
    maintained: dict[tuple[Any, ...], list[float]]  # partition -> maintenance commit times
    live_equality_deletes: set[tuple[Any, ...]]  # partitions with live equality deletes now
    # (commit time, bytes added, whether by maintenance), per snapshot
    added: list[tuple[float, int, bool]] = field(default_factory=list)


def snapshot_log(table: Any) -> SnapshotLog:
    """When each partition was last written and when maintenance touched it, and the bytes each
    side added, read from the manifests each snapshot added."""
    io = table.io
    ingested = rewritten = commits = 0
    writes: dict[tuple[Any, ...], list[tuple[float, bool]]] = defaultdict(list)
    maintained: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    added_bytes: list[tuple[float, int, bool]] = []
    for snapshot in table.snapshots():
        summary = snapshot.summary
        added = int(summary.get("added-files-size", 0) or 0)
        # Rewrites replace; icecdc's conversions are row deltas that it tags.
        maintenance = summary.operation.value == "replace" or summary.get(COMPACTOR) is not None
        if maintenance:
            rewritten += added
            commits += bool(added or int(summary.get("removed-files-size", 0) or 0))
        else:
            ingested += added
        when = snapshot.timestamp_ms / 1000
        added_bytes.append((when, added, maintenance))
        touched: dict[tuple[Any, ...], bool] = {}
        for manifest in snapshot.manifests(io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                if entry.snapshot_id != snapshot.snapshot_id or entry.status.value == 0:  # EXISTING
                    continue
                key = _partition_key(entry)
                equality = entry.data_file.content is DataFileContent.EQUALITY_DELETES and entry.status.value == 1
                touched[key] = touched.get(key, False) or equality
        for key, equality in touched.items():
            if maintenance:
                maintained[key].append(when)
            else:
                writes[key].append((when, equality))
    current = table.current_snapshot()
    live_equality = {
        _partition_key(entry)
        for manifest in (current.manifests(io) if current is not None else [])
        for entry in manifest.fetch_manifest_entry(io)
        if entry.data_file.content is DataFileContent.EQUALITY_DELETES
    }
    return SnapshotLog(ingested, rewritten, commits, writes, maintained, live_equality, added_bytes)


def amplification_between(log: SnapshotLog, start: float, end: float) -> float | None:
    """``portability.write_amplification`` of the commits from ``start`` to ``end`` (epoch seconds)."""
    window = [(size, maintenance) for when, size, maintenance in log.added if start <= when <= end]
    return write_amplification(sum(b for b, m in window if not m), sum(b for b, m in window if m))


def _partition_key(entry: Any) -> tuple[Any, ...]:
    return tuple(entry.data_file.partition)


def settle_to_compacted(log: SnapshotLog, writes_ended: float, settle_seconds: float) -> SettleToCompacted:
    """For every partition whose last write left equality deletes and came ``settle_seconds``
    before the writes ended (it settled during the run): seconds from that write to the first
    maintenance commit that touched it, or None if none did."""
    delays: list[float | None] = []
    for key, history in log.writes.items():
        last, equality = max(history)
        if not equality or last > writes_ended - settle_seconds:
            continue
        after = [t for t in log.maintained.get(key, []) if t >= last]
        delays.append(min(after) - last if after else None)
    done = [d for d in delays if d is not None]
    return SettleToCompacted(len(delays), len(done), statistics.median(done) if done else None, done)


# ---- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    batches: int
    workload: Workload
    batch_seconds: float
    probe_seconds: float
    cron_seconds: Sequence[float]
    drain_seconds: float
    drain_max_seconds: float
    lookups: int
    repeats: int
    strategies: Sequence[str] | None = None  # None: every one
    format_version: int = 2
    hot_read_budget: float | None = None  # None: the compactor's default
    age_sample_seconds: float = 2.0


def _start(spark: Any, config: Config, strategies: Sequence[str], strategy: str, out: Path) -> Strategy:
    table = config.tables[strategies.index(strategy)].name
    if (period := cron_period(strategy)) is not None:
        return CronRewrite(spark, config, table, period)
    if strategy == THRESHOLD:
        return ThresholdCompaction(spark, config, table, config.compactor)
    if strategy == ICECDC:
        return Sidecar(clone(config, tables=[config.tables[strategies.index(ICECDC)].model_dump(by_alias=True)]), out)
    return Strategy()


def differing_rows(table: Any, expected: Any) -> int:
    """Rows in which a table and the stream's final state differ, counted both ways (a multiset
    difference: a key twice is a delete not applied), by Spark, since at users' partition sizes
    the rows do not fit in Python's memory."""
    return int(table.exceptAll(expected).count() + expected.exceptAll(table).count())


def _drain(strategies: dict[str, Strategy], minimum: float, maximum: float) -> float:
    """Let maintenance run on: at least ``minimum`` seconds, and until the sidecar has answered
    every partition (so that the final probe measures its steady state, not how far a loaded
    machine let it get), at most ``maximum``. Returns how long it lasted."""
    started = time.monotonic()
    sidecar = strategies.get(ICECDC)
    while (elapsed := time.monotonic() - started) < maximum:
        if elapsed >= minimum and (not isinstance(sidecar, Sidecar) or sidecar.converged()):
            break
        time.sleep(2)
    return time.monotonic() - started


def _run_strategies(stack: BenchStack, out: Path, run: RunSettings, results: E2EResults) -> None:
    spark = stack.spark
    orders = new_orders(run.workload)
    all_strategies = tuple(s for s in strategy_names(run.cron_seconds) if run.strategies is None or s in run.strategies)
    config = _config(stack.config, stack.run_id, all_strategies, run)
    feed = FeedWriter(spark, config, "bench-e2e")
    names = {s: config.table_ref(t).qualified for s, t in zip(all_strategies, config.tables, strict=True)}
    by_table = {t.name: s for s, t in zip(all_strategies, config.tables, strict=True)}

    load_commits = max(1, -(-run.workload.keys // LOAD_CHUNK_ROWS))

    def write(number: int) -> dict[str, float]:
        # Every table reads the same records from its own topic: one Spark job, one commit each.
        # Batch ids go on from the initial load's commits.
        result = feed.write(stream[number], number + load_commits - 1)
        return {by_table[t]: s for t, s in result.commit_seconds.items()}

    # The sidecar is deployed beside the ingester and is up before it writes: it starts (and is
    # ready) before the initial load, whose equality deletes are then its first work. Started
    # after the load, its 25 s of start-up on a busy machine held the load's equality deletes and
    # made most of the portability p95 of the first run (docs/BENCHMARKS.md). The other
    # strategies are triggers on the writer's schedule and start with the measured writes.
    strategies = {s: _start(spark, config, all_strategies, s, out) for s in all_strategies}
    if ICECDC in strategies:
        strategies[ICECDC].start()
    say(f"initial load: {run.workload.keys:,} rows into {len(all_strategies)} tables, in {load_commits} commits")
    for number, chunk in enumerate(load_chunks(orders, run.workload.keys)):
        feed.write(chunk, number)
        if load_commits > 1:
            say(f"initial load: commit {number + 1}/{load_commits}")
    if load_commits > 1 and ICECDC in strategies:
        # A load in many commits leaves many files per partition, which the sidecar compacts once
        # they settle. Users' partitions of GBs were compacted long before a stream's steady state,
        # so the stream starts once the sidecar has done that (at most as long as the drain):
        # counted in the writing phase, the load's compaction made most of the write amplification
        # of the first runs at users' sizes (docs/BENCHMARKS.md, "Users' partition sizes").
        say(f"initial load written; the sidecar compacts it (at most {run.drain_max_seconds:.0f}s)")
        results.load_compacted_seconds = _drain(strategies, 0, run.drain_max_seconds)
        say(f"initial load compacted in {results.load_compacted_seconds:.0f}s")
    # Made after the load, from the state it left (the model's random draws go on from there).
    stream = [[], *change_batches(orders, run.batches, run.workload)]
    for strategy, maintenance in strategies.items():
        if strategy != ICECDC:
            maintenance.start()
    started = time.monotonic()
    probe = Probe(
        spark,
        config,
        names,
        orders,
        min(run.lookups, run.workload.keys),
        run.repeats,
        stack.run_id,
        started,
        run.workload.partition_by,
    )
    commit_seconds: dict[str, list[tuple[float, float]]] = {s: [] for s in all_strategies}
    writer_failures: list[str] = []
    # The probe runs on its own thread while the writer keeps its schedule: pausing the writer
    # for a probe would give every partition a quiet gap that a real stream does not have.
    probing = threading.Event()

    def probe_loop() -> None:
        while not probing.wait(run.probe_seconds):
            probe()

    prober = threading.Thread(target=probe_loop, name="probe", daemon=True)
    prober.start()
    sampler = AgeSampler(config, names[ICECDC], run.age_sample_seconds, started)
    sampler.start()
    writes_started = time.time()
    for number in range(1, run.batches + 1):
        time.sleep(max(0.0, started + (number - 1) * run.batch_seconds - time.monotonic()))
        try:
            for strategy, seconds in write(number).items():
                commit_seconds[strategy].append((round(time.monotonic() - started, 1), seconds))
        except Exception as exc:  # noqa: BLE001 - a writer failure is what this counts
            writer_failures.append(f"batch {number}: {type(exc).__name__}: {str(exc)[:300]}")
        if number % 6 == 0 or number == run.batches:
            say(f"batch {number}/{run.batches} ({len(stream[number]):,} changes), writer failures {len(writer_failures)}")
    writes_ended = time.time()
    results.writes_ended_t = time.monotonic() - started
    say(
        f"all {run.batches} batches written; maintenance drains for at least {run.drain_seconds:.0f}s, until the sidecar "
        f"has answered every partition (at most {run.drain_max_seconds:.0f}s)"
    )
    results.drained_seconds = _drain(strategies, run.drain_seconds, run.drain_max_seconds)
    probing.set()
    prober.join()
    sampler.stop()
    results.equality_delete_ages = sampler.samples
    counts = {s: maintenance.stop() for s, maintenance in strategies.items()}
    probe()  # the final state, maintenance stopped
    feed.close()

    schema = spark.table(next(iter(names.values()))).select(*COLUMNS).schema
    expected = spark.createDataFrame(orders.expected_frame(), schema=schema).cache()
    catalog = pyiceberg_catalog(config)
    settle_seconds = config.compactor.settle.max_seconds
    for strategy, name in names.items():
        if (differing := differing_rows(spark.table(name).select(*COLUMNS), expected)) > 0:
            raise RuntimeError(f"{strategy}: the table does not hold the stream's final state ({differing} rows differ)")
        log = snapshot_log(catalog.load_table(name.split(".", 1)[1]))
        settled_keys = {k for k, h in log.writes.items() if max(h)[0] <= writes_ended - settle_seconds}
        latencies = [s for _, s in commit_seconds[strategy]]
        results.strategies[strategy] = StrategyResult(
            series=probe.series[strategy],
            commit_seconds=commit_seconds[strategy],
            writer_failures=writer_failures,
            rows_match=True,
            ingested_bytes=log.ingested_bytes,
            rewritten_bytes=log.rewritten_bytes,
            write_amplification=log.rewritten_bytes / log.ingested_bytes,
            writing_amplification=amplification_between(log, writes_started, writes_ended),
            compaction_commits=log.compaction_commits,
            maintenance=counts[strategy],
            writer_commit_p50=statistics.median(latencies),
            writer_commit_p99=percentile(latencies, 0.99),
            writer_commit_max=max(latencies),
            settle_to_compacted=settle_to_compacted(log, writes_ended, settle_seconds),
            settled_partitions_with_equality_deletes=len(log.live_equality_deletes & settled_keys),
        )
    results.reference = probe.series[REFERENCE]
    results.readers = probe.readers
    results.portability = portability(results)
    expected.unpersist()
    say(f"every table holds the stream's final state ({len(orders.rows):,} rows)")
    for name in (*names.values(), probe.reference):
        spark.sql(f"DROP TABLE IF EXISTS {name} PURGE")


def run(
    minutes: float,
    out: Path,
    state_dir: Path,
    *,
    workload: Workload = Workload(),
    batch_seconds: float = 10.0,
    probe_seconds: float = 60.0,
    cron_seconds: Sequence[float] = (30.0, 120.0),
    drain_seconds: float = 90.0,
    drain_max_seconds: float | None = None,
    lookups: int = 100,
    repeats: int = 3,
    strategies: Sequence[str] | None = None,
    format_version: int = 2,
    hot_read_budget: float | None = None,
    age_sample_seconds: float = 2.0,
    workload_name: str = "small",
) -> E2EResults:
    batches = max(2, round(minutes * 60 / batch_seconds))
    drain_max = drain_max_seconds if drain_max_seconds is not None else drain_seconds + 300.0
    unknown = sorted(set(strategies or ()) - set(strategy_names(cron_seconds)))
    if unknown or (strategies is not None and ICECDC not in strategies):
        # The compacted reference is copied from the sidecar's table, so it always runs.
        raise UserError(
            f"--strategies: {', '.join(unknown) or 'icecdc is missing'}; choose among {', '.join(strategy_names(cron_seconds))}"
            " (icecdc always)"
        )
    settings = RunSettings(
        batches,
        workload,
        batch_seconds,
        probe_seconds,
        cron_seconds,
        drain_seconds,
        drain_max,
        lookups,
        repeats,
        strategies,
        format_version,
        hot_read_budget,
        age_sample_seconds,
    )
    results = E2EResults(
        machine(),
        minutes,
        batches,
        batch_seconds,
        probe_seconds,
        list(cron_seconds),
        drain_seconds,
        drain_max,
        lookups,
        repeats,
        workload,
        format_version,
        hot_read_budget,
        workload_name=workload_name,
        age_sample_seconds=age_sample_seconds,
    )
    # Users' partition sizes: the initial load's commits, the compacted copy and the final
    # comparison hold hundreds of MB in the driver at once (Spark's default is 1 GB).
    overrides: dict[str, Any] = {"spark": {"conf": {"spark.driver.memory": "6g"}}} if workload_name == "large" else {}
    with bench_stack("e2e", state_dir, **overrides) as stack:
        _run_strategies(stack, out, settings, results)
    publish(out, "e2e", results, plot, summary)
    return results


# ---- reporting ----------------------------------------------------------------------------------


WRITING, FINAL = "writing", "final"


def in_phase(point: ProbePoint, writes_ended_t: float, phase: str, final_t: float) -> bool:
    """``writing``: probes wholly in the second half of the writes (the first half is the tables
    filling up); ``final``: the last probe, after the drain, with maintenance stopped."""
    if phase == FINAL:
        return point.t >= final_t
    return point.t >= writes_ended_t / 2 and point.t_end <= writes_ended_t


def latency_ratio(results: E2EResults, strategy: str, metric: str, phase: str) -> float | None:
    """Median, over the probes of a phase, of a strategy's latency over the compacted copy's in
    the same probe; None when no probe fell in the phase."""
    series = results.strategies[strategy].series
    pairs = zip(series, results.reference, strict=True)
    ratios = [
        getattr(m, metric) / getattr(r, metric) for m, r in pairs if in_phase(m, results.writes_ended_t, phase, series[-1].t)
    ]
    return statistics.median(ratios) if ratios else None


def portability(results: E2EResults) -> Portability:
    """The sidecar table's age samples and reader probes, while writing (up to the last batch)
    and after it (the drain and the final probe)."""
    ended, probes = results.writes_ended_t, results.readers
    readers = sorted({r for p in probes for r in p.outcomes})

    def shares(phase: list[ReaderProbe]) -> dict[str, float | None]:
        return {r: exact_share([p.outcomes[r] for p in phase if r in p.outcomes]) for r in readers}

    return Portability(
        oldest_equality_delete_writing=summarise_ages([a for t, a in results.equality_delete_ages if t <= ended]),
        oldest_equality_delete_after=summarise_ages([a for t, a in results.equality_delete_ages if t > ended]),
        exact_writing=shares([p for p in probes if p.t <= ended]),
        exact_after=shares([p for p in probes if p.t > ended]),
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def portability_summary(results: E2EResults) -> str:
    """The sidecar table's portability: its oldest live equality delete and the readers' probes."""
    p = results.portability
    if p is None:
        return ""
    rows = [
        [
            phase,
            f"{_seconds(ages.p50_seconds)} / {_seconds(ages.p95_seconds)} / {_seconds(ages.max_seconds)}",
            _share(ages.none_share),
            ages.samples,
            *(_share(exact.get(r)) for r in ("pyiceberg", "duckdb")),
            sum(1 for probe in results.readers if (probe.t <= results.writes_ended_t) == (phase == "writing")),
        ]
        for phase, ages, exact in (
            ("writing", p.oldest_equality_delete_writing, p.exact_writing),
            ("after", p.oldest_equality_delete_after, p.exact_after),
        )
    ]
    sidecar = results.strategies.get(ICECDC)
    amplification = sidecar.writing_amplification if sidecar is not None else None
    return (
        f"\nThe sidecar's table, portable? The age of its oldest live equality delete, sampled every "
        f"{results.age_sample_seconds:g}s (a sample with none counts as 0 s), and reads by readers that cannot apply "
        f"equality deletes, each compared with Spark's read of the same snapshot. Write amplification while writing "
        f"((sidecar + writer bytes) / writer bytes, between the first and the last batch): "
        f"{'-' if amplification is None else f'{amplification:.2f}'}.\n\n"
        + markdown_table(
            [
                "phase",
                "oldest eq delete p50 / p95 / max s",
                "samples with none live",
                "samples",
                "pyiceberg exact",
                "DuckDB exact",
                "reader probes",
            ],
            rows,
        )
        + "\n"
    )


def _ratios(results: E2EResults, strategy: str, metric: str) -> str:
    return " / ".join(
        "-" if (r := latency_ratio(results, strategy, metric, phase)) is None else f"{r:.2f}x" for phase in (WRITING, FINAL)
    )


def summary(results: E2EResults) -> str:
    rows = []
    for strategy, m in results.strategies.items():
        settled = m.settle_to_compacted
        last = m.series[-1]
        rows.append(
            [
                strategy,
                *(_ratios(results, strategy, k) for k in ("count_ms", "aggregate_ms", "lookup_ms")),
                last.data_files,
                last.equality_delete_files,
                last.position_delete_files,
                last.manifests,
                f"{m.rewritten_bytes / 1e6:.1f}",
                f"{m.write_amplification:.2f}",
                "-" if m.writing_amplification is None else f"{m.writing_amplification:.2f}",
                m.compaction_commits,
                f"{m.maintenance.conflicts}/{m.maintenance.runs}",
                f"{m.writer_commit_p50 * 1000:.0f} / {m.writer_commit_p99 * 1000:.0f}",
                len(m.writer_failures),
                f"{settled.compacted}/{settled.settled_partitions}",
                "-" if settled.median_seconds is None else f"{settled.median_seconds:.0f}",
                m.settled_partitions_with_equality_deletes,
            ]
        )
    reference = results.reference[-1]
    ingested = next(iter(results.strategies.values())).ingested_bytes
    return (
        (
            ""
            if results.load_compacted_seconds is None
            else f"The initial load compacted by the sidecar in {results.load_compacted_seconds:.0f}s before the stream; "
        )
        + f"{results.batches} micro-batches, one every {results.batch_seconds:g}s, then {results.drained_seconds:.0f}s "
        f"of drain; workload {results.workload_name}; {results.workload.keys:,} starting keys"
        + (f" with a {results.workload.note_chars}-character note" if results.workload.note_chars else "")
        + f"; partitioned by {', '.join(results.workload.partition_by)}; "
        f"format v{results.format_version}; hot read budget {results.hot_read_budget or 'default'}; probes every {results.probe_seconds:g}s; "
        f"{results.machine}. Bytes ingested per table: {ingested / 1e6:.1f} MB. "
        f"Latency columns: each query's latency over the compacted copy's in the same probe, the median over the "
        f"probes wholly in the second half of the writes / in the final probe, after the drain (final copy: "
        f"{reference.count_ms:.0f} ms count, {reference.aggregate_ms:.0f} ms aggregation, {reference.lookup_ms:.0f} ms "
        f"lookup, {reference.data_files} files, {reference.manifests} manifests).\n\n"
        + markdown_table(
            [
                "strategy",
                "count vs compacted, writing / final",
                "aggregation vs compacted",
                "lookup vs compacted",
                "data files at end",
                "eq-delete files at end",
                "pos-delete files at end",
                "manifests at end",
                "MB rewritten",
                "write amplification",
                "(maintenance + writer) / writer while writing",
                "compaction commits",
                "conflicts / attempts",
                "writer commit p50 / p99 ms",
                "writer failures",
                "settled partitions compacted",
                "last write to compacted, median s",
                "settled partitions with eq deletes",
            ],
            rows,
        )
        + "\n"
        + portability_summary(results)
    )


def plot(results: E2EResults, path: Path) -> None:
    """``path``: every metric on one page; beside it one PNG per metric (``e2e-<metric>.png``)."""
    plt = pyplot()
    lines = {**{s: r.series for s, r in results.strategies.items()}, REFERENCE: results.reference}

    def draw(ax: Any, metric: str) -> None:
        for strategy, series in lines.items():
            ax.plot(
                [p.t for p in series],
                [getattr(p, metric) for p in series],
                marker=".",
                label=strategy,
                linestyle="--" if strategy == REFERENCE else "-",
            )
        ax.axvline(results.writes_ended_t, color="grey", linestyle=":", linewidth=1)  # the last batch
        ax.set_title(TITLES[metric], fontsize=9)
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.grid(alpha=0.3)

    fig, axes = plt.subplots(3, 3, figsize=(15, 10))
    for ax, metric in zip(axes.flat, METRICS, strict=True):
        draw(ax, metric)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    for metric in METRICS:
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax, metric)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path.with_name(f"e2e-{metric}.png"), dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for strategy, result in results.strategies.items():
        ax.plot(
            [t for t, _ in result.commit_seconds],
            [s * 1000 for _, s in result.commit_seconds],
            marker=".",
            linestyle="",
            label=strategy,
        )
    ax.set_title("writer commit latency (ms)", fontsize=9)
    ax.set_xlabel("seconds into the run", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path.with_name("e2e-writer_commit_ms.png"), dpi=100)
    plt.close(fig)
    plot_portability(results, path.with_name("e2e-portability.png"))


def plot_portability(results: E2EResults, path: Path) -> None:
    """The sidecar table's oldest live equality delete over the run (0: none live), and each
    reader probe's outcome at its time."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([t for t, _ in results.equality_delete_ages], [a or 0.0 for _, a in results.equality_delete_ages], label="age (s)")
    for offset, reader in enumerate(sorted({r for p in results.readers for r in p.outcomes})):
        for outcome, marker in ((ReadOutcome.EXACT, "o"), (ReadOutcome.REFUSED, "x"), (ReadOutcome.WRONG, "s")):
            times = [p.t for p in results.readers if p.outcomes.get(reader) is outcome]
            if times:
                ax.plot(times, [-1.0 - offset] * len(times), marker=marker, linestyle="", label=f"{reader} {outcome.value}")
    ax.axvline(results.writes_ended_t, color="grey", linestyle=":", linewidth=1)
    ax.set_title("oldest live equality delete in the sidecar's table (s); reader probes below 0", fontsize=9)
    ax.set_xlabel("seconds into the run", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- icecdc bench e2e ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    embedded_stack_arguments(parser)
    parser.add_argument("--minutes", type=float, default=10, help="how long the stream is written (default: 10)")
    parser.add_argument("--keys", type=int, default=20_000, help="rows in the initial load (default: 20000)")
    parser.add_argument("--changes", type=int, default=1500, help="changes per micro-batch outside bursts (default: 1500)")
    parser.add_argument(
        "--mix",
        default="0.7,0.2",
        metavar="UPDATES,INSERTS",
        help="shares of updates and inserts; deletes are the rest (default: 0.7,0.2)",
    )
    parser.add_argument("--batch-seconds", type=float, default=10, help="one micro-batch every this many seconds (default: 10)")
    parser.add_argument("--probe-seconds", type=float, default=60, help="measure every table this often (default: 60)")
    parser.add_argument(
        "--cron-seconds",
        default="30,120",
        metavar="K[,K...]",
        help="periods of the cron strategies, one table each (default: 30,120)",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=90,
        help="how long maintenance runs on after the last batch, at least (default: 90)",
    )
    parser.add_argument(
        "--drain-max-seconds",
        type=float,
        help="the drain goes on until the sidecar has answered every partition, at most this long "
        "(default: --drain-seconds + 300)",
    )
    parser.add_argument("--lookups", type=int, default=100, help="point lookups per table per probe (default: 100)")
    parser.add_argument(
        "--strategies",
        metavar="S[,S...]",
        help="only these strategies (icecdc always; fewer tables, more probes while writing); default: all",
    )
    parser.add_argument(
        "--partitioning",
        choices=("days", "region"),
        default="days",
        help="days: region and day, yesterday's partitions settle; region: four partitions written every batch, "
        "none settles while the stream runs (default: days)",
    )
    parser.add_argument("--format-version", type=int, choices=(2, 3), default=2, help="Iceberg format of the tables (default: 2)")
    parser.add_argument(
        "--workload",
        choices=("small", "large"),
        default="small",
        help="small: the orders stream of --keys rows, --partitioning; large: users' partition sizes, --rows rows over "
        "16 partitions (bucket(16, id)) all written every batch, a 400-character note nine updates in ten keep, "
        "--changes a batch (default: small)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=20_000_000,
        help="rows in the large workload's initial load (default: 20000000, about 230 MB a partition; the bench holds "
        "the model of the rows in memory, about 0.5 KB a row)",
    )
    parser.add_argument(
        "--age-sample-seconds",
        type=float,
        default=2.0,
        help="sample the age of the sidecar table's oldest live equality delete this often (default: 2)",
    )
    parser.add_argument(
        "--hot-read-budget", type=float, help="the sidecar's compactor.hot_read_budget (default: the configuration's default)"
    )
    out_argument(parser, "plots")


def main(args: argparse.Namespace) -> int:
    try:
        updates, inserts = (float(x) for x in args.mix.split(","))
    except ValueError:
        raise UserError(f"--mix wants two shares, updates and inserts, like 0.7,0.2; got {args.mix!r}") from None
    if min(updates, inserts) < 0 or updates + inserts > 1:
        raise UserError(f"--mix: the shares must be at least 0 and add up to at most 1; got {args.mix!r}")
    cron_seconds = positive_numbers(args.cron_seconds, "--cron-seconds")
    if args.workload == "large":
        workload = replace(large_workload(args.rows, args.changes), updates=updates, inserts=inserts)
    else:
        workload = Workload(
            keys=args.keys, changes=args.changes, updates=updates, inserts=inserts, partitioning=args.partitioning
        )
    strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    results = run(
        args.minutes,
        args.out,
        args.state_dir.resolve(),
        workload=workload,
        batch_seconds=args.batch_seconds,
        probe_seconds=args.probe_seconds,
        cron_seconds=cron_seconds,
        drain_seconds=args.drain_seconds,
        drain_max_seconds=args.drain_max_seconds,
        lookups=args.lookups,
        strategies=strategies,
        format_version=args.format_version,
        hot_read_budget=args.hot_read_budget,
        age_sample_seconds=args.age_sample_seconds,
        workload_name=args.workload,
    )
    print(summary(results))
    print(f"results: {args.out / 'e2e.json'}, plots: {args.out / 'e2e*.png'}, summary: {args.out / 'e2e.md'}")
    return 0
