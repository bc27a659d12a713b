"""``icecdc bench ingest``: the same CDC batches applied to the same starting table two ways,
icecdc's writer (equality deletes, cost of the batch) and Spark's ``MERGE INTO`` in
merge-on-read mode (must read the target to find the rows it replaces), at growing table sizes.

The starting rows are a pure function of their id, generated inside Spark for both tables; the
change batches (70% updates, 20% inserts, 10% deletes by default, updates moving rows between
partitions) are generated once and fed to both. At the end the two tables must hold the same
rows, so the faster path is also shown to be right.
"""

from __future__ import annotations

import datetime as dt
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from icecdc import kafka
from icecdc.bench.report import line_plot, machine, markdown_table, publish
from icecdc.broker import EmbeddedBroker, free_port
from icecdc.catalog import ensure_tables
from icecdc.config import Config, TableConfig, embedded_config
from icecdc.workload import ORDERS_PARTITIONING, ORDERS_SCHEMA, REGIONS, STATUSES

DAY_MICROS = 86_400_000_000
START_MICROS = int((dt.datetime(2025, 1, 1) - dt.datetime(1970, 1, 1)).total_seconds()) * 1_000_000
DAYS = 3
MERGE_PROPERTIES = {"write.merge.mode": "merge-on-read", "write.update.mode": "merge-on-read", "write.delete.mode": "merge-on-read"}


def base_row(key: int) -> dict[str, Any]:
    """Row ``key`` of the starting table; ``BASE_SQL`` computes the same in Spark."""
    return {
        "id": key, "region": REGIONS[key % 4], "status": STATUSES[(key // 4) % 4],
        "amount": f"{(key * 7919) % 1_000_000 // 100}.{(key * 7919) % 100:02d}",
        "updated_at": START_MICROS + (key % DAYS) * DAY_MICROS + (key * 13 % 86_400) * 1_000_000,
    }


BASE_SQL = f"""
SELECT id,
       element_at(array({', '.join(repr(r) for r in REGIONS)}), CAST(id % 4 AS INT) + 1) AS region,
       element_at(array({', '.join(repr(s) for s in STATUSES)}), CAST((id DIV 4) % 4 AS INT) + 1) AS status,
       CAST(((id * 7919) % 1000000) / 100 AS DECIMAL(12, 2)) AS amount,
       CAST(timestamp_micros({START_MICROS} + (id % {DAYS}) * {DAY_MICROS} + ((id * 13) % 86400) * 1000000) AS TIMESTAMP_NTZ) AS updated_at
FROM range(1, {{rows}} + 1)
"""


@dataclass
class ChangingTable:
    """The source table behind the CDC stream: ``rows`` base rows plus what changed since."""

    rows: int
    seed: int = 11
    changed: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # None: deleted

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._next = self.rows + 1

    def current(self, key: int) -> dict[str, Any] | None:
        return self.changed[key] if key in self.changed else (base_row(key) if key <= self.rows else None)

    def _existing_key(self) -> int:
        while True:
            key = self._random.randrange(1, self._next)
            if self.current(key) is not None:
                return key

    def _new_values(self, key: int) -> dict[str, Any]:
        r = self._random
        return {"id": key, "region": r.choice(REGIONS), "status": r.choice(STATUSES),
                "amount": f"{r.randrange(100, 100_000)}.{r.randrange(100):02d}",
                "updated_at": START_MICROS + r.randrange(DAYS) * DAY_MICROS + r.randrange(86_400) * 1_000_000}

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
            out.append((op, key, after, orjson.dumps({"op": op, "before": before, "after": after})))
        return out


def _merge_source(spark: Any, changes: list[tuple[str, int, dict[str, Any] | None, bytes]]) -> Any:
    """The batch as MERGE needs it: the last change per key (the same dedupe icecdc does)."""
    from decimal import Decimal

    last: dict[int, tuple[str, dict[str, Any] | None]] = {}
    for op, key, after, _ in changes:
        last[key] = (op, after)
    epoch = dt.datetime(1970, 1, 1)
    rows = [
        (key, op, a and a["region"], a and a["status"], a and Decimal(a["amount"]),
         a and epoch + dt.timedelta(microseconds=a["updated_at"]))
        for key, (op, a) in last.items()
    ]
    return spark.createDataFrame(rows, "id long, op string, region string, status string, amount decimal(12,2), updated_at timestamp_ntz")


MERGE_SQL = """
MERGE INTO {target} t USING {source} s ON t.id = s.id
WHEN MATCHED AND s.op = 'd' THEN DELETE
WHEN MATCHED THEN UPDATE SET region = s.region, status = s.status, amount = s.amount, updated_at = s.updated_at
WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT (id, region, status, amount, updated_at)
  VALUES (s.id, s.region, s.status, s.amount, s.updated_at)
"""


def _progress(message: str) -> None:
    print(f"[bench ingest] {message}", flush=True)


def run(sizes: list[int], changes: int, batches: int, out: Path, state_dir: Path,
        updates: float = 0.7, inserts: float = 0.2) -> dict[str, Any]:
    from icecdc.ingest.publish import CommitEventPublisher
    from icecdc.ingest.sources import records_to_dataframe, source_rows
    from icecdc.ingest.writer import BatchWriter
    from icecdc.spark import create_spark_session

    port = free_port()
    broker = EmbeddedBroker(state_dir / "broker", port)
    broker.start()
    results: dict[str, Any] = {"machine": machine(), "changes_per_batch": changes, "batches": batches,
                               "mix": {"updates": updates, "inserts": inserts, "deletes": round(1 - updates - inserts, 3)},
                               "sizes": []}
    try:
        base = embedded_config(state_dir, port, spark={"conf": {"spark.driver.memory": "6g"}})
        spark = create_spark_session(base, "icecdc-bench-ingest")
        run_id = int(time.time())
        for rows in sizes:
            icecdc_name, merge_name = f"bench.icecdc_{rows}_{run_id}", f"bench.merge_{rows}_{run_id}"
            topic = f"bench-{rows}-{run_id}"
            tables = [TableConfig.model_validate({"name": n, "topic": topic if n == icecdc_name else f"{topic}-merge",
                                                  "primary_key": ["id"], "partition_by": ORDERS_PARTITIONING,
                                                  "schema": ORDERS_SCHEMA, "properties": MERGE_PROPERTIES if n == merge_name else {}})
                      for n in (icecdc_name, merge_name)]
            config: Config = base.model_copy(update={"tables": tables[:1]})
            ensure_tables(spark, base.model_copy(update={"tables": tables}))
            _progress(f"{rows:,} rows: loading both starting tables")
            for name in (icecdc_name, merge_name):
                spark.sql(f"INSERT INTO lake.{name} {BASE_SQL.format(rows=rows)}")
            kafka.ensure_topics(config.kafka, [config.commit_topic, config.dead_letter_topic])
            producer = kafka.producer(config.kafka)
            writer = BatchWriter(spark, config, producer, CommitEventPublisher(producer, config.commit_topic), "bench")
            source = ChangingTable(rows)
            timings: dict[str, list[float]] = {"icecdc": [], "merge": []}
            offset = 0
            for number in range(batches + 1):  # batch 0 warms both paths up and is not counted
                batch = source.batch(changes, updates, inserts)
                records = source_rows(topic, [(orjson.dumps({"id": k}), v) for _, k, _, v in batch], offset)
                offset += len(records)
                # Both paths are timed from a ready source DataFrame (as foreachBatch receives one,
                # and as MERGE's source view is built before its timer starts).
                frame = records_to_dataframe(spark, records)
                started = time.perf_counter()
                writer(frame, number)
                icecdc_seconds = time.perf_counter() - started
                _merge_source(spark, batch).createOrReplaceTempView("bench_changes")
                started = time.perf_counter()
                spark.sql(MERGE_SQL.format(target=f"lake.{merge_name}", source="bench_changes"))
                merge_seconds = time.perf_counter() - started
                if number:
                    timings["icecdc"].append(icecdc_seconds)
                    timings["merge"].append(merge_seconds)
                _progress(f"{rows:,} rows, batch {number}{' (warm-up)' if not number else ''}: "
                          f"icecdc {icecdc_seconds:.2f}s, MERGE {merge_seconds:.2f}s")
            a, b = f"lake.{icecdc_name}", f"lake.{merge_name}"
            differing = spark.sql(f"SELECT count(*) AS n FROM ((SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}) "
                                  f"UNION ALL (SELECT * FROM {b} EXCEPT ALL SELECT * FROM {a}))").collect()[0].n
            count = spark.table(a).count()
            if differing:
                raise RuntimeError(f"{rows:,} rows: the icecdc and MERGE tables differ in {differing} rows")
            medians = {k: statistics.median(v) for k, v in timings.items()}
            results["sizes"].append({"rows": rows, "final_rows": count, "seconds": timings, "median_seconds": medians,
                                     "merge_over_icecdc": medians["merge"] / medians["icecdc"]})
            _progress(f"{rows:,} rows: tables agree ({count:,} rows); medians icecdc {medians['icecdc']:.2f}s, "
                      f"MERGE {medians['merge']:.2f}s, ratio {medians['merge'] / medians['icecdc']:.1f}x")
            for name in (icecdc_name, merge_name):
                spark.sql(f"DROP TABLE lake.{name} PURGE")
    finally:
        broker.stop()
    publish(out, "ingest", results, _plot, summary)
    return results


def summary(results: dict[str, Any]) -> str:
    rows = [[f"{s['rows']:,}", f"{s['median_seconds']['icecdc']:.2f}", f"{s['median_seconds']['merge']:.2f}",
             f"{s['merge_over_icecdc']:.1f}x"] for s in results["sizes"]]
    mix = results["mix"]
    return (f"{results['changes_per_batch']:,} changes per batch ({mix['updates']:.0%} updates, {mix['inserts']:.0%} inserts, "
            f"{mix['deletes']:.0%} deletes), median of {results['batches']} batches after one warm-up; {results['machine']}.\n\n"
            + markdown_table(["starting rows", "icecdc s/batch", "MERGE INTO (merge-on-read) s/batch", "MERGE / icecdc"], rows) + "\n")


def _plot(results: dict[str, Any], path: Path) -> None:
    sizes = results["sizes"]
    line_plot(path, [s["rows"] / 1e6 for s in sizes],
              {label: [s["median_seconds"][key] for s in sizes]
               for label, key in (("icecdc (equality deletes)", "icecdc"), ("MERGE INTO, merge-on-read", "merge"))},
              "starting table size (million rows)",
              f"seconds per batch of {results['changes_per_batch']:,} changes (median)")
