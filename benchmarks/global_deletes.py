"""``python -m benchmarks global-deletes``: what unresolved global equality deletes (key-only
before-images) cost readers, against the same rows resolved, and what resolving them costs the
compactor (docs/BENCHMARKS.md, row "Global deletes").
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from icecdc.bench import out_argument, print_results
from icecdc.bench.harness import FeedWriter, bench_stack, clone, progress
from icecdc.bench.report import machine, markdown_table, publish, pyplot
from icecdc.options import state_dir_argument
from icecdc.runtime.config import Config
from icecdc.workload import OrdersWorkload, orders_table

say = progress("global-deletes")
QUERIES = ("count", "aggregate", "lookup")


def key_only(record: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
    """The record as PostgreSQL's REPLICA IDENTITY DEFAULT sends it through Debezium: updates
    without a before-image, deletes whose before-image has the key and fallback values."""
    key, value = record
    event = orjson.loads(value)
    if event["op"] == "u":
        event["before"] = None
    elif event["op"] == "d":
        event["before"] = {"id": event["before"]["id"], "region": "", "status": "", "amount": None, "updated_at": 0}
    return key, orjson.dumps(event)


@dataclass(frozen=True)
class Resolution:
    seconds: float
    global_delete_files: int
    data_files_examined: int  # a global delete applied to them
    data_files_read: int  # their key bounds admitted a deleted key: their key column was read
    position_delete_files_added: int  # they held a deleted key


@dataclass
class GlobalDeleteResults:
    machine: str
    rows: int
    changes: int
    batches: int
    repeats: int
    lookups: int
    data_files: int = 0
    # query -> latencies (ms), on the snapshot with the global deletes and on the resolved one
    unresolved_ms: dict[str, list[float]] = field(default_factory=dict)
    resolved_ms: dict[str, list[float]] = field(default_factory=dict)
    all_at_once: Resolution | None = None  # the first ``batches`` batches, resolved in one commit
    per_batch: list[Resolution] = field(default_factory=list)  # each later batch, resolved as it came

    def ratio(self, query: str) -> float:
        return statistics.median(self.unresolved_ms[query]) / statistics.median(self.resolved_ms[query])


def _ms(spark: Any, query: str) -> float:
    started = time.perf_counter()
    spark.sql(query).collect()
    return (time.perf_counter() - started) * 1000


def _resolve(spark: Any, config: Config) -> Resolution:
    from icecdc.compactor.metadata import load_table_partitions
    from icecdc.compactor.plans import plan_resolution
    from icecdc.compactor.rewrite import PartitionCompaction
    from icecdc.jvm.bridge import JavaBridge
    from icecdc.jvm.tables import IcebergTable
    from icecdc.runtime.catalog import pyiceberg_catalog

    table = config.tables[0]
    ref = config.table_ref(table)
    started = time.perf_counter()
    loaded = load_table_partitions(pyiceberg_catalog(config), ref, table, config.compactor)
    if loaded is None:
        raise RuntimeError(f"{ref} does not exist")
    compaction = PartitionCompaction(
        spark, IcebergTable(JavaBridge(spark), ref), loaded.layout, None, config.catalog.properties, 128 * 1024 * 1024
    )
    files = compaction.files()
    if files is None:
        raise RuntimeError(f"{ref} has no snapshot")
    plan = plan_resolution(files)
    result = compaction.run(plan, {"icecdc.compactor": "bench"})
    if result.committed is None:
        raise RuntimeError("the resolution committed nothing")
    return Resolution(
        time.perf_counter() - started,
        sum(1 for d in files.deletes if d.is_equality),
        len(plan.examined),
        len(plan.convert),
        result.counts.position_delete_files_added,
    )


def run(rows: int, changes: int, batches: int, repeats: int, lookups: int, out: Path, state_dir: Path) -> GlobalDeleteResults:
    results = GlobalDeleteResults(machine(), rows, changes, batches, repeats, lookups)
    with bench_stack("global-deletes", state_dir) as stack:
        spark = stack.spark
        spark.conf.set("spark.sql.iceberg.aggregate-push-down.enabled", "false")  # counts read the rows
        spec = orders_table(f"bench.global_{stack.run_id}", f"global-{stack.run_id}")
        del spec["before_image"]  # the default: the key only
        config = clone(stack.config, tables=[spec], commit_topic=f"global-commits-{stack.run_id}")
        name = config.table_ref(config.tables[0]).qualified
        feed = FeedWriter(spark, config, "bench-global")
        orders = OrdersWorkload(seed=11, days=8, recent_keys=0)
        try:
            say(f"loading {rows:,} rows")
            load = [c.record for c in orders.load(rows)]
            for start in range(0, len(load), 200_000):
                feed.write(load[start : start + 200_000], start)
            batch_id = len(load)

            def write_batch() -> None:
                nonlocal batch_id
                batch_id += 1
                feed.write([key_only(c.record) for c in orders.changes(changes, updates=0.8, inserts=0.0)], batch_id)

            for number in range(1, batches + 1):
                write_batch()
                say(f"batch {number}/{batches}: {changes:,} key-only updates and deletes")
            unresolved = _snapshot(spark, name)
            results.all_at_once = _resolve(spark, config)
            resolved = _snapshot(spark, name)
            say(f"resolved {batches} batches' global deletes in one commit in {results.all_at_once.seconds:.1f}s")
            results.data_files = int(spark.sql(f"SELECT count(*) FROM {name}.data_files").collect()[0][0])
            _compare(spark, name, unresolved, resolved, sorted(orders.rows), results)
            for number in range(1, batches + 1):
                write_batch()
                results.per_batch.append(_resolve(spark, config))
                say(f"batch {number}/{batches} resolved in {results.per_batch[-1].seconds:.2f}s")
            expected = orders.expected_rows()
            spark.sql(f"REFRESH TABLE {name}")
            found = sorted(tuple(r) for r in spark.table(name).select("id", "region", "status", "amount", "updated_at").collect())
            if found != expected:
                raise RuntimeError("the table does not hold the stream's final state")
        finally:
            feed.close()
            spark.sql(f"DROP TABLE IF EXISTS {name} PURGE")
    publish(out, "global-deletes", results, _plot, summary)
    return results


def _snapshot(spark: Any, name: str) -> int:
    spark.sql(f"REFRESH TABLE {name}")
    return int(spark.sql(f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").first()[0])


def _compare(spark: Any, name: str, unresolved: int, resolved: int, keys: Sequence[int], results: GlobalDeleteResults) -> None:
    """Each query on both snapshots in turn, after a warm-up of each."""
    at = {"unresolved": unresolved, "resolved": resolved}
    queries = {
        "count": ["SELECT count(*) FROM {t}"] * results.repeats,
        "aggregate": ["SELECT region, status, count(*), sum(amount) FROM {t} GROUP BY region, status"] * results.repeats,
        "lookup": [f"SELECT * FROM {{t}} WHERE id = {k}" for k in random.Random(3).sample(list(keys), results.lookups)],
    }
    for snapshot in at.values():
        for runs in queries.values():
            _ms(spark, runs[0].format(t=f"{name} VERSION AS OF {snapshot}"))
    timings: dict[str, dict[str, list[float]]] = {state: {q: [] for q in QUERIES} for state in at}
    for query, runs in queries.items():
        for text in runs:
            for state, snapshot in at.items():
                timings[state][query].append(_ms(spark, text.format(t=f"{name} VERSION AS OF {snapshot}")))
    results.unresolved_ms, results.resolved_ms = timings["unresolved"], timings["resolved"]
    say(", ".join(f"{q} {results.ratio(q):.2f}x" for q in QUERIES) + " (unresolved over resolved)")


def summary(results: GlobalDeleteResults) -> str:
    rows = [
        [
            q,
            f"{statistics.median(results.unresolved_ms[q]):.0f}",
            f"{statistics.median(results.resolved_ms[q]):.0f}",
            f"{results.ratio(q):.2f}x",
        ]
        for q in QUERIES
    ]
    once = results.all_at_once
    per = results.per_batch
    seconds = [r.seconds for r in per]
    text = (
        f"{results.rows:,} rows in {results.data_files} data files (region and day partitions); {results.batches} batches of "
        f"{results.changes:,} key-only updates and deletes; medians of {results.repeats} counts and aggregations and "
        f"{results.lookups} point lookups on each snapshot, alternating; {results.machine}.\n\n"
        + markdown_table(["query", "unresolved ms", "resolved ms", "unresolved / resolved"], rows)
        + "\n"
    )
    if once is not None:
        text += (
            f"\nResolving {once.global_delete_files} global delete files at once: {once.seconds:.1f} s "
            f"({once.data_files_examined} data files examined, {once.data_files_read} read, {once.position_delete_files_added} given position deletes).\n"
        )
    if per:
        text += (
            f"Resolving each batch as it came: median {statistics.median(seconds):.2f} s a batch "
            f"(from {min(seconds):.2f} to {max(seconds):.2f} s over {len(per)} batches; median "
            f"{statistics.median(r.position_delete_files_added for r in per):.0f} data files given position deletes each).\n"
        )
    return text


def _plot(results: GlobalDeleteResults, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = range(len(QUERIES))
    left.bar([i - 0.2 for i in x], [statistics.median(results.unresolved_ms[q]) for q in QUERIES], 0.4, label="unresolved")
    left.bar([i + 0.2 for i in x], [statistics.median(results.resolved_ms[q]) for q in QUERIES], 0.4, label="resolved")
    left.set_xticks(list(x), QUERIES)
    left.set_ylabel("median ms")
    left.legend()
    left.set_title("reads with global deletes, and resolved", fontsize=9)
    right.plot(range(1, len(results.per_batch) + 1), [r.seconds for r in results.per_batch], marker="o")
    right.set_xlabel("batch")
    right.set_ylabel("seconds to resolve")
    right.set_ylim(bottom=0)
    right.set_title("resolving each batch's global deletes", fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- python -m benchmarks global-deletes ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser)
    parser.add_argument("--rows", type=int, default=200_000, help="rows loaded first (default: 200000)")
    parser.add_argument("--changes", type=int, default=2_000, help="key-only updates and deletes a batch (default: 2000)")
    parser.add_argument("--batches", type=int, default=5, help="batches before the first resolution, and after (default: 5)")
    parser.add_argument("--repeats", type=int, default=7, help="counts and aggregations on each snapshot (default: 7)")
    parser.add_argument("--lookups", type=int, default=50, help="point lookups on each snapshot (default: 50)")
    out_argument(parser)


def main(args: argparse.Namespace) -> int:
    results = run(args.rows, args.changes, args.batches, args.repeats, args.lookups, args.out, args.state_dir.resolve())
    print_results(args.out, "global-deletes", summary(results))
    return 0
