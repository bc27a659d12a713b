"""Measuring the e2e bench's tables while they are written: files, query latency against a
compacted copy, reads by readers that cannot apply equality deletes, and the age of the
sidecar table's oldest live equality delete."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.manifest import ManifestContent

from icecdc.bench.harness import progress
from icecdc.bench.portability import KeyDigest, ReadOutcome, digest_exactness, oldest_equality_delete_age
from icecdc.bench.read_probe import copy_compacted, query_latency
from icecdc.bench.strategies import ICECDC
from icecdc.compactor.sizes import SizeClass, size_class
from icecdc.domain.files import DataFileContent
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import CompactorConfig, Config
from icecdc.workload import OrdersWorkload

COLUMNS = ("id", "region", "status", "amount", "updated_at")
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
METRICS = tuple(TITLES)  # a probe point's measures, in the order they are plotted
REFERENCE = "compacted"
# The probe's Spark scheduler pool: the writer's jobs take the next free core rather than wait.
PROBE_POOL = "e2e-probe"
say = progress("e2e")


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
    # How far behind the current snapshot the newest portable one was (read under ``on_portable``).
    portable_seconds_behind: float | None = None


def on_portable(reader: str) -> str:
    """The name a reader's outcome on the newest portable snapshot is kept under."""
    return f"{reader} on the portable snapshot"


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
        self._spark, self._started, self._orders, self._lookups, self._repeats = spark, started, orders, lookups, repeats
        self._catalog, self._settings = pyiceberg_catalog(config), config.compactor
        self._partitioning = ", ".join(partition_by)
        self.reference = f"{config.catalog.name}.bench.e2e_{REFERENCE}_{run_id}"
        self._names = {**names, REFERENCE: self.reference}
        self.series: dict[str, list[ProbePoint]] = {s: [] for s in self._names}
        self.readers: list[ReaderProbe] = []
        self._duckdb: Any = None  # opened on the first probe, used by one thread at a time
        # Off, so that every table is counted by reading it, as a count with deletes must be.
        spark.conf.set("spark.sql.iceberg.aggregate-push-down.enabled", "false")

    def __call__(self) -> None:
        began = time.monotonic() - self._started
        # Keys of the stream's final state: a key that does not exist yet costs a lookup all the same.
        keys = self._orders.sample_keys(random.Random(len(self.series[REFERENCE])), self._lookups)
        # Copied from the sidecar's table at this moment: the same rows, each partition in one file.
        copy_compacted(self._spark, self._names[ICECDC], self.reference, self._partitioning, 2)
        files = {}
        for strategy, name in self._names.items():
            self._spark.sql(f"REFRESH TABLE {name}")
            files[strategy] = file_counts(self._catalog.load_table(name.split(".", 1)[1]), self._settings)
        latency = query_latency(self._spark, self._names, keys, self._repeats)
        self.readers.append(self._read_portably())
        ended = time.monotonic() - self._started
        for strategy in self._names:
            measured: dict[str, Any] = {**latency[strategy], **files[strategy]}  # ProbePoint's fields but its times
            self.series[strategy].append(ProbePoint(t=round(began, 1), t_end=round(ended, 1), **measured))
        line = ", ".join(
            f"{s} {p[-1].count_ms:.0f}/{p[-1].lookup_ms:.0f} ms {p[-1].equality_delete_files} eq-del"
            for s, p in self.series.items()
        )
        readers = ", ".join(f"{r} {o.value}" for r, o in self.readers[-1].outcomes.items())
        say(f"t={began:.0f}-{ended:.0f}s count/lookup: {line}; the sidecar's table read by {readers}")

    def _read_portably(self) -> ReaderProbe:
        """The sidecar's table read by pyiceberg and DuckDB (its keys), against Spark's read of the
        same snapshot (Spark applies equality deletes; the final check holds it to the stream)."""
        from icecdc.portable_snapshot import portable_snapshot

        name = self._names[ICECDC]
        began = round(time.monotonic() - self._started, 1)
        table = self._catalog.load_table(name.split(".", 1)[1])
        snapshot = table.current_snapshot()
        if snapshot is None:
            return ReaderProbe(began, None, {}, {})
        self._spark.sql(f"REFRESH TABLE {name}")  # Spark's cached table may not know the snapshot yet
        outcomes, took = self._read_snapshot(table, name, snapshot.snapshot_id, lambda reader: reader)
        portable = portable_snapshot(table)
        if portable is None:
            return ReaderProbe(began, snapshot.snapshot_id, outcomes, took)
        if portable.is_current:  # the same snapshot: its reads stand for both
            on_it = {on_portable(r): o for r, o in outcomes.items()}, {on_portable(r): ms for r, ms in took.items()}
        else:
            on_it = self._read_snapshot(table, name, portable.snapshot_id, on_portable)
        return ReaderProbe(began, snapshot.snapshot_id, outcomes | on_it[0], took | on_it[1], portable.seconds_behind)

    def _read_snapshot(
        self, table: Any, name: str, snapshot_id: int, named: Callable[[str], str]
    ) -> tuple[dict[str, ReadOutcome], dict[str, float]]:
        """Each reader's outcome on one snapshot against Spark's read of it, and its time (ms)."""
        from icecdc.bench.engine_readers import duckdb_connection, key_digest, read_duckdb, read_pyiceberg

        spark_read = self._spark.sql(
            f"SELECT count(*), count(DISTINCT id), coalesce(sum(id), 0) FROM {name} VERSION AS OF {snapshot_id}"
        ).first()
        expected = KeyDigest(int(spark_read[0]), int(spark_read[1]), int(spark_read[2]))
        if self._duckdb is None:
            self._duckdb = duckdb_connection()
        outcomes, took = {}, {}
        for read in (
            lambda: read_pyiceberg(table, ("id",), snapshot_id),
            lambda: read_duckdb(table, ("id",), self._duckdb, snapshot_id),
        ):
            started = time.perf_counter()
            result = read()
            took[named(result.reader.value)] = (time.perf_counter() - started) * 1000
            outcomes[named(result.reader.value)] = digest_exactness(expected, key_digest(result))
        return outcomes, took


def equality_delete_ages(table: Any, now_ms: int) -> tuple[float | None, float | None]:
    """``portability.oldest_equality_delete_age`` of a pyiceberg table's live equality deletes, and
    of its global ones (under an unpartitioned spec), from the current snapshot's delete manifests."""
    current = table.current_snapshot()
    if current is None:
        return None, None
    specs, partitioned = table.specs(), not table.spec().is_unpartitioned()
    added_by: list[tuple[int | None, bool]] = [
        (entry.snapshot_id, partitioned and specs[manifest.partition_spec_id].is_unpartitioned())
        for manifest in current.manifests(table.io)
        if manifest.content is ManifestContent.DELETES
        for entry in manifest.fetch_manifest_entry(table.io)
        if entry.data_file.content is DataFileContent.EQUALITY_DELETES
    ]
    committed = {s.snapshot_id: s.timestamp_ms for s in table.snapshots()}
    return (
        oldest_equality_delete_age([s for s, _ in added_by], committed, now_ms),
        oldest_equality_delete_age([s for s, is_global in added_by if is_global], committed, now_ms),
    )


def main_behind_seconds(table: Any, branch: str) -> float | None:
    """How far a staged table's main is behind the head of ``branch`` by commit time (None: main
    has no snapshot yet)."""
    head, main = table.snapshot_by_name(branch), table.current_snapshot()
    if main is None:
        return None
    return 0.0 if head is None else max(0, head.timestamp_ms - main.timestamp_ms) / 1000


class AgeSampler:
    """Samples the age of a table's oldest live equality delete in main and of its oldest global
    one on a thread of its own; on a staged table also how far main is behind the branch's head."""

    def __init__(self, config: Config, name: str, every_seconds: float, started: float, branch: str | None = None) -> None:
        self._catalog = pyiceberg_catalog(config)
        self._identifier = name.split(".", 1)[1]
        self._every, self._started, self._branch = every_seconds, started, branch
        self.samples: list[tuple[float, float | None]] = []
        self.global_samples: list[tuple[float, float | None]] = []
        self.main_behind: list[tuple[float, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="age-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                table = self._catalog.load_table(self._identifier)
                age, global_age = equality_delete_ages(table, int(time.time() * 1000))
            except Exception as exc:  # noqa: BLE001 - a lost sample is said, the run goes on
                say(f"age sample failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            t = round(time.monotonic() - self._started, 1)
            self.samples.append((t, age))
            self.global_samples.append((t, global_age))
            if self._branch is not None:
                self.main_behind.append((t, main_behind_seconds(table, self._branch)))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
