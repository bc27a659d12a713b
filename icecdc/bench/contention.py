"""``icecdc bench contention``: what a compactor does to the writer it runs beside.

The same CDC batches are written at a fixed cadence to three tables, one run after the other, by
a writer in this process: with no compactor, with a naive compactor (commits whenever a
compaction is ready, no quiet windows, no retry of its own) and with the coordinated compactor
(icecdc's defaults). The compactor runs as its own process, as deployed. The workload moves to a
new day every few batches, so yesterday's partitions take late changes for a while and then
settle: the compactor works while the writer writes. Measured: the writer's commit latency
(p50/p99), failures and retries, and the compactor's commit attempts and conflicts (an attempt
that lost the catalog's compare-and-set or failed validation), scraped from the compactor's own
metrics endpoint. At the end the three tables must hold the same rows as the workload's state.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from icecdc import kafka
from icecdc.bench.report import machine, markdown_table, publish
from icecdc.broker import EmbeddedBroker, free_port
from icecdc.catalog import ensure_tables
from icecdc.config import Config, embedded_config
from icecdc.workload import OrdersWorkload, orders_table

MODES = ("none", "naive", "coordinated")
# Measured in this order: the writer's JVM keeps warming up through the run, so the baseline goes
# last and the coordinated compactor first (the comparison that matters errs against icecdc).
RUN_ORDER = ("coordinated", "naive", "none")
# Naive: commit the moment a compaction is ready, once (Iceberg's own quick retries only).
NAIVE = {"quiet_windows": False, "commit_attempts": 1}
COMPACTOR = {
    "min_small_files": 4, "reconcile_seconds": 10,
    "settle": {"cadence_multiple": 3, "min_seconds": 2, "initial_seconds": 4, "max_seconds": 8},
}
BATCHES_PER_DAY = 6


def _progress(message: str) -> None:
    print(f"[bench contention] {message}", flush=True)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def workload_batches(batches: int, changes: int, seed: int = 5) -> tuple[list[list[tuple[bytes, bytes]]], OrdersWorkload]:
    """The initial load and ``batches`` change batches, and the state they leave behind."""
    workload = OrdersWorkload(seed=seed, today=0, recent_keys=changes * 3)
    out = [[c.record for c in workload.load(changes * 2)]]
    for number in range(1, batches + 1):
        workload.today = number // BATCHES_PER_DAY
        out.append([c.record for c in workload.changes(changes)])
    return out, workload


def _mode_config(base: Config, mode: str, run_id: int) -> Config:
    name = f"bench.contention_{mode}_{run_id}"
    data = base.model_dump(by_alias=True)
    data.update({
        "tables": [orders_table(name, f"contention-{mode}-{run_id}")],
        "commit_topic": f"contention-commits-{mode}-{run_id}",
        "compaction_topic": f"contention-compactions-{mode}-{run_id}",
        "maintenance_topic": f"contention-maintenance-{mode}-{run_id}",
        "compactor": {**COMPACTOR, "consumer_group": f"contention-{mode}-{run_id}", "http": {"port": None}},
        "coordinator": {"lease_topic": f"contention-leases-{run_id}", "maintenance": {"enabled": False},
                        **(NAIVE if mode == "naive" else {})},
    })
    return Config.model_validate(data)


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def start_compactor(config: Config, mode: str, out: Path) -> tuple[subprocess.Popen, int]:
    """``icecdc compact`` in its own process, as deployed (a sidecar container): it shares the
    machine's cores with the writer but not its JVM or its interpreter. Returns once it is ready."""
    port = free_port()
    data = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["compactor"]["http"] = {"host": "127.0.0.1", "port": port}
    path = out / f"compactor-{mode}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(data))  # JSON is YAML
    with (out / f"compactor-{mode}.log").open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "icecdc.cli", "compact", "--config", str(path)],
                                   stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not _ready(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the {mode} compactor did not become ready; see {out / f'compactor-{mode}.log'}")
        time.sleep(0.5)
    return process, port


def compactor_counts(port: int, table: str) -> dict[str, Any]:
    metrics = _scrape(port)

    def total(name: str, **labels: str) -> float:
        return sum(v for (n, ls), v in metrics.items()
                   if n == name and dict(ls).get("table") == table and all(dict(ls).get(k) == x for k, x in labels.items()))

    attempts = total("icecdc_compactor_commit_attempts_total")
    conflicts = total("icecdc_compactor_commit_conflicts_total")
    return {
        "compactions": int(total("icecdc_compactions_total", outcome="committed")),
        "compactions_not_committed": int(total("icecdc_compactions_total") - total("icecdc_compactions_total", outcome="committed")),
        "commit_attempts": int(attempts), "commit_conflicts": int(conflicts),
        "commit_retries": int(total("icecdc_compactor_commit_retries_total")),
        "gave_up": int(total("icecdc_compactor_commit_gave_up_total")),
        "conflict_rate": conflicts / attempts if attempts else 0.0,
        "quiet_wait_mean_seconds": (total("icecdc_compactor_quiet_wait_seconds_sum")
                                    / max(1.0, total("icecdc_compactor_quiet_wait_seconds_count"))),
    }


def run_mode(spark: Any, config: Config, mode: str, batches: list[list[tuple[bytes, bytes]]], interval: float,
             out: Path) -> dict[str, Any]:
    """Write every batch at ``interval`` seconds, with the mode's compactor running beside."""
    from icecdc.ingest.publish import CommitEventPublisher
    from icecdc.ingest.sources import records_to_dataframe, source_rows
    from icecdc.ingest.writer import BatchWriter

    table = config.tables[0]
    ensure_tables(spark, config)
    kafka.ensure_topics(config.kafka, [config.commit_topic, config.dead_letter_topic])
    producer = kafka.producer(config.kafka)
    writer = BatchWriter(spark, config, producer, CommitEventPublisher(producer, config.commit_topic), "bench")
    writer(records_to_dataframe(spark, source_rows(table.topic, batches[0], 0)), 0)  # the initial load
    offset = len(batches[0])
    compactor, port = start_compactor(config, mode, out) if mode != "none" else (None, 0)
    latencies: list[float] = []
    failures: list[str] = []
    interleaved = 0
    counts: dict[str, Any] = {}
    started = time.monotonic()
    try:
        for number, pairs in enumerate(batches[1:], 1):
            frame = records_to_dataframe(spark, source_rows(table.topic, pairs, offset))
            offset += len(pairs)
            time.sleep(max(0.0, started + number * interval - time.monotonic()))
            before = writer.stats.interleaved_commits
            try:
                writer(frame, number)
                latencies.append(writer.stats.last_commit_seconds)
                interleaved += writer.stats.interleaved_commits - before
            except Exception as exc:  # noqa: BLE001 - a writer failure is what this measures
                failures.append(f"batch {number}: {type(exc).__name__}: {str(exc)[:300]}")
            if number % 10 == 0 or number == len(batches) - 1:
                _progress(f"{mode}: batch {number}/{len(batches) - 1}, writer commit p50 "
                          f"{statistics.median(latencies):.3f}s, failures {len(failures)}")
        if compactor is not None:
            counts = compactor_counts(port, table.name)
    finally:
        if compactor is not None:
            compactor.terminate()
            compactor.wait(120)
    return {
        "commit_seconds": latencies, "writer_failures": failures, "writer_commits_interleaved": interleaved,
        "p50": statistics.median(latencies), "p99": percentile(latencies, 0.99), **counts,
    }


def run(batches: int, changes: int, interval: float, out: Path, state_dir: Path) -> dict[str, Any]:
    from icecdc.spark import create_spark_session

    port = free_port()
    broker = EmbeddedBroker(state_dir / "broker", port)
    broker.start()
    data, workload = workload_batches(batches, changes)
    results: dict[str, Any] = {"machine": machine(), "batches": batches, "changes_per_batch": changes,
                               "interval_seconds": interval, "modes": {}}
    try:
        base = embedded_config(state_dir, port)
        spark = create_spark_session(base, "icecdc-bench-contention")
        run_id = int(time.time())
        # JIT and caches warm on a scratch table first, or the first mode measured pays for them.
        warm = _mode_config(base, "none", run_id - 1)
        _progress("warming up")
        run_mode(spark, warm, "none", data[:6], interval, out)
        spark.sql(f"DROP TABLE lake.{warm.tables[0].name} PURGE")
        names = {}
        for mode in RUN_ORDER:
            config = _mode_config(base, mode, run_id)
            names[mode] = f"lake.{config.tables[0].name}"
            _progress(f"{mode}: {batches} batches of {changes:,} changes, one every {interval:g}s")
            results["modes"][mode] = run_mode(spark, config, mode, data, interval, out)
        expected = workload.expected_rows()
        for mode, name in names.items():
            spark.sql(f"REFRESH TABLE {name}")
            rows = sorted(tuple(r) for r in spark.table(name).select("id", "region", "status", "amount", "updated_at").collect())
            results["modes"][mode]["rows_match"] = rows == expected
            if rows != expected:
                raise RuntimeError(f"{mode}: the table does not hold the workload's final state")
        _progress(f"all three tables hold the workload's final state ({len(expected):,} rows)")
        for name in names.values():
            spark.sql(f"DROP TABLE {name} PURGE")
    finally:
        broker.stop()
    publish(out, "contention", results, _plot, summary)
    return results


def summary(results: dict[str, Any]) -> str:
    modes = results["modes"]
    baseline = modes["none"]["p99"]
    rows = []
    for mode in MODES:
        m = modes[mode]
        rows.append([
            mode, f"{m['p50'] * 1000:.0f}", f"{m['p99'] * 1000:.0f}", f"{m['p99'] / baseline:.2f}x",
            len(m["writer_failures"]), m["writer_commits_interleaved"],
            m.get("compactions", "-"),
            f"{m['commit_conflicts']}/{m['commit_attempts']} ({m['conflict_rate']:.1%})" if "commit_attempts" in m else "-",
        ])
    return (f"{results['batches']} batches of {results['changes_per_batch']:,} changes, one every "
            f"{results['interval_seconds']:g}s, per mode; {results['machine']}.\n\n"
            + markdown_table(["compactor", "writer commit p50 ms", "p99 ms", "p99 vs none", "writer failures",
                              "writer commits retried", "compactions", "compactor conflicts / attempts"], rows) + "\n")


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in MODES:
        latencies = sorted(results["modes"][mode]["commit_seconds"])
        ax.plot([v * 1000 for v in latencies], [(i + 1) / len(latencies) for i in range(len(latencies))], label=mode)
    ax.set_xlabel("writer commit latency (ms)")
    ax.set_ylabel("share of commits at or below")
    ax.set_title("Writer commit latency by compactor mode")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
