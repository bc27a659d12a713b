"""One e2e run: the strategies' tables written by one feed, probed, drained and checked
against the stream's final state."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from icecdc.bench.e2e.probe import COLUMNS, PROBE_POOL, REFERENCE, AgeSampler, Probe
from icecdc.bench.e2e.results import E2EResults, StrategyResult, portability
from icecdc.bench.e2e.snapshots import (
    amplification_between,
    amplification_so_far,
    bytes_added_between,
    settle_to_compacted,
    snapshot_log,
)
from icecdc.bench.e2e.stream import LOAD_CHUNK_ROWS, Workload, change_batches, load_chunks, new_orders, settle_settings
from icecdc.bench.e2e.summaries import plot, summary
from icecdc.bench.harness import BenchStack, FeedWriter, bench_stack, clone, differing_rows, progress
from icecdc.bench.report import machine, percentile, publish
from icecdc.bench.strategies import (
    ICECDC,
    THRESHOLD,
    CronRewrite,
    Sidecar,
    Strategy,
    ThresholdCompaction,
    cron_period,
    strategy_names,
)
from icecdc.domain.errors import UserError
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config
from icecdc.workload import orders_table

say = progress("e2e")


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
    strategies: Sequence[str] | None = None  # None: every one
    format_version: int = 2
    hot_read_budget: float | None = None  # None: the compactor's default
    age_sample_seconds: float = 2.0
    staging_branch: str | None = None  # the sidecar's table's (None: not staged)
    table_properties: Mapping[str, str] = field(default_factory=dict)  # every table's, over icecdc's
    repeats: int = 3


def _config(base: Config, run_id: int, strategies: Sequence[str], run: RunSettings) -> Config:
    slugs = [s.replace("-", "_") for s in strategies]
    tables = [
        {
            **orders_table(f"bench.e2e_{s}_{run_id}", f"e2e-{s}-{run_id}", note=run.workload.note_chars > 0),
            "partition_by": run.workload.partition_by,
            "format_version": run.format_version,
            "before_image": run.workload.before_image.value,
            **({"staging_branch": run.staging_branch} if run.staging_branch and s == ICECDC else {}),
            "properties": dict(run.table_properties),
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


def _start(spark: Any, config: Config, strategies: Sequence[str], strategy: str, out: Path) -> Strategy:
    table = config.tables[strategies.index(strategy)].name
    if (period := cron_period(strategy)) is not None:
        return CronRewrite(spark, config, table, period)
    if strategy == THRESHOLD:
        return ThresholdCompaction(spark, config, table, config.compactor)
    if strategy == ICECDC:
        return Sidecar(clone(config, tables=[config.tables[strategies.index(ICECDC)].model_dump(by_alias=True)]), out)
    return Strategy()


def _drain(strategies: dict[str, Strategy], minimum: float, maximum: float) -> float:
    """Let maintenance run on for at least ``minimum`` seconds and until the sidecar has answered
    every partition, at most ``maximum``; how long it lasted."""
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
        # Every table reads the same records from its own topic; batch ids go on from the load's.
        result = feed.write(stream[number], number + load_commits - 1)
        return {by_table[t]: s for t, s in result.commit_seconds.items()}

    # The sidecar is up before the ingester writes, as deployed; the other strategies are
    # triggers on the writer's schedule and start with the measured writes.
    strategies = {s: _start(spark, config, all_strategies, s, out) for s in all_strategies}
    if ICECDC in strategies:
        strategies[ICECDC].start()
    say(f"initial load: {run.workload.keys:,} rows into {len(all_strategies)} tables, in {load_commits} commits")
    for number, chunk in enumerate(load_chunks(orders, run.workload.keys)):
        feed.write(chunk, number)
        if load_commits > 1:
            say(f"initial load: commit {number + 1}/{load_commits}")
    if load_commits > 1 and ICECDC in strategies:
        # Users' partitions were compacted long before a stream's steady state: the stream starts
        # once the sidecar has compacted the load (docs/BENCHMARKS.md, row "Users' partition sizes").
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
    # A probe on its own thread: pausing the writer would give every partition a quiet gap.
    probing = threading.Event()

    def probe_loop() -> None:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", PROBE_POOL)
        while not probing.wait(run.probe_seconds):
            probe()

    prober = threading.Thread(target=probe_loop, name="probe", daemon=True)
    prober.start()
    sampler = AgeSampler(config, names[ICECDC], run.age_sample_seconds, started, run.staging_branch)
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
    results.equality_delete_ages, results.main_behind = sampler.samples, sampler.main_behind
    results.global_delete_ages = sampler.global_samples
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
            amplification_so_far=amplification_so_far(log, writes_started, writes_ended),
            bytes_added_writing=bytes_added_between(log, writes_started, writes_ended),
        )
    results.reference = probe.series[REFERENCE]
    results.readers = probe.readers
    results.portability = portability(results)
    expected.unpersist()
    say(f"every table holds the stream's final state ({len(orders.rows):,} rows)")
    for name in (*names.values(), probe.reference):
        spark.sql(f"DROP TABLE IF EXISTS {name} PURGE")


def run(settings: RunSettings, minutes: float, out: Path, state_dir: Path, workload_name: str = "small") -> E2EResults:
    cron_seconds, strategies = settings.cron_seconds, settings.strategies
    unknown = sorted(set(strategies or ()) - set(strategy_names(cron_seconds)))
    if unknown or (strategies is not None and ICECDC not in strategies):
        # The compacted reference is copied from the sidecar's table, so it always runs.
        raise UserError(
            f"--strategies: {', '.join(unknown) or 'icecdc is missing'}; choose among {', '.join(strategy_names(cron_seconds))}"
            " (icecdc always)"
        )
    # The results repeat the run's settings (their ``strategies`` are the strategies' results).
    shared = {
        f.name: getattr(settings, f.name)
        for f in fields(RunSettings)
        if f.name not in ("strategies", "cron_seconds", "table_properties")
    }
    results = E2EResults(
        machine(),
        minutes,
        workload_name=workload_name,
        **shared,
        cron_seconds=list(cron_seconds),
        table_properties=dict(settings.table_properties),
    )
    # Fair scheduling, the probe's jobs in a pool of their own: a user's writer does not queue
    # behind a reader's job (docs/BENCHMARKS.md, row "Users' partition sizes").
    conf = {"spark.scheduler.mode": "FAIR"}
    if workload_name == "large":
        # The initial load, the compacted copy and the final comparison share the driver's memory.
        conf["spark.driver.memory"] = "6g"
    with bench_stack("e2e", state_dir, spark={"conf": conf}) as stack:
        _run_strategies(stack, out, settings, results)
    publish(out, "e2e", results, plot, summary)
    return results
