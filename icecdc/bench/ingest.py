"""``icecdc bench ingest``: the same CDC batches applied to the same starting table by icecdc's
writer (equality deletes; in the driver and on Spark) and by Spark's ``MERGE INTO`` in
merge-on-read mode, at growing table sizes. The two tables must end with the same rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from icecdc.bench import out_argument, positive_integers, print_results
from icecdc.bench.harness import FeedWriter, bench_stack, clone, differing_rows, progress
from icecdc.bench.report import machine, markdown_table, publish, pyplot, save
from icecdc.options import state_dir_argument
from icecdc.runtime.catalog import ensure_tables
from icecdc.workload import REGIONS, STATUSES, orders_table

DAY_MICROS = 86_400_000_000
START_MICROS = int((dt.datetime(2025, 1, 1) - dt.datetime(1970, 1, 1)).total_seconds()) * 1_000_000
DAYS = 3
MERGE_PROPERTIES = {f"write.{op}.mode": "merge-on-read" for op in ("merge", "update", "delete")}
say = progress("ingest")
SOURCE_BLOCK = {"connector": "postgresql", "name": "bench", "db": "bench", "schema": "public", "table": "orders"}


@dataclass(frozen=True)
class Mix:
    updates: float
    inserts: float
    deletes: float


@dataclass(frozen=True)
class SizeResult:
    rows: int
    final_rows: int
    driver_seconds: list[float]  # icecdc, the batch's job in the driver
    spark_seconds: list[float]  # icecdc, the batch's job on Spark
    merge_seconds: list[float]

    @property
    def medians(self) -> tuple[float, float, float]:
        """The median seconds of icecdc in the driver, icecdc on Spark and MERGE."""
        driver, on_spark, merge = (statistics.median(s) for s in (self.driver_seconds, self.spark_seconds, self.merge_seconds))
        return driver, on_spark, merge


@dataclass(frozen=True)
class IngestResults:
    machine: str
    changes_per_batch: int
    batches: int
    mix: Mix
    sizes: list[SizeResult]


def base_row(key: int, days: int = DAYS, regions: int = len(REGIONS)) -> dict[str, Any]:
    """Row ``key`` of the starting table; ``base_sql`` computes the same in Spark."""
    return {
        "id": key,
        "region": REGIONS[key % regions],
        "status": STATUSES[(key // 4) % 4],
        "amount": f"{(key * 7919) % 1_000_000 // 100}.{(key * 7919) % 100:02d}",
        "updated_at": START_MICROS + (key % days) * DAY_MICROS + (key * 13 % 86_400) * 1_000_000,
    }


def base_sql(last: int, days: int = DAYS, first: int = 1, regions: int = len(REGIONS)) -> str:
    """A SELECT of the starting rows ``first`` to ``last``, as ``base_row`` makes them."""
    names = ", ".join(repr(r) for r in REGIONS)
    statuses = ", ".join(repr(s) for s in STATUSES)
    return f"""
SELECT id,
       element_at(array({names}), CAST(id % {regions} AS INT) + 1) AS region,
       element_at(array({statuses}), CAST((id DIV 4) % 4 AS INT) + 1) AS status,
       CAST(((id * 7919) % 1000000) / 100 AS DECIMAL(12, 2)) AS amount,
       CAST(timestamp_micros({START_MICROS} + (id % {days}) * {DAY_MICROS} + ((id * 13) % 86400) * 1000000) AS TIMESTAMP_NTZ)
         AS updated_at
FROM range({first}, {last} + 1)
"""


@dataclass
class ChangingTable:
    """The source table behind the CDC stream: ``rows`` base rows plus what changed since."""

    rows: int
    seed: int = 11
    days: int = DAYS  # the days the rows' timestamps spread over (one partition each per region)
    regions: int = len(REGIONS)  # the regions the starting rows spread over (updates move rows to any)
    changed: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # None: deleted

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._next = self.rows + 1

    def current(self, key: int) -> dict[str, Any] | None:
        return (
            self.changed[key] if key in self.changed else (base_row(key, self.days, self.regions) if key <= self.rows else None)
        )

    def _existing_key(self) -> int:
        while True:
            key = self._random.randrange(1, self._next)
            if self.current(key) is not None:
                return key

    def _new_values(self, key: int) -> dict[str, Any]:
        r = self._random
        return {
            "id": key,
            "region": r.choice(REGIONS),
            "status": r.choice(STATUSES),
            "amount": f"{r.randrange(100, 100_000)}.{r.randrange(100):02d}",
            "updated_at": START_MICROS + r.randrange(self.days) * DAY_MICROS + r.randrange(86_400) * 1_000_000,
        }

    def batch(self, size: int, updates: float, inserts: float) -> list[tuple[str, int, dict[str, Any] | None, bytes]]:
        """(op, key, after, Debezium value) for ``size`` changes."""
        out = []
        for _ in range(size):
            draw = self._random.random()
            if draw < updates:
                key = self._existing_key()
                op, before, after = "u", self.current(key), self._new_values(key)
            elif draw < updates + inserts:
                key, self._next = self._next, self._next + 1
                op, before, after = "c", None, self._new_values(key)
            else:
                key = self._existing_key()
                op, before, after = "d", self.current(key), None
            self.changed[key] = after
            # The fast parse path takes only changes with ``source`` and ``ts_ms`` (ingest/fastparse.py).
            value = {"op": op, "before": before, "after": after, "source": SOURCE_BLOCK, "ts_ms": START_MICROS // 1000}
            out.append((op, key, after, orjson.dumps(value)))
        return out


def _merge_source(spark: Any, changes: list[tuple[str, int, dict[str, Any] | None, bytes]]) -> Any:
    """The batch as MERGE needs it: the last change per key (the same dedupe icecdc does)."""
    from decimal import Decimal

    last: dict[int, tuple[str, dict[str, Any] | None]] = {}
    for op, key, after, _ in changes:
        last[key] = (op, after)
    epoch = dt.datetime(1970, 1, 1)
    rows = [
        (
            key,
            op,
            a and a["region"],
            a and a["status"],
            a and Decimal(a["amount"]),
            a and epoch + dt.timedelta(microseconds=a["updated_at"]),
        )
        for key, (op, a) in last.items()
    ]
    return spark.createDataFrame(
        rows, "id long, op string, region string, status string, amount decimal(12,2), updated_at timestamp_ntz"
    )


MERGE_SQL = """
MERGE INTO {target} t USING {source} s ON t.id = s.id
WHEN MATCHED AND s.op = 'd' THEN DELETE
WHEN MATCHED THEN UPDATE SET region = s.region, status = s.status, amount = s.amount, updated_at = s.updated_at
WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT (id, region, status, amount, updated_at)
  VALUES (s.id, s.region, s.status, s.amount, s.updated_at)
"""


def _table(name: str, topic: str, merge: bool) -> dict[str, Any]:
    return {**orders_table(name, topic), "properties": MERGE_PROPERTIES if merge else {}}


def run(
    sizes: list[int], changes: int, batches: int, out: Path, state_dir: Path, updates: float = 0.7, inserts: float = 0.2
) -> IngestResults:
    results = IngestResults(machine(), changes, batches, Mix(updates, inserts, round(1 - updates - inserts, 3)), [])
    with bench_stack("ingest", state_dir, spark={"conf": {"spark.driver.memory": "6g"}}) as stack:
        spark = stack.spark
        for rows in sizes:
            topic = f"bench-{rows}-{stack.run_id}"
            icecdc_table = _table(f"bench.icecdc_{rows}_{stack.run_id}", topic, merge=False)
            merge_table = _table(f"bench.merge_{rows}_{stack.run_id}", f"{topic}-merge", merge=True)
            ensure_tables(spark, clone(stack.config, tables=[icecdc_table, merge_table]))
            config = clone(stack.config, tables=[icecdc_table])
            icecdc_name, merge_name = (stack.ref(t["name"]).qualified for t in (icecdc_table, merge_table))
            say(f"{rows:,} rows: loading both starting tables")
            for name in (icecdc_name, merge_name):
                spark.sql(f"INSERT INTO {name} {base_sql(rows)}")
            feed = FeedWriter(spark, config)
            source = ChangingTable(rows)
            timings: dict[str, list[float]] = {"driver": [], "spark": [], "merge": []}
            for number in range(2 * batches + 2):  # batches 0 and 1 warm every path up and are not counted
                batch = source.batch(changes, updates, inserts)
                job = "driver" if number % 2 == 0 else "spark"
                feed.writer.job.driver_batch_records = changes if job == "driver" else 0
                polled = feed.polled_by_topic({icecdc_table["topic"]: [(orjson.dumps({"id": k}), v) for _, k, _, v in batch]})
                if job == "spark":
                    polled.frame(feed.writer.prefixes)  # what foreachBatch receives, made before the timer
                started = time.perf_counter()
                result = feed.writer(polled, number)
                icecdc_seconds = time.perf_counter() - started
                if result.job_in_driver != (job == "driver"):
                    raise RuntimeError(
                        f"batch {number}: the job did not run {'in the driver' if job == 'driver' else 'on Spark'}"
                    )
                _merge_source(spark, batch).createOrReplaceTempView("bench_changes")
                started = time.perf_counter()
                spark.sql(MERGE_SQL.format(target=merge_name, source="bench_changes"))
                merge_seconds = time.perf_counter() - started
                if number > 1:
                    timings[job].append(icecdc_seconds)
                    timings["merge"].append(merge_seconds)
                say(
                    f"{rows:,} rows, batch {number}{' (warm-up)' if number < 2 else ''}: "
                    f"icecdc (job {job}) {icecdc_seconds:.2f}s, MERGE {merge_seconds:.2f}s"
                )
            feed.close()
            differing = differing_rows(spark.table(icecdc_name), spark.table(merge_name))
            count = spark.table(icecdc_name).count()
            if differing:
                raise RuntimeError(f"{rows:,} rows: the icecdc and MERGE tables differ in {differing} rows")
            size = SizeResult(rows, count, timings["driver"], timings["spark"], timings["merge"])
            results.sizes.append(size)
            driver, on_spark, merge = size.medians
            say(
                f"{rows:,} rows: tables agree ({count:,} rows); medians icecdc {driver:.2f}s (job in the driver), "
                f"{on_spark:.2f}s (on Spark), MERGE {merge:.2f}s; MERGE / icecdc {merge / driver:.1f}x and {merge / on_spark:.1f}x"
            )
            for name in (icecdc_name, merge_name):
                spark.sql(f"DROP TABLE {name} PURGE")
    publish(out, "ingest", results, _plot, summary)
    return results


def _spreads(s: SizeResult) -> list[str]:
    """Each way's median seconds and range."""
    ways = (s.driver_seconds, s.spark_seconds, s.merge_seconds)
    return [f"{m:.2f} ({min(v):.2f}-{max(v):.2f})" for m, v in zip(s.medians, ways, strict=True)]


def summary(results: IngestResults) -> str:
    rows = [
        [f"{s.rows:,}", *_spreads(s), f"{s.medians[2] / s.medians[0]:.1f}x", f"{s.medians[2] / s.medians[1]:.1f}x"]
        for s in results.sizes
    ]
    mix = results.mix
    return (
        f"{results.changes_per_batch:,} changes per batch ({mix.updates:.0%} updates, {mix.inserts:.0%} inserts, "
        f"{mix.deletes:.0%} deletes), median of {results.batches} batches after one warm-up; {results.machine}.\n\n"
        + markdown_table(
            (
                "starting rows | icecdc, job in the driver, s/batch | icecdc, job on Spark, s/batch | "
                "MERGE INTO (merge-on-read) s/batch | MERGE / icecdc in the driver | MERGE / icecdc on Spark"
            ),
            rows,
        )
        + "\n"
    )


def _plot(results: IngestResults, path: Path) -> None:
    """Every measured batch's seconds, by table size and way, with the medians joined."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [s.rows / 1e6 for s in results.sizes]
    ways = {
        "icecdc, job in the driver": lambda s: s.driver_seconds,
        "icecdc, job on Spark": lambda s: s.spark_seconds,
        "MERGE INTO, merge-on-read": lambda s: s.merge_seconds,
    }
    for label, seconds in ways.items():
        line = ax.plot(x, [statistics.median(seconds(s)) for s in results.sizes], marker="o", label=f"{label} (median)")
        for size in results.sizes:
            ax.scatter([size.rows / 1e6] * len(seconds(size)), seconds(size), s=10, alpha=0.5, color=line[0].get_color())
    ax.set_xlabel("starting table size (million rows)")
    ax.set_ylabel(f"seconds per batch of {results.changes_per_batch:,} changes")
    ax.set_ylim(bottom=0)
    save(plt, fig, path, ax)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="1000000,5000000", help="starting table sizes, comma-separated (default: 1M,5M)")
    parser.add_argument("--changes", type=int, default=10_000, help="changes per batch (default: 10000)")
    parser.add_argument(
        "--batches", type=int, default=5, help="measured batches per size and icecdc job, after one warm-up each (default: 5)"
    )
    out_argument(parser)
    state_dir_argument(parser, "catalog, warehouse and broker state", Path(".icecdc-bench"))


def main(args: argparse.Namespace) -> int:
    sizes = positive_integers(args.sizes, "--sizes")
    results = run(sizes, args.changes, args.batches, args.out, args.state_dir.resolve())
    print_results(args.out, "ingest", summary(results))
    return 0
