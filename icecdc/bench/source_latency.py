"""``icecdc bench source-latency``: from a PostgreSQL commit to the Iceberg snapshots that show
it, through the real Debezium connector and ``icecdc ingest``, at a steady rate, with ``icecdc
compact`` beside the ingester in its own process unless ``--no-sidecar``. The load is icecdc's
orders transactions or pgbench's TPC-B-like script (``source_loads``).

A row version's latency is when the ingester's batch that added its data file had committed
every table of the load, minus the clock its transaction stamped on it. The files are read as
that batch's snapshot added them, so a compaction that rewrote them since changes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icecdc.bench import out_argument, print_results
from icecdc.bench.e2e.snapshots import amplification_across, snapshot_log
from icecdc.bench.harness import BenchStack, CompactorCounts, CompactorProcess, bench_stack, clone, progress
from icecdc.bench.read_probe import ReadProbes, ReadSample, plot_ratios, reads_said, reads_verdict
from icecdc.bench.report import machine, markdown_table, percentile, publish, pyplot, save
from icecdc.bench.source_loads import Load, LoadKind, make_load
from icecdc.domain.errors import UserError
from icecdc.options import state_dir_argument
from icecdc.runtime.config import IngestConfig
from icecdc.testbed.postgres import ThrowawayPostgres

if TYPE_CHECKING:
    from icecdc.ingest.writer import BatchTiming
    from icecdc.runtime.config import Config

NAME = "source-latency"
say = progress(NAME)
CATCH_UP_SECONDS = 300  # for the table to catch up with the database once the load stops
# The verdict's bounds. The pipeline kept the rate when the table followed at least this share of
# the target rate; the latency stayed flat when the last third's median latency is within this
# share of the first third's.
KEPT_RATE_SHARE = 0.98
FLAT_WITHIN = 0.2
# The visibility watcher loads the table afresh when the ingester reports a commit, and at least
# this often. Not on a short timer: a load parses the whole metadata file in the bench's process,
# whose GIL the ingester's thread shares.
WATCH_SECONDS = 1.0
READBACK_QUIET_SECONDS = 2.0  # a consume this long returning nothing ends the read-back of a topic already complete


class Piece(Enum):
    """A stretch of a row version's path from PostgreSQL to a reader."""

    DEBEZIUM = "debezium"  # the row's stamp to its Kafka record's timestamp (the engine's producer sets CreateTime)
    KAFKA = "kafka"  # the record's timestamp to the ingester's poll returning it
    BATCH = "batch"  # the poll to the batch's commits starting: parse, write files, dead letters
    COMMIT = "commit"  # the commits' start to the snapshot's commit time
    VISIBILITY = "visibility"  # the snapshot's commit time to a fresh reader seeing it: after the measured latency


# The pieces that add up to a row's measured latency (its snapshot's commit time minus its stamp).
PATH = (Piece.DEBEZIUM, Piece.KAFKA, Piece.BATCH, Piece.COMMIT)


@dataclass(frozen=True)
class Moments:
    """Epoch seconds a row version passed on its way (nan where not known)."""

    stamped: float
    produced: float  # its Kafka record's timestamp
    polled: float
    commits_started: float
    committed: float  # its snapshot's commit time
    seen: float  # a fresh reader first saw the snapshot


def pieces(moments: Moments) -> dict[Piece, float]:
    """Each piece's seconds: consecutive moments' differences, so ``PATH``'s add up to committed minus stamped."""
    m = moments
    return {
        Piece.DEBEZIUM: m.produced - m.stamped,
        Piece.KAFKA: m.polled - m.produced,
        Piece.BATCH: m.commits_started - m.polled,
        Piece.COMMIT: m.committed - m.commits_started,
        Piece.VISIBILITY: m.seen - m.committed,
    }


@dataclass
class RunResult:
    """One run: the rates reached and every measured row's latency (seconds)."""

    run: int
    target_rate: float
    seconds: float  # how long the load ran
    committed: int  # transactions committed
    rows_changed: int
    latencies: list[float] = field(default_factory=list)
    committed_at: list[float] = field(default_factory=list)
    snapshots: int = 0  # Iceberg commits that made the measured rows visible
    rows: int = 0  # rows in the table at the end
    rows_match: bool = False
    # From the load's end until the commit of the snapshot that made the table match the database.
    catch_up_seconds: float = 0.0
    writer_commits: int = 0  # the ingester's commits while the load ran
    sidecar: CompactorCounts | None = None  # None: run without the sidecar
    write_amplification: float | None = None  # bytes written by both over the ingester's, while the load ran
    # Piece.value -> each measured row's seconds in that piece, beside ``latencies`` (None: not known).
    pieces: dict[str, list[float | None]] = field(default_factory=lambda: {p.value: [] for p in Piece})
    reads: list[ReadSample] = field(default_factory=list)  # against a compacted copy, while the load ran and after
    load_detail: str = ""  # what the load's own tool said of its run

    def piece(self, which: Piece, share: float) -> float:
        known = [v for v in self.pieces[which.value] if v is not None]
        return percentile(known, share) if known else float("nan")

    @property
    def writer_commits_per_second(self) -> float:
        return self.writer_commits / self.seconds if self.seconds else 0.0

    @property
    def rate(self) -> float:
        """Transactions a second PostgreSQL took."""
        return self.committed / self.seconds if self.seconds else 0.0

    @property
    def pipeline_rate(self) -> float:
        """Transactions a second the table followed: PostgreSQL's rate, times how far apart the
        first and last thirds' rows were committed against how far apart they became visible
        (the mean of each third, as the median would snap to one batch's commit). A pipeline that
        falls behind shows them further apart; a steady delay changes nothing."""
        first, last = self._third_rows(0), self._third_rows(2)
        if not first or not last:
            return float("nan")
        committed = statistics.fmean(at for at, _ in last) - statistics.fmean(at for at, _ in first)
        visible = statistics.fmean(at + lat for at, lat in last) - statistics.fmean(at + lat for at, lat in first)
        return self.rate * committed / visible if visible > 0 else float("nan")

    def latency(self, share: float) -> float:
        return percentile(self.latencies, share) if self.latencies else float("nan")

    def _third_rows(self, which: int) -> list[tuple[float, float]]:
        """(commit, latency) of the rows committed in the first (0), middle (1) or last (2) third."""
        if not self.committed_at:
            return []
        start, end = min(self.committed_at), max(self.committed_at)
        low, high = start + (end - start) * which / 3, start + (end - start) * (which + 1) / 3
        return [(at, lat) for at, lat in zip(self.committed_at, self.latencies, strict=True) if low <= at <= high]

    def third(self, which: int) -> float:
        """The median latency of the rows committed in the first (0), middle (1) or last (2) third."""
        chosen = [lat for _, lat in self._third_rows(which)]
        return statistics.median(chosen) if chosen else float("nan")

    def kept_rate(self) -> bool:
        """PostgreSQL took the target rate, and the table followed it (``KEPT_RATE_SHARE``)."""
        floor = KEPT_RATE_SHARE * self.target_rate
        return self.rate >= floor and self.pipeline_rate >= floor

    def growth(self) -> float:
        """The last third's median latency against the first third's: 0.48 is 48% higher."""
        return self.third(2) / self.third(0) - 1 if self.third(0) > 0 else float("nan")

    def stayed_flat(self) -> bool:
        return abs(self.growth()) <= FLAT_WITHIN


@dataclass
class LatencyResults:
    machine: str
    rate: float
    seconds: float
    warmup_seconds: float
    min_commit_interval_seconds: float
    max_commit_delay_seconds: float
    load: str  # Load.describe()
    sidecar: bool = True
    probe_seconds: float = 0.0  # between read probes; 0: none
    runs: list[RunResult] = field(default_factory=list)


class SnapshotWatcher:
    """Loads the tables afresh from the catalog in its own thread each time it is woken (the
    ingester reported a commit) and at least every ``WATCH_SECONDS``, noting when it first saw
    each snapshot (epoch seconds), as a new reader would."""

    def __init__(self, config: Config, table_names: list[str]) -> None:
        self._config, self._names = config, table_names
        self.seen: dict[int, float] = {}
        self._stop, self._woken = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._watch, name="snapshot-watcher", daemon=True)

    def wake(self) -> None:
        self._woken.set()

    def _watch(self) -> None:
        from icecdc.runtime.catalog import pyiceberg_catalog

        catalog = pyiceberg_catalog(self._config)
        while not self._stop.is_set():
            self._woken.wait(WATCH_SECONDS)
            self._woken.clear()
            for name in self._names:
                if not catalog.table_exists(name):
                    continue
                loaded = catalog.load_table(name)
                at = time.time()  # after the load: a reader sees the snapshot once its load returns
                for snapshot in loaded.snapshots():
                    self.seen.setdefault(snapshot.snapshot_id, at)

    def __enter__(self) -> SnapshotWatcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._woken.set()
        self._thread.join()


def change_after(value: bytes | None) -> dict[str, Any] | None:
    """A Debezium record's row after the change (None for a delete or a tombstone), with or
    without the JSON converter's schema wrapper."""
    import orjson

    if value is None:
        return None
    envelope = orjson.loads(value)
    if isinstance(envelope, dict) and "payload" in envelope and "schema" in envelope:
        envelope = envelope["payload"]
    after = envelope.get("after") if isinstance(envelope, dict) else None
    return after if isinstance(after, dict) else None


def produced_at(
    config: Config, topic: str, identity: Callable[[dict[str, Any]], tuple[Any, ...]]
) -> dict[tuple[Any, ...], float]:
    """Each row version's Kafka record timestamp (epoch seconds), by ``identity`` of its row
    after the change, read back from the whole topic once every record is in it."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from icecdc.runtime import kafka

    client = kafka.consumer(config.kafka, f"latency-readback-{topic}")
    try:
        partitions = range(kafka.partition_count(config.kafka, topic))
        ends = {p: client.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        client.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        times: dict[tuple[Any, ...], float] = {}
        pending = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while pending and time.monotonic() < deadline:
            messages = client.consume(10_000, timeout=READBACK_QUIET_SECONDS)
            if not messages:
                # The embedded broker's watermarks can be a few records off; a busy broker's first
                # fetch can come later than the quiet time, so quiet ends only a read begun.
                if times:
                    break
                continue
            for message in messages:
                if message.error() is not None:
                    continue
                if (message.offset() or 0) + 1 >= ends.get(message.partition() or 0, 0):
                    pending.discard(message.partition() or 0)
                after = change_after(message.value())
                if after is not None:
                    times.setdefault(identity(after), message.timestamp()[1] / 1000)
        return times
    finally:
        client.close()


def _wait_until(condition: Any, timeout: float, what: str) -> float:
    begun = time.monotonic()
    while not condition():
        if time.monotonic() - begun > timeout:
            raise RuntimeError(f"{what} within {timeout:.0f}s")
        time.sleep(1)
    return time.monotonic() - begun


def run_once(stack: BenchStack, postgres: ThrowawayPostgres, run: int, args: argparse.Namespace, out: Path) -> RunResult:
    from icecdc.ingest.runner import run_ingest
    from icecdc.runtime import kafka
    from icecdc.testbed.connector import DebeziumPostgresSource

    load = make_load(args.load, run, args.connections, args.scale)
    load.prepare(postgres)
    source = DebeziumPostgresSource(
        out / f"debezium-{run}",
        postgres,
        stack.config.kafka,
        topic_prefix=f"bench{stack.run_id}r{run}",
        slot_name=f"bench_{stack.run_id}_{run}",
        properties={"table.include.list": ",".join(f"public.{t}" for t in load.source_tables)},
    )
    specs = load.specs(f"bench.latency_{stack.run_id}_{run}", source.topic)
    config = clone(
        stack.config,
        tables=specs,
        commit_topic=f"commits-{stack.run_id}-{run}",
        dead_letter_topic=f"dlq-{stack.run_id}-{run}",
        ingest=stack.config.ingest.model_copy(
            update={
                "source": "direct",
                "min_commit_interval_seconds": args.min_commit_interval,
                "max_commit_delay_seconds": args.max_commit_delay,
            }
        ),
    )
    mirror = Mirror(stack, config, load)
    compactor_config = clone(
        config,
        compaction_topic=f"compactions-{stack.run_id}-{run}",
        maintenance_topic=f"maintenance-{stack.run_id}-{run}",
        compactor={**config.compactor.model_dump(by_alias=True), "consumer_group": f"latency-{stack.run_id}-{run}"},
        coordinator={**config.coordinator.model_dump(by_alias=True), "lease_topic": f"latency-leases-{stack.run_id}-{run}"},
    )
    sidecar: CompactorProcess | None = None
    # Debezium creates them on its first record; the ingester reads them from the start.
    kafka.ensure_topics(config.kafka, [spec["topic"] for spec in specs])
    stop_ingest = threading.Event()
    timings: list[BatchTiming] = []
    with source, SnapshotWatcher(config, mirror.names) as watcher:
        source.wait_streaming()

        def observed(timing: BatchTiming) -> None:
            timings.append(timing)
            watcher.wake()

        stopping = {"spark": stack.spark, "stop": stop_ingest, "observe": observed}
        ingester = threading.Thread(target=run_ingest, args=(config,), kwargs=stopping, name="ingest", daemon=True)
        ingester.start()
        probes: ReadProbes | None = None
        # Whatever fails, the sidecar's process and the ingester stop with the run.
        try:
            # The tables' first rows and one transaction, seen through to Iceberg: the first Spark jobs are slow.
            load.first(postgres)
            _wait_until(
                mirror.matcher(postgres, ingester), CATCH_UP_SECONDS, "the ingester did not mirror the tables' first rows"
            )
            if args.sidecar:  # beside the ingester from its first commits, as deployed
                sidecar = CompactorProcess(compactor_config, f"latency-{run}", out)
            probes = _read_probes(stack, mirror, run, args)
            say(f"run {run}: {args.rate:g} transactions/s for {args.seconds:g}s, {load.describe()}")
            if probes is not None:
                probes.start(time.monotonic())
            try:
                driven = load.drive(postgres, args.rate, args.seconds)
            finally:
                if probes is not None:
                    probes.stop()
            say(
                f"run {run}: {driven.committed} transactions in {driven.elapsed:.1f}s ({driven.committed / driven.elapsed:.0f}/s)"
            )
            _wait_until(mirror.matcher(postgres, ingester), CATCH_UP_SECONDS, "the tables did not catch up with the database")
            # The check's own reads are not the pipeline's: the catch-up ends at the matching commits.
            matched = mirror.current_commit()
            counts = sidecar.counts(*mirror.names) if sidecar is not None else None
            if probes is not None:
                probes.after()
        finally:
            if probes is not None:
                probes.drop_copy()
            if sidecar is not None:
                sidecar.stop()
            stop_ingest.set()
            ingester.join()
    result = RunResult(run, args.rate, driven.elapsed, driven.committed, driven.rows_changed, rows=mirror.rows, sidecar=counts)
    result.rows_match, result.load_detail = True, driven.detail
    result.reads = probes.samples if probes is not None else []
    result.catch_up_seconds = max(0.0, matched - (driven.started + driven.elapsed))
    identity = load.stamped.identity
    produced = produced_at(config, source.topic(load.stamped.table), lambda after: tuple(after[c] for c in identity))
    path = PathTimes(timings, watcher.seen, produced, mirror.stamped_spec, mirror.names)
    _measure(mirror, driven.started + args.warmup_seconds, driven.started, result, path)
    return result


class Mirror:
    """The load's tables as the bench reads them back, by source table: their Iceberg names, and
    whether they hold what PostgreSQL holds."""

    def __init__(self, stack: BenchStack, config: Config, load: Load) -> None:
        self._stack, self.config, self.load = stack, config, load
        self._tables = dict(zip(load.source_tables, config.tables, strict=True))  # specs() keeps that order
        self.names = [table.name for table in self._tables.values()]
        self.stamped_spec = self._tables[load.stamped.table].name
        self.rows = 0  # the source tables' rows at the last match

    def spec_name(self, source_table: str) -> str:
        return self._tables[source_table].name

    def qualified(self, source_table: str) -> str:
        return self.config.table_ref(self.spec_name(source_table)).qualified

    def _columns(self, source_table: str) -> list[str]:
        return list(self._tables[source_table].schema_ or {})  # a mirrored table has its schema

    def _select(self, source_table: str) -> str:
        return f"SELECT {', '.join(self._columns(source_table))} FROM {{t}}"

    def matcher(self, postgres: ThrowawayPostgres, ingester: threading.Thread) -> Callable[[], bool]:
        """Whether every table holds the rows its source table holds now (as multisets: history
        has no key); raises if the ingester stopped."""
        with postgres.connect() as db:
            expected = {t: Counter(tuple(r) for r in db.execute(self._select(t).format(t=t)).fetchall()) for t in self._tables}
        stamped = self.load.stamped
        at = self._columns(stamped.table).index(stamped.stamp)
        newest = (max((row[at] for row in expected[stamped.table]), default=None), expected[stamped.table].total())
        spark = self._stack.spark

        def matches() -> bool:
            if not ingester.is_alive():
                raise RuntimeError("the ingester stopped with an error (see the log above)")
            # The ingester makes a table on its first batch for it.
            if not all(spark.catalog.tableExists(self.qualified(table)) for table in self._tables):
                return False
            # The session's catalog caches a table while it is read; the ingester commits through the Java API.
            for table in self._tables:
                spark.sql(f"REFRESH TABLE {self.qualified(table)}")
            # The stamped table's newest row first: a cheap test that fails until the last batch is in.
            query = f"SELECT max({stamped.stamp}), count(*) FROM {self.qualified(stamped.table)}"
            if tuple(spark.sql(query).collect()[0]) != newest:
                return False
            for table, rows in expected.items():
                if Counter(tuple(r) for r in spark.sql(self._select(table).format(t=self.qualified(table))).collect()) != rows:
                    return False
            self.rows = sum(rows.total() for rows in expected.values())
            return True

        return matches

    def current_commit(self) -> float:
        """Epoch seconds: the newest of the tables' current snapshots' commits."""
        from icecdc.runtime.catalog import pyiceberg_catalog

        catalog = pyiceberg_catalog(self.config)
        snapshots = [catalog.load_table(name).current_snapshot() for name in self.names]
        return max(s.timestamp_ms / 1000 for s in snapshots if s is not None)


@dataclass
class PathTimes:
    """What the bench saw of the path besides the rows: the ingester's batches, the watcher's
    first sight of each snapshot of the load's tables, and each row version's Kafka record
    timestamp. ``stamped``: the table the rows are read from; ``tables``: all of the load's."""

    batches: list[BatchTiming]
    seen: dict[int, float]
    produced: dict[tuple[Any, ...], float]
    stamped: str
    tables: list[str]

    def __post_init__(self) -> None:
        stamped = self.stamped
        self._by_snapshot = {t.result.commits[stamped].snapshot_id: t for t in self.batches if stamped in t.result.commits}

    def visible_at(self, snapshot_id: int, committed: float) -> float:
        """When the transactions of the batch that committed ``snapshot_id`` were in every table:
        its last commit among the load's tables (``committed`` where the batch is not known)."""
        batch = self._by_snapshot.get(snapshot_id)
        if batch is None:
            return committed
        return max(c.timestamp_ms / 1000 for t, c in batch.result.commits.items() if t in self.tables)

    def seen_at(self, snapshot_id: int) -> float:
        """When a fresh reader had seen every table's snapshot of the batch that committed
        ``snapshot_id`` (nan until it saw them all)."""
        batch = self._by_snapshot.get(snapshot_id)
        ids = [snapshot_id] if batch is None else [c.snapshot_id for t, c in batch.result.commits.items() if t in self.tables]
        seen = [self.seen[i] for i in ids if i in self.seen]
        return max(seen) if len(seen) == len(ids) else float("nan")

    def moments(self, snapshot_id: int, committed: float, identity: tuple[Any, ...], stamped: float) -> Moments:
        nan = float("nan")
        batch = self._by_snapshot.get(snapshot_id)
        return Moments(
            stamped,
            self.produced.get(identity, nan),
            nan if batch is None else batch.polled_at,
            nan if batch is None else batch.commits_started_at,
            committed,
            self.seen_at(snapshot_id),
        )


def _read_probes(stack: BenchStack, mirror: Mirror, run: int, args: argparse.Namespace) -> ReadProbes | None:
    """Probes of the load's probed table against a compacted copy; None: off."""
    from icecdc.runtime.catalog import pyiceberg_catalog

    if not args.probe_seconds:
        return None
    probed = mirror.load.probed()
    name = mirror.qualified(probed.table)
    format_version = pyiceberg_catalog(stack.config).load_table(mirror.spec_name(probed.table)).format_version
    copy = stack.config.table_ref(f"bench.latency_copy_{stack.run_id}_{run}").qualified
    return ReadProbes(stack.spark, name, copy, probed.keys, args.probe_seconds, probed.shape, format_version)


def _measure(mirror: Mirror, measured_from: float, load_started: float, result: RunResult, path: PathTimes) -> None:
    """Each stamped row version's latency: when the ingester's batch that added its data file had
    committed every table, minus its stamp; and the ingester's commits and the write
    amplification over all the tables while the load ran."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from icecdc.domain import summary as summary_keys
    from icecdc.domain.files import DataFileContent
    from icecdc.runtime.catalog import pyiceberg_catalog

    catalog = pyiceberg_catalog(mirror.config)
    stamped = mirror.load.stamped
    table = catalog.load_table(mirror.stamped_spec)
    stamp_at = stamped.identity.index(stamped.stamp)
    load_ended = load_started + result.seconds
    visible_in = set()
    for snapshot in table.snapshots():
        if snapshot.summary is not None and snapshot.summary.get(summary_keys.COMPACTOR) is not None:
            continue
        committed = path.visible_at(snapshot.snapshot_id, snapshot.timestamp_ms / 1000)
        result.writer_commits += load_started <= snapshot.timestamp_ms / 1000 <= load_ended
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io):
                data_file = entry.data_file
                if entry.snapshot_id != snapshot.snapshot_id or DataFileContent(data_file.content) is not DataFileContent.DATA:
                    continue
                with table.io.new_input(data_file.file_path).open() as stream:
                    read = pq.read_table(stream, columns=list(stamped.identity))
                # Timestamps as the Debezium records carry them: microseconds.
                columns = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in read.columns]
                for identity in zip(*(c.to_pylist() for c in columns), strict=True):
                    stamp = identity[stamp_at] / 1e6
                    if stamp < measured_from:
                        continue
                    result.latencies.append(committed - stamp)
                    result.committed_at.append(stamp - load_started)
                    split = pieces(path.moments(snapshot.snapshot_id, committed, identity, stamp))
                    for piece, seconds in split.items():
                        result.pieces[piece.value].append(seconds if seconds == seconds else None)  # nan: not known
                    visible_in.add(snapshot.snapshot_id)
    result.snapshots = len(visible_in)
    logs = [snapshot_log(catalog.load_table(name)) for name in mirror.names]
    result.write_amplification = amplification_across(logs, load_started, load_ended + result.catch_up_seconds)


def run(args: argparse.Namespace) -> LatencyResults:
    results = LatencyResults(
        machine(),
        args.rate,
        args.seconds,
        args.warmup_seconds,
        args.min_commit_interval,
        args.max_commit_delay,
        make_load(args.load, 0, args.connections, args.scale).describe(),
        sidecar=args.sidecar,
        probe_seconds=args.probe_seconds,
    )
    state_dir = args.state_dir.resolve()
    # Fair scheduling, the probes' jobs in a pool of their own: the ingester's do not queue behind them.
    with bench_stack(NAME, state_dir, spark={"conf": {"spark.scheduler.mode": "FAIR"}}) as stack, ThrowawayPostgres() as postgres:
        for number in range(1, args.runs + 1):
            result = run_once(stack, postgres, number, args, state_dir)
            results.runs.append(result)
            say(
                f"run {number}: PostgreSQL took {result.rate:.0f} transactions/s, the table followed "
                f"{result.pipeline_rate:.0f}/s; latency p50 {result.latency(0.5):.2f}s, p95 {result.latency(0.95):.2f}s, "
                f"p99 {result.latency(0.99):.2f}s over {len(result.latencies)} rows; {_beside(result)}; "
                f"reads over the compacted copy while writing: {reads_said(result.reads, True)}"
            )
    publish(args.out, NAME, results, _plot, summary)
    return results


def _beside(result: RunResult) -> str:
    """The writer's cadence and what the sidecar did beside it."""
    cadence = f"the ingester committed {result.writer_commits_per_second:.2f} times a second"
    if result.sidecar is None:
        return f"{cadence}, no sidecar"
    counts = result.sidecar
    amplification = "n/a" if result.write_amplification is None else f"{result.write_amplification:.2f}"
    return (
        f"{cadence}; the sidecar committed {counts.compactions} compactions, {counts.commit_conflicts} conflicts in "
        f"{counts.commit_attempts} attempts; write amplification {amplification}"
    )


def _spread(values: list[float], unit: str = "s", digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} {unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def verdict(results: LatencyResults) -> str:
    """Whether the pipeline kept the rate and the latency stayed flat, each with the figures it
    rests on."""
    runs = results.runs
    target, floor = f"{results.rate:,.0f}", KEPT_RATE_SHARE * results.rate
    rates = (
        f"PostgreSQL took {_spread([r.rate for r in runs], 'tx/s', 0)} and the table followed "
        f"{_spread([r.pipeline_rate for r in runs], 'tx/s', 0)}"
    )
    if all(r.kept_rate() for r in runs):
        kept = f"The pipeline kept {target} transactions/s: {rates}, both at least {KEPT_RATE_SHARE:.0%} of it in every run."
    else:
        short = "; ".join(
            f"run {r.run}: PostgreSQL {r.rate:,.0f}, the table {r.pipeline_rate:,.0f}" for r in runs if not r.kept_rate()
        )
        kept = (
            f"The pipeline did not keep {target} transactions/s: {rates}; keeping it needs both at least "
            f"{floor:,.0f} tx/s ({KEPT_RATE_SHARE:.0%}) in every run ({short})."
        )
    thirds = "; ".join(f"run {r.run}: {r.third(0):.2f} s to {r.third(2):.2f} s, {r.growth():+.0%}" for r in runs)
    if all(r.stayed_flat() for r in runs):
        flat = f"The latency stayed flat: the last third's p50 within {FLAT_WITHIN:.0%} of the first third's ({thirds})."
    else:
        flat = (
            f"The latency did not stay flat: flat needs the last third's p50 within {FLAT_WITHIN:.0%} of the first "
            f"third's ({thirds})."
        )
    return f"{kept} {flat}"


def summary(results: LatencyResults) -> str:
    runs = results.runs
    rows = [
        [
            r.run,
            f"{r.rate:,.0f}",
            f"{r.pipeline_rate:,.0f}",
            f"{r.committed:,}",
            f"{len(r.latencies):,}",
            r.snapshots,
            f"{r.latency(0.5):.2f}",
            f"{r.latency(0.95):.2f}",
            f"{r.latency(0.99):.2f}",
            f"{max(r.latencies, default=float('nan')):.2f}",
            f"{r.third(0):.1f} / {r.third(1):.1f} / {r.third(2):.1f}",
            f"{r.catch_up_seconds:.1f}",
            f"{r.writer_commits_per_second:.2f}",
            "-" if r.sidecar is None else f"{r.sidecar.compactions} ({r.sidecar.commit_conflicts}/{r.sidecar.commit_attempts})",
            "-" if r.write_amplification is None else f"{r.write_amplification:.2f}",
            reads_said(r.reads, True),
            reads_said(r.reads, False),
        ]
        for r in runs
    ]
    header = (
        "run | tx/s into PostgreSQL | tx/s the table followed | transactions | row versions measured | snapshots | p50 s | "
        "p95 s | p99 s | max s | p50 s by third of the run | catch-up s | ingester commits/s | "
        "sidecar compactions (conflicts/attempts) | write amplification | reads while writing, x the compacted copy | "
        "reads after catch-up"
    )
    reads = (
        f"{reads_verdict([s for r in runs for s in r.reads])} Reads: a full count, an aggregation and point lookups, "
        f"every {results.probe_seconds:g} s while the load ran and once after catch-up, each the table's median latency "
        "over that of a copy of its rows at that moment in one file per partition."
        if results.probe_seconds
        else "Reads not probed (--probe-seconds 0)."
    )
    return (
        f"{len(runs)} runs of {results.seconds:g} s at {results.rate:,.0f} transactions/s, {results.load} "
        f"(the first {results.warmup_seconds:g} s of each not measured), ingester min commit interval "
        f"{results.min_commit_interval_seconds:g} s, max commit delay {results.max_commit_delay_seconds:g} s, "
        f"{'icecdc compact beside it' if results.sidecar else 'no sidecar'}; {results.machine}.\n\n"
        f"PostgreSQL commit to visible in Iceberg, median of the runs (range): p50 {_spread([r.latency(0.5) for r in runs])}, "
        f"p95 {_spread([r.latency(0.95) for r in runs])}, p99 {_spread([r.latency(0.99) for r in runs])}, "
        f"max {_spread([max(r.latencies) for r in runs])}. "
        f"{verdict(results)} {reads}{_load_details(runs)}\n\n"
        "The table followed: PostgreSQL's rate, times the time between the mean commits of the run's first and last "
        "thirds, over the time between the mean moments their rows became visible. Catch-up: from the load's end "
        "to the commit that made the table match.\n\n" + markdown_table(header, rows) + "\n\n" + pieces_summary(results)
    )


def _load_details(runs: list[RunResult]) -> str:
    """What the load's own tool said of each run ("" when it said nothing)."""
    said = "; ".join(f"run {r.run}: {r.load_detail}" for r in runs if r.load_detail)
    return f" The load's own figures: {said}." if said else ""


PIECE_NAMES = {
    Piece.DEBEZIUM: "Debezium: stamp to Kafka record timestamp",
    Piece.KAFKA: "Kafka: record timestamp to the ingester's poll",
    Piece.BATCH: "batch: poll to the commits' start (parse, write files)",
    Piece.COMMIT: "commit: the catalog commit",
    Piece.VISIBILITY: "visibility: commit to a fresh reader seeing it",
}


def pieces_summary(results: LatencyResults) -> str:
    """Each piece's p50 and p95 in each run."""
    rows = [
        [PIECE_NAMES[piece], *(f"{r.piece(piece, 0.5):.3f} / {r.piece(piece, 0.95):.3f}" for r in results.runs)]
        for piece in Piece
    ]
    header = " | ".join(["piece", *(f"run {r.run} p50 / p95 s" for r in results.runs)])
    return (
        "The path in pieces: the first four add up to each row's latency; visibility follows it (the watcher "
        f"loads the table every {WATCH_SECONDS:g} s, its resolution).\n\n" + markdown_table(header, rows) + "\n"
    )


def binned_medians(at: list[float], values: list[float | None], width: float) -> tuple[list[float], list[float]]:
    """The median of ``values`` in each ``width``-second bin of ``at`` (bins' middles), unknown values left out."""
    bins: dict[int, list[float]] = {}
    for when, value in zip(at, values, strict=True):
        if value is not None:
            bins.setdefault(int(when // width), []).append(value)
    ordered = sorted(bins)
    return [(b + 0.5) * width for b in ordered], [statistics.median(bins[b]) for b in ordered]


def _plot(results: LatencyResults, path: Path) -> None:
    plt = pyplot()
    fig, ((left, right, reads), (over_run, bars, unused)) = plt.subplots(2, 3, figsize=(16, 8))
    fig.delaxes(unused)
    for r in results.runs:
        step = max(1, len(r.latencies) // 3_000)  # a readable scatter
        left.scatter(r.committed_at[::step], r.latencies[::step], s=2, alpha=0.4, label=f"run {r.run}")
        ordered = sorted(r.latencies)
        right.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=f"run {r.run}")
    left.set_xlabel("commit, seconds into the run")
    left.set_ylabel("seconds to visible in Iceberg")
    left.set_title(f"each row, at {results.rate:,.0f} transactions/s", fontsize=9)
    right.set_xlabel("seconds from PostgreSQL commit to visible in Iceberg")
    right.set_ylabel("share of rows")
    right.set_title("cumulative distribution", fontsize=9)
    plot_ratios(reads, {f"run {r.run}": r.reads for r in results.runs})
    for ax in (left, right, reads):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, markerscale=4)
    _plot_pieces(results, over_run, bars)
    save(plt, fig, path, over_run, bars, legend=7)


def _plot_pieces(results: LatencyResults, over_run: Any, bars: Any) -> None:
    """Each piece's median over the run (5 s bins), and its p50 and p95 (the first run's)."""
    styles = ["-", "--", ":", "-."]
    for number, r in enumerate(results.runs):
        for colour, piece in enumerate(Piece):
            xs, ys = binned_medians(r.committed_at, r.pieces[piece.value], 5.0)
            label = piece.value if number == 0 else None
            over_run.plot(xs, ys, styles[number % len(styles)], color=f"C{colour}", label=label)
    over_run.set_xlabel("commit, seconds into the run")
    over_run.set_ylabel("median seconds in the piece (5 s bins)")
    over_run.set_title("the path in pieces over the run (runs by line style)", fontsize=9)
    if results.runs:
        first = results.runs[0]
        names = [p.value for p in Piece]
        spots = range(len(names))
        bars.bar([x - 0.2 for x in spots], [first.piece(p, 0.5) for p in Piece], width=0.4, label="p50")
        bars.bar([x + 0.2 for x in spots], [first.piece(p, 0.95) for p in Piece], width=0.4, label="p95")
        bars.set_xticks(list(spots), names, fontsize=8)
    bars.set_ylabel("seconds")
    bars.set_title(f"each piece, run {results.runs[0].run if results.runs else '-'}", fontsize=9)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)
    parser.add_argument("--rate", type=float, default=1_000, help="transactions per second into PostgreSQL (default: 1000)")
    parser.add_argument("--seconds", type=float, default=90, help="how long each run drives the load (default: 90)")
    parser.add_argument("--warmup-seconds", type=float, default=10, help="commits not measured at each run's start (default: 10)")
    parser.add_argument("--runs", type=int, default=3, help="runs, each with its own table and connector (default: 3)")
    parser.add_argument(
        "--connections",
        type=int,
        default=8,
        help="PostgreSQL connections sharing the rate: one thread each, or pgbench's clients (default: 8)",
    )
    parser.add_argument(
        "--load",
        type=LoadKind,
        choices=list(LoadKind),
        default=LoadKind.ORDERS,
        help="orders: icecdc's orders transactions; pgbench: pgbench -R RATE, its TPC-B-like script (default: orders)",
    )
    parser.add_argument("--scale", type=int, default=1, help="pgbench -i's scale factor, with --load pgbench (default: 1)")
    defaults = IngestConfig()
    parser.add_argument(
        "--min-commit-interval",
        type=float,
        default=defaults.min_commit_interval_seconds,
        help=f"the ingester's ingest.min_commit_interval_seconds (default: {defaults.min_commit_interval_seconds:g})",
    )
    parser.add_argument(
        "--max-commit-delay",
        type=float,
        default=defaults.max_commit_delay_seconds,
        help=f"the ingester's ingest.max_commit_delay_seconds (default: {defaults.max_commit_delay_seconds:g})",
    )
    parser.add_argument(
        "--sidecar",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run icecdc compact beside the ingester, in its own process (default: on)",
    )
    parser.add_argument(
        "--probe-seconds",
        type=float,
        default=0,
        # Off by default: a probe's copy and queries take the cores the latency is measured on.
        help="seconds between read probes against a compacted copy while the load runs; 0: no reads (default: 0)",
    )
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    if (
        min(args.rate, args.seconds, args.runs, args.connections, args.min_commit_interval, args.scale) <= 0
        or not 0 <= args.warmup_seconds < args.seconds
        or args.max_commit_delay < args.min_commit_interval
        or args.probe_seconds < 0
    ):
        raise UserError(
            "--rate, --seconds, --runs, --connections, --min-commit-interval and --scale must be above 0, --warmup-seconds "
            "below --seconds, --max-commit-delay at least --min-commit-interval, --probe-seconds at least 0"
        )
    print_results(args.out, NAME, summary(run(args)))
    return 0
