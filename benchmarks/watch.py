"""``python -m benchmarks watch``: what one poll of the kept tables' watcher costs
(``compactor.watcher``, ``compactor.watch_interval_seconds``): over N tables none of which
changed, and over N tables that each got one new snapshot. The tables are real Iceberg tables in
the embedded SQLite catalog, written with pyiceberg (no Spark), partitioned by region.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from icecdc.bench import out_argument
from icecdc.bench.harness import progress
from icecdc.compactor.reconcile import Reconciler
from icecdc.compactor.tracker import PartitionTracker
from icecdc.compactor.watcher import CommitWatcher
from icecdc.options import state_dir_argument
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import DEFAULT_STATE_DIR, Config, TableConfig, embedded_config

say = progress("watch")
REGIONS = ("eu", "us", "ap")


def _create(catalog: Any, namespace: str, count: int, run_id: int) -> list[str]:
    import pyarrow as pa
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType

    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "region", StringType(), required=False),
        NestedField(3, "amount", LongType(), required=False),
    )
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    catalog.create_namespace_if_not_exists(namespace)
    names = []
    for i in range(count):
        name = f"{namespace}.watch_{run_id}_{i}"
        table = catalog.create_table(name, schema, partition_spec=spec, properties={"format-version": "2"})
        table.append(_rows(pa, 0))
        names.append(name)
    return names


def _rows(pa: Any, start: int) -> Any:
    ids = list(range(start, start + 30))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([REGIONS[i % 3] for i in ids], pa.string()),
            "amount": pa.array(ids, pa.int64()),
        }
    )


def _timed(watcher: CommitWatcher) -> tuple[float, int]:
    started = time.perf_counter()
    found = watcher.poll_all()
    return (time.perf_counter() - started) * 1000, found


def run(tables: int, rounds: int, state_dir: Path) -> str:
    import pyarrow as pa

    state_dir.mkdir(parents=True, exist_ok=True)
    base = embedded_config(state_dir)
    catalog = pyiceberg_catalog(base)
    names = _create(catalog, "bench", tables, int(time.time()))
    config = Config.model_validate(
        {**base.model_dump(by_alias=True), "tables": [TableConfig(name=n).model_dump() for n in names]}
    )
    tracker = PartitionTracker(config.compactor)
    reconciler = Reconciler(config, tracker)
    watcher = CommitWatcher(config, tracker, reconciler, found=lambda event: tracker.on_commit(event))
    first, _ = _timed(watcher)
    say(f"first sight of {tables} tables (baseline and statistics): {first:.0f} ms")
    unchanged, changed = [], []
    for round_ in range(rounds):
        unchanged.append(_timed(watcher)[0])
        for name in names:
            catalog.load_table(name).append(_rows(pa, 1000 * (round_ + 1)))
        ms, found = _timed(watcher)
        if found != tables:
            raise RuntimeError(f"the poll found {found} new commits, {tables} expected")
        changed.append(ms)
        say(f"round {round_ + 1}: unchanged {unchanged[-1]:.0f} ms, one new snapshot each {ms:.0f} ms")
    return (
        f"One poll of {tables} kept tables (pyiceberg, SQLite catalog, local warehouse), {rounds} rounds:\n\n"
        "| poll | median ms | min ms | max ms |\n|---|---|---|---|\n"
        f"| first sight (baseline) | {first:.0f} | | |\n"
        f"| none changed | {statistics.median(unchanged):.0f} | {min(unchanged):.0f} | {max(unchanged):.0f} |\n"
        f"| one new snapshot each | {statistics.median(changed):.0f} | {min(changed):.0f} | {max(changed):.0f} |\n"
    )


# ---- python -m benchmarks watch ----


def add_arguments(parser: argparse.ArgumentParser) -> None:
    state_dir_argument(parser, f"local state directory: catalog and warehouse (default: {DEFAULT_STATE_DIR})")
    parser.add_argument("--tables", type=int, default=100, help="kept tables watched (default: 100)")
    parser.add_argument("--rounds", type=int, default=5, help="polls of each kind (default: 5)")
    out_argument(parser, plots="no plot")


def main(args: argparse.Namespace) -> int:
    summary = run(args.tables, args.rounds, args.state_dir.resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watch.md").write_text(summary)
    print(summary)
    print(f"summary: {args.out / 'watch.md'}")
    return 0
