"""``icecdc bench e2e``: what each maintenance strategy does to reads, to the bill and to the
writer, over one CDC run.

One event stream (an orders table: a hot current day that moves on, changes soon after a row is
placed, a share of late changes to any older day, bursty batch sizes) is written by the
ingester's micro-batch writer into four tables at once, one per strategy
(``icecdc.bench.strategies``), every micro-batch one Spark job and one commit per table, as the
ingester does for several tables. The maintenance of each table runs beside it. Every probe
interval a probe, on a thread of its own while the writer keeps its schedule, measures, per table: file counts (data, small, live
equality- and position-delete files, bytes) and query latency (a full count with deletes
applied, an aggregation, point lookups by key; medians of repeats), and the same for a fully
compacted copy of the current data as the reference. After the last batch it keeps probing for
a drain period while maintenance catches up, then checks that every table holds exactly the
stream's final state and reads the rest from each table's snapshot log: bytes ingested, bytes
maintenance wrote, compaction commits, and for every partition left with equality deletes by its
last write, how long until a maintenance commit touched it.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icecdc import kafka
from icecdc.bench.report import machine, markdown_table, publish
from icecdc.bench.strategies import STRATEGIES, CronRewrite, Sidecar, Strategy, ThresholdCompaction
from icecdc.broker import EmbeddedBroker, free_port
from icecdc.catalog import ensure_tables, pyiceberg_catalog, qualified
from icecdc.compactor.metadata import DATA, EQUALITY_DELETES
from icecdc.config import Config, embedded_config
from icecdc.workload import ORDERS_PARTITIONING, OrdersWorkload, orders_table

COLUMNS = ("id", "region", "status", "amount", "updated_at")
METRICS = ("count_ms", "aggregate_ms", "lookup_ms", "data_files", "small_files", "equality_delete_files",
           "position_delete_files", "bytes")
TITLES = {
    "count_ms": "full count, deletes applied (ms, median)", "aggregate_ms": "aggregation (ms, median)",
    "lookup_ms": "point lookup by key (ms, median)", "data_files": "live data files",
    "small_files": "small data files", "equality_delete_files": "live equality-delete files",
    "position_delete_files": "live position-delete files", "bytes": "live bytes",
}
REFERENCE = "compacted"


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


def batch_sizes(batches: int, workload: Workload) -> list[int]:
    """Changes per micro-batch: ``burst_factor`` times the base in a ``burst_share`` of them."""
    draw = random.Random(workload.seed)
    return [round(workload.changes * (workload.burst_factor if draw.random() < workload.burst_share else 1))
            for _ in range(batches)]


def generate(batches: int, workload: Workload) -> tuple[list[list[tuple[bytes, bytes]]], OrdersWorkload]:
    """The initial load and ``batches`` micro-batches of changes, and the state they leave."""
    orders = OrdersWorkload(seed=workload.seed, today=0, recent_keys=workload.changes * 2, late_share=workload.late_share)
    out = [[c.record for c in orders.load(workload.keys)]]
    for number, size in enumerate(batch_sizes(batches, workload), 1):
        orders.today = number // workload.batches_per_day
        out.append([c.record for c in orders.changes(size, workload.updates, workload.inserts)])
    return out, orders


def _progress(message: str) -> None:
    print(f"[bench e2e] {message}", flush=True)


def _config(base: Config, run_id: int) -> Config:
    data = base.model_dump(by_alias=True)
    data.update({
        "tables": [orders_table(f"bench.e2e_{s}_{run_id}", f"e2e-{s}-{run_id}") for s in STRATEGIES],
        "commit_topic": f"e2e-commits-{run_id}", "compaction_topic": f"e2e-compactions-{run_id}",
        "maintenance_topic": f"e2e-maintenance-{run_id}",
        "compactor": {"consumer_group": f"e2e-{run_id}", "http": {"port": None}, "reconcile_seconds": 10,
                      # Scaled to the benchmark's clock: a partition written every batch is hot, one
                      # left alone for a few batches has settled.
                      "settle": {"cadence_multiple": 3, "min_seconds": 15, "initial_seconds": 30, "max_seconds": 60}},
        "coordinator": {"lease_topic": f"e2e-leases-{run_id}"},
    })
    return Config.model_validate(data)


def _sidecar_config(config: Config) -> Config:
    data = config.model_dump(by_alias=True)
    data["tables"] = [data["tables"][STRATEGIES.index("icecdc")]]
    return Config.model_validate(data)


# ---- measuring a table --------------------------------------------------------------------------


def file_counts(table: Any, small_file_bytes: int) -> dict[str, int]:
    """Live files of a pyiceberg table, from its metadata."""
    counts = dict.fromkeys(("data_files", "small_files", "equality_delete_files", "position_delete_files", "bytes"), 0)
    if table.current_snapshot() is None:
        return counts
    for row in table.inspect.files().select(["content", "file_size_in_bytes"]).to_pylist():
        size = row["file_size_in_bytes"]
        counts["bytes"] += size
        if row["content"] == DATA:
            counts["data_files"] += 1
            counts["small_files"] += size < small_file_bytes
        elif row["content"] == EQUALITY_DELETES:
            counts["equality_delete_files"] += 1
        else:
            counts["position_delete_files"] += 1
    return counts


def _median_ms(run: Any, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def query_latency(spark: Any, name: str, keys: list[int], repeats: int) -> dict[str, float]:
    """Median latency of a full count (deletes applied), an aggregation and point lookups."""
    count = spark.sql(f"SELECT count(*) FROM {name}")
    aggregate = spark.sql(f"SELECT region, status, count(*), sum(amount) FROM {name} GROUP BY region, status")
    lookups = [_median_ms(lambda k=k: spark.sql(f"SELECT * FROM {name} WHERE id = {k}").collect(), 1) for k in keys]
    return {"count_ms": _median_ms(count.collect, repeats), "aggregate_ms": _median_ms(aggregate.collect, repeats),
            "lookup_ms": statistics.median(lookups)}


class Probe:
    """Measures every strategy's table and a compacted copy of the current data."""

    def __init__(self, spark: Any, config: Config, names: dict[str, str], orders: OrdersWorkload, lookups: int,
                 repeats: int, run_id: int) -> None:
        self._spark = spark
        self._catalog = pyiceberg_catalog(config)
        self._names = names
        self._orders = orders
        self._lookups = lookups
        self._repeats = repeats
        self._small = config.compactor.small_file_bytes
        self.reference = f"{config.catalog.name}.bench.e2e_{REFERENCE}_{run_id}"
        self.series: dict[str, list[dict[str, float]]] = {s: [] for s in (*names, REFERENCE)}
        # Iceberg answers count(*) from file metadata when no delete applies: off, so that every
        # table is counted by reading it, as a count with deletes must be.
        spark.conf.set("spark.sql.iceberg.aggregate-push-down.enabled", "false")

    def __call__(self, elapsed: float) -> None:
        # Keys of the stream's final state: mid-run some do not exist yet, which costs a lookup
        # all the same.
        keys = random.Random(int(elapsed)).sample(sorted(self._orders.rows), self._lookups)
        # Copied from the sidecar's table at this moment: the same rows, each partition in one file.
        partitioning = ", ".join(ORDERS_PARTITIONING)
        self._spark.sql(f"CREATE OR REPLACE TABLE {self.reference} USING iceberg PARTITIONED BY ({partitioning}) "
                        f"TBLPROPERTIES ('format-version' = '2') AS SELECT * FROM {self._names['icecdc']}")
        for strategy, name in (*self._names.items(), (REFERENCE, self.reference)):
            self._spark.sql(f"REFRESH TABLE {name}")
            table = self._catalog.load_table(name.split(".", 1)[1])
            point = {"t": round(elapsed, 1), **file_counts(table, self._small),
                     **query_latency(self._spark, name, keys, self._repeats)}
            self.series[strategy].append(point)
        line = ", ".join(f"{s} {p[-1]['count_ms']:.0f}/{p[-1]['lookup_ms']:.0f} ms {p[-1]['equality_delete_files']} eq-del"
                         for s, p in self.series.items())
        _progress(f"t={elapsed:.0f}s count/lookup: {line}")


# ---- the snapshot log ---------------------------------------------------------------------------


def snapshot_log(table: Any) -> dict[str, Any]:
    """Bytes the writer added, bytes maintenance wrote (every ``replace`` commit), and when each
    partition was last written and when maintenance touched it, read from the manifests each
    snapshot added."""
    io = table.io
    ingested = rewritten = commits = 0
    writes: dict[tuple, list[tuple[float, bool]]] = defaultdict(list)  # (time, left an equality delete)
    maintained: dict[tuple, list[float]] = defaultdict(list)
    for snapshot in table.snapshots():
        summary = snapshot.summary
        added = int(summary.get("added-files-size", 0) or 0)
        maintenance = summary.operation.value == "replace"
        if maintenance:
            rewritten += added
            commits += bool(added or int(summary.get("removed-files-size", 0) or 0))
        else:
            ingested += added
        when = snapshot.timestamp_ms / 1000
        touched: dict[tuple, bool] = {}
        for manifest in snapshot.manifests(io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                if entry.snapshot_id != snapshot.snapshot_id or entry.status.value == 0:  # EXISTING
                    continue
                key = tuple(entry.data_file.partition)
                equality = entry.data_file.content.value == EQUALITY_DELETES and entry.status.value == 1
                touched[key] = touched.get(key, False) or equality
        for key, equality in touched.items():
            (maintained[key].append(when) if maintenance else writes[key].append((when, equality)))
    current = table.current_snapshot()
    live_equality = {
        tuple(entry.data_file.partition)
        for manifest in (current.manifests(io) if current is not None else [])
        for entry in manifest.fetch_manifest_entry(io)
        if entry.data_file.content.value == EQUALITY_DELETES
    }
    return {"ingested_bytes": ingested, "rewritten_bytes": rewritten, "compaction_commits": commits,
            "writes": writes, "maintained": maintained, "live_equality_deletes": live_equality}


def settle_to_compacted(log: dict[str, Any], writes_ended: float, settle_seconds: float) -> dict[str, Any]:
    """For every partition whose last write left equality deletes and came ``settle_seconds``
    before the writes ended (it settled during the run): seconds from that write to the first
    maintenance commit that touched it, or None if none did."""
    delays: list[float | None] = []
    for key, history in log["writes"].items():
        last, equality = max(history)
        if not equality or last > writes_ended - settle_seconds:
            continue
        after = [t for t in log["maintained"].get(key, []) if t >= last]
        delays.append(min(after) - last if after else None)
    done = [d for d in delays if d is not None]
    return {"settled_partitions": len(delays), "compacted": len(done),
            "median_seconds": statistics.median(done) if done else None, "seconds": done}


# ---- the run ------------------------------------------------------------------------------------


def _start(spark: Any, config: Config, strategy: str, name: str, cron_seconds: float, out: Path) -> Strategy:
    if strategy == "cron":
        return CronRewrite(spark, config, name.split(".", 1)[1], cron_seconds)
    if strategy == "threshold":
        return ThresholdCompaction(spark, config, name.split(".", 1)[1], config.compactor)
    if strategy == "icecdc":
        return Sidecar(_sidecar_config(config), out)
    return Strategy()


def _run_strategies(base: Config, out: Path, batches: int, workload: Workload, batch_seconds: float,
                    probe_seconds: float, cron_seconds: float, drain_seconds: float, lookups: int,
                    repeats: int) -> dict[str, Any]:
    from icecdc.ingest.publish import CommitEventPublisher
    from icecdc.ingest.sources import records_to_dataframe, source_rows
    from icecdc.ingest.writer import BatchWriter
    from icecdc.spark import create_spark_session

    stream, orders = generate(batches, workload)
    run_id = int(time.time())
    config = _config(base, run_id)
    spark = create_spark_session(config, "icecdc-bench-e2e")
    ensure_tables(spark, config)
    kafka.ensure_topics(config.kafka, [config.commit_topic, config.dead_letter_topic])
    producer = kafka.producer(config.kafka)
    writer = BatchWriter(spark, config, producer, CommitEventPublisher(producer, config.commit_topic), "bench-e2e")
    names = {s: qualified(config, t) for s, t in zip(STRATEGIES, config.tables, strict=True)}
    by_table = {t.name: s for s, t in zip(STRATEGIES, config.tables, strict=True)}
    offset = 0

    def write(number: int) -> dict[str, float]:
        # Every table reads the same records from its own topic: one Spark job, one commit each.
        nonlocal offset
        pairs = stream[number]
        rows = [row for t in config.tables for row in source_rows(t.topic, pairs, offset)]
        offset += len(pairs)
        result = writer(records_to_dataframe(spark, rows), number)
        return {by_table[t]: s for t, s in result.commit_seconds.items()}

    _progress(f"initial load: {workload.keys:,} rows into {len(STRATEGIES)} tables")
    write(0)
    strategies = {s: _start(spark, config, s, names[s], cron_seconds, out) for s in STRATEGIES}
    for strategy in strategies.values():
        strategy.start()
    probe = Probe(spark, config, names, orders, min(lookups, workload.keys), repeats, run_id)
    commit_seconds: dict[str, list[tuple[float, float]]] = {s: [] for s in STRATEGIES}
    writer_failures: list[str] = []
    started = time.monotonic()
    # The probe runs on its own thread while the writer keeps its schedule: pausing the writer
    # for a probe would give every partition a quiet gap that a real stream does not have.
    probing = threading.Event()

    def probe_loop() -> None:
        while not probing.wait(probe_seconds):
            probe(time.monotonic() - started)

    prober = threading.Thread(target=probe_loop, name="probe", daemon=True)
    prober.start()
    for number in range(1, batches + 1):
        time.sleep(max(0.0, started + (number - 1) * batch_seconds - time.monotonic()))
        try:
            for strategy, seconds in write(number).items():
                commit_seconds[strategy].append((round(time.monotonic() - started, 1), seconds))
        except Exception as exc:  # noqa: BLE001 - a writer failure is what this counts
            writer_failures.append(f"batch {number}: {type(exc).__name__}: {str(exc)[:300]}")
        if number % 6 == 0 or number == batches:
            _progress(f"batch {number}/{batches} ({len(stream[number]):,} changes), writer failures {len(writer_failures)}")
    writes_ended = time.time()
    _progress(f"all {batches} batches written; maintenance drains for {drain_seconds:.0f}s")
    time.sleep(drain_seconds)
    probing.set()
    prober.join()
    counts = {s: strategy.stop() for s, strategy in strategies.items()}
    probe(time.monotonic() - started)  # the final state, maintenance stopped
    producer.flush(10)

    expected = orders.expected_rows()
    catalog = pyiceberg_catalog(config)
    settle_seconds = config.compactor.settle.max_seconds
    results: dict[str, Any] = {}
    for strategy, name in names.items():
        rows = sorted(tuple(r) for r in spark.table(name).select(*COLUMNS).collect())
        if rows != expected:
            raise RuntimeError(f"{strategy}: the table does not hold the stream's final state")
        table = catalog.load_table(name.split(".", 1)[1])
        log = snapshot_log(table)
        settled_keys = {k for k, h in log["writes"].items() if max(h)[0] <= writes_ended - settle_seconds}
        latencies = [s for _, s in commit_seconds[strategy]]
        results[strategy] = {
            "series": probe.series[strategy], "commit_seconds": commit_seconds[strategy],
            "writer_failures": writer_failures, "rows_match": True,
            "ingested_bytes": log["ingested_bytes"], "rewritten_bytes": log["rewritten_bytes"],
            "write_amplification": log["rewritten_bytes"] / log["ingested_bytes"],
            "compaction_commits": log["compaction_commits"], "maintenance": counts[strategy],
            "writer_commit_p50": statistics.median(latencies), "writer_commit_max": max(latencies),
            "settle_to_compacted": settle_to_compacted(log, writes_ended, settle_seconds),
            "settled_partitions_with_equality_deletes": len(log["live_equality_deletes"] & settled_keys),
        }
    results[REFERENCE] = {"series": probe.series[REFERENCE]}
    _progress(f"every table holds the stream's final state ({len(expected):,} rows)")
    for name in (*names.values(), probe.reference):
        spark.sql(f"DROP TABLE IF EXISTS {name} PURGE")
    return results


def run(minutes: float, out: Path, state_dir: Path, *, workload: Workload = Workload(), batch_seconds: float = 10.0,
        probe_seconds: float = 60.0, cron_seconds: float = 120.0, drain_seconds: float = 90.0, lookups: int = 100,
        repeats: int = 3) -> dict[str, Any]:

    batches = max(2, round(minutes * 60 / batch_seconds))
    results: dict[str, Any] = {
        "machine": machine(), "minutes": minutes, "batches": batches, "batch_seconds": batch_seconds,
        "probe_seconds": probe_seconds, "cron_seconds": cron_seconds, "drain_seconds": drain_seconds,
        "lookups": lookups, "repeats": repeats, "workload": workload.__dict__,
    }
    port = free_port()
    broker = EmbeddedBroker(state_dir / "broker", port)
    broker.start()
    try:
        # In a function of its own so that its Kafka clients are gone before the broker stops.
        results["strategies"] = _run_strategies(embedded_config(state_dir, port), out, batches, workload, batch_seconds,
                                                probe_seconds, cron_seconds, drain_seconds, lookups, repeats)
    finally:
        broker.stop()
    publish(out, "e2e", results, plot, summary)
    return results


# ---- reporting ----------------------------------------------------------------------------------


def after_warm_up(series: list[dict[str, float]], metric: str) -> list[float]:
    """The second half of a series: the first half is the tables filling up."""
    return [p[metric] for p in series[len(series) // 2:]]


def latency_ratio(results: dict[str, Any], strategy: str, metric: str) -> float:
    """Median over the probes after warm-up of a strategy's latency over the compacted copy's."""
    mine = after_warm_up(results["strategies"][strategy]["series"], metric)
    reference = after_warm_up(results["strategies"][REFERENCE]["series"], metric)
    return statistics.median(m / r for m, r in zip(mine, reference, strict=True))


def summary(results: dict[str, Any]) -> str:
    rows = []
    for strategy in STRATEGIES:
        m = results["strategies"][strategy]
        settled = m["settle_to_compacted"]
        last = m["series"][-1]
        rows.append([
            strategy, *(f"{latency_ratio(results, strategy, k):.2f}x" for k in ("count_ms", "aggregate_ms", "lookup_ms")),
            last["data_files"], last["equality_delete_files"], last["position_delete_files"],
            f"{m['rewritten_bytes'] / 1e6:.1f}", f"{m['write_amplification']:.2f}",
            m["compaction_commits"], m["maintenance"]["conflicts"],
            f"{m['writer_commit_p50'] * 1000:.0f}", len(m["writer_failures"]),
            f"{settled['compacted']}/{settled['settled_partitions']}",
            "-" if settled["median_seconds"] is None else f"{settled['median_seconds']:.0f}",
            m["settled_partitions_with_equality_deletes"],
        ])
    reference = results["strategies"][REFERENCE]["series"][-1]
    ingested = results["strategies"]["none"]["ingested_bytes"]
    return (
        f"{results['batches']} micro-batches, one every {results['batch_seconds']:g}s, then {results['drain_seconds']:g}s "
        f"of drain; {results['workload']['keys']:,} starting keys; probes every {results['probe_seconds']:g}s; cron every "
        f"{results['cron_seconds']:g}s; {results['machine']}. Bytes ingested per table: {ingested / 1e6:.1f} MB. "
        f"Latency columns: median over the probes of the second half of the run of each query's latency over the "
        f"compacted copy's (final copy: {reference['count_ms']:.0f} ms count, {reference['aggregate_ms']:.0f} ms "
        f"aggregation, {reference['lookup_ms']:.0f} ms lookup, {reference['data_files']} files).\n\n"
        + markdown_table(["strategy", "count vs compacted", "aggregation vs compacted", "lookup vs compacted",
                          "data files at end", "eq-delete files at end", "pos-delete files at end",
                          "MB rewritten", "write amplification", "compaction commits", "conflicts",
                          "writer commit p50 ms", "writer failures", "settled partitions compacted",
                          "last write to compacted, median s", "settled partitions with eq deletes"], rows) + "\n")


def plot(results: dict[str, Any], path: Path) -> None:
    """``path``: every metric on one page; beside it one PNG per metric (``e2e-<metric>.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def draw(ax: Any, metric: str) -> None:
        for strategy, data in results["strategies"].items():
            series = data["series"]
            ax.plot([p["t"] for p in series], [p[metric] for p in series], marker=".", label=strategy,
                    linestyle="--" if strategy == REFERENCE else "-")
        ax.set_title(TITLES[metric], fontsize=9)
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.grid(alpha=0.3)

    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
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
    for strategy in STRATEGIES:
        points = results["strategies"][strategy]["commit_seconds"]
        ax.plot([t for t, _ in points], [s * 1000 for _, s in points], marker=".", linestyle="", label=strategy)
    ax.set_title("writer commit latency (ms)", fontsize=9)
    ax.set_xlabel("seconds into the run", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path.with_name("e2e-writer_commit_ms.png"), dpi=100)
    plt.close(fig)
