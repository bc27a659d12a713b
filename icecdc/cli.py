"""The ``icecdc`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from icecdc.config import DEFAULT_STATE_DIR, EMBEDDED_BROKER_PORT, load_config
from icecdc.errors import CatalogOutage, UserError
from icecdc.logs import setup_logging

log = logging.getLogger("icecdc")
EXIT_CATALOG_OUTAGE = 75


def _config_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--config", "-c", type=Path, required=required, help="the icecdc YAML configuration file")


def _cmd_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    print(json.dumps(config.redacted(), indent=2))
    return 0


def _cmd_tables(args: argparse.Namespace) -> int:
    from icecdc.catalog import ensure_tables
    from icecdc.spark import spark_session

    config = load_config(args.config)
    with spark_session(config, "icecdc-tables") as spark:
        created = ensure_tables(spark, config)
    for table in config.tables:
        print(f"{table.name}: {'created' if table.name in created else 'exists, matches the config'}")
    return 0


def _broker(args: argparse.Namespace):
    from icecdc.broker import EmbeddedBroker

    return EmbeddedBroker(args.state_dir.resolve() / "broker", args.port)


def _cmd_broker(args: argparse.Namespace) -> int:
    broker = _broker(args)
    if args.action == "start":
        started = broker.start()
        print(f"broker {'started' if started else 'already running'} on {broker.bootstrap_servers} (log: {broker.log_file})")
    elif args.action == "stop":
        print("broker stopped" if broker.stop() else "broker was not running")
    else:
        running = broker.is_running()
        print(f"broker {'running' if running else 'not running'} on {broker.bootstrap_servers}")
        return 0 if running else 3
    return 0


# ``ingest`` and ``compact`` exit 0 however they were asked to stop: idle (``--until-idle``), or by
# SIGTERM or SIGINT once the work in flight is done (not 143: see ``icecdc.lifecycle``).
def _cmd_ingest(args: argparse.Namespace) -> int:
    from icecdc.ingest.runner import run_ingest

    run_ingest(load_config(args.config), until_idle=args.until_idle)
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    from icecdc.compactor.sidecar import run_compactor

    run_compactor(load_config(args.config), until_idle=args.until_idle)
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from icecdc.generator import run_generator
    from icecdc.lifecycle import stop_on_signals

    sent = run_generator(
        load_config(args.config), args.table, args.rate, args.snapshot, args.seconds_per_day, args.limit, stop_on_signals()
    )
    print(f"{sent} change events sent")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from icecdc.compactor import status

    report = status.collect(load_config(args.config))
    print(json.dumps(report.to_dict(), indent=2) if args.json else status.render(report))
    return 0


def _positive_numbers(text: str, option: str) -> list[float]:
    """A comma-separated list of positive numbers, or a clear error."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"{option} wants comma-separated numbers, like 30,120; got {text!r}") from None
    if min(values) <= 0:
        raise UserError(f"{option}: every value must be above 0; got {text!r}")
    return values


def _cmd_bench_ingest(args: argparse.Namespace) -> int:
    from icecdc.bench import ingest

    sizes = [int(s) for s in _positive_numbers(args.sizes, "--sizes")]
    results = ingest.run(sizes, args.changes, args.batches, args.out, args.state_dir.resolve())
    print(ingest.summary(results))
    print(f"results: {args.out / 'ingest.json'}, plot: {args.out / 'ingest.png'}")
    return 0


def _cmd_bench_contention(args: argparse.Namespace) -> int:
    from icecdc.bench import contention

    results = contention.run(args.batches, args.changes, args.interval, args.out, args.state_dir.resolve())
    print(contention.summary(results))
    print(f"results: {args.out / 'contention.json'}, plot: {args.out / 'contention.png'}")
    return 0


def _cmd_bench_e2e(args: argparse.Namespace) -> int:
    from icecdc.bench import e2e

    try:
        updates, inserts = (float(x) for x in args.mix.split(","))
    except ValueError:
        raise UserError(f"--mix wants two shares, updates and inserts, like 0.7,0.2; got {args.mix!r}") from None
    if min(updates, inserts) < 0 or updates + inserts > 1:
        raise UserError(f"--mix: the shares must be at least 0 and add up to at most 1; got {args.mix!r}")
    cron_seconds = _positive_numbers(args.cron_seconds, "--cron-seconds")
    workload = e2e.Workload(
        keys=args.keys, changes=args.changes, updates=updates, inserts=inserts, partitioning=args.partitioning
    )
    strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    results = e2e.run(
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
    )
    print(e2e.summary(results))
    print(f"results: {args.out / 'e2e.json'}, plots: {args.out / 'e2e*.png'}, summary: {args.out / 'e2e.md'}")
    return 0


def _cmd_bench_rewrite(args: argparse.Namespace) -> int:
    from icecdc.bench import rewrite

    results = rewrite.run(
        args.rows, args.batches, args.deleted_share, args.repeats, args.out, args.state_dir.resolve(), args.regions
    )
    print(rewrite.summary(results))
    print(f"results: {args.out / 'rewrite.json'}, plot: {args.out / 'rewrite.png'}")
    return 0


def _cmd_bench_manifests(args: argparse.Namespace) -> int:
    from icecdc.bench import manifests

    counts = [int(n) for n in _positive_numbers(args.manifests, "--manifests")]
    results = manifests.run(args.rows, counts, args.lookups, args.out, args.state_dir.resolve())
    print(manifests.summary(results))
    print(f"results: {args.out / 'manifests.json'}, plot: {args.out / 'manifests.png'}")
    return 0


def _cmd_bench_global_deletes(args: argparse.Namespace) -> int:
    from icecdc.bench import global_deletes

    results = global_deletes.run(
        args.rows, args.changes, args.batches, args.repeats, args.lookups, args.out, args.state_dir.resolve()
    )
    print(global_deletes.summary(results))
    print(f"results: {args.out / 'global-deletes.json'}, plot: {args.out / 'global-deletes.png'}")
    return 0


def _cmd_bench_scale(args: argparse.Namespace) -> int:
    from icecdc.bench import scale

    counts = [int(n) for n in _positive_numbers(args.partitions, "--partitions")]
    results = scale.run(counts, args.batches, args.repeats, args.out, args.state_dir.resolve())
    print(scale.summary(results))
    print(f"results: {args.out / 'scale.json'}, plot: {args.out / 'scale.png'}")
    return 0


def _cmd_bench_jobs(args: argparse.Namespace) -> int:
    from icecdc.bench import jobs

    settings = [int(n) for n in _positive_numbers(args.per_job, "--per-job")]
    results = jobs.run(args.partitions, args.rows, args.batches, settings, args.repeats, args.out, args.state_dir.resolve())
    print(jobs.summary(results))
    print(f"results: {args.out / 'jobs.json'}, plot: {args.out / 'jobs.png'}")
    return 0


def _cmd_bench_ingest_shape(args: argparse.Namespace) -> int:
    from icecdc.bench import ingest_shape

    changes = [int(n) for n in _positive_numbers(args.changes, "--changes")]
    tables = [int(n) for n in _positive_numbers(args.tables, "--tables")]
    threads = [int(n) for n in _positive_numbers(args.commit_threads, "--commit-threads")]
    results = ingest_shape.run(changes, tables, args.fan_out_changes, args.batches, args.out, args.state_dir.resolve(), threads)
    print(ingest_shape.summary(results))
    print(f"results: {args.out / 'ingest-shape.json'}, plot: {args.out / 'ingest-shape.png'}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from icecdc.demo import run_demo

    return run_demo(args.state_dir.resolve(), port=args.port, keep_broker=args.keep_broker)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icecdc",
        description="Streaming-integrated compaction sidecar for Kafka-to-Iceberg CDC pipelines.",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("ICECDC_LOG_FORMAT", "text"),
        help="log lines as text or as one JSON object each (default: $ICECDC_LOG_FORMAT or text)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], int] | None, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if handler is not None:
            sub.set_defaults(handler=handler)
        return sub

    def add_state(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--state-dir",
            type=Path,
            default=Path(DEFAULT_STATE_DIR),
            help=f"local state directory (default: {DEFAULT_STATE_DIR})",
        )
        sub.add_argument(
            "--port", type=int, default=EMBEDDED_BROKER_PORT, help=f"embedded broker port (default: {EMBEDDED_BROKER_PORT})"
        )

    demo = add("demo", _cmd_demo, "run the local demo on the embedded stack (broker, SQLite catalog, local warehouse)")
    add_state(demo)
    demo.add_argument("--keep-broker", action="store_true", help="leave the embedded broker running afterwards")

    broker = add("broker", _cmd_broker, "start, stop or check the embedded Kafka-protocol broker")
    broker.add_argument("action", choices=["start", "stop", "status"])
    add_state(broker)

    ingest = add("ingest", _cmd_ingest, "mirror the configured Debezium topics into their Iceberg tables")
    _config_arg(ingest)
    ingest.add_argument(
        "--until-idle",
        type=float,
        metavar="SECONDS",
        help="stop after this long with nothing new to read; time the catalog does not answer does not count "
        "(default: run until stopped)",
    )

    compact = add("compact", _cmd_compact, "run the compactor sidecar: compact settled partitions as the commit events show them")
    _config_arg(compact)
    compact.add_argument(
        "--until-idle",
        type=float,
        metavar="SECONDS",
        help="stop when nothing is left to do and no commit event arrived for this long; time the catalog "
        "does not answer does not count, and the window starts again when it answers",
    )

    status = add("status", _cmd_status, "show every partition's state, files, deletes and estimated read cost")
    _config_arg(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    generate = add(
        "generate", _cmd_generate, "send a synthetic Debezium change feed for an orders table (demos without a database)"
    )
    _config_arg(generate)
    generate.add_argument(
        "--table", help="the configured table to feed (default: the first); its schema must be the orders schema"
    )
    generate.add_argument("--rate", type=float, default=200, help="changes per second (default: 200)")
    generate.add_argument("--snapshot", type=int, default=5000, help="orders in the initial snapshot (default: 5000)")
    generate.add_argument("--seconds-per-day", type=float, default=60, help="how long a simulated day lasts (default: 60)")
    generate.add_argument("--limit", type=int, help="stop after this many changes (default: run until stopped)")

    tables = add("tables", _cmd_tables, "create the configured tables that do not exist and check the ones that do")
    _config_arg(tables)

    bench = add("bench", None, "benchmarks against the alternatives (see docs/BENCHMARKS.md)")
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    bench_ingest = benches.add_parser("ingest", help="icecdc's writer against MERGE INTO (merge-on-read) on growing tables")
    bench_ingest.set_defaults(handler=_cmd_bench_ingest)
    bench_ingest.add_argument("--sizes", default="1000000,5000000", help="starting table sizes, comma-separated (default: 1M,5M)")
    bench_ingest.add_argument("--changes", type=int, default=10_000, help="changes per batch (default: 10000)")
    bench_ingest.add_argument("--batches", type=int, default=5, help="measured batches per size, after one warm-up (default: 5)")
    bench_ingest.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")
    contention = benches.add_parser(
        "contention", help="the writer's commit latency beside no compactor, a naive one and the coordinated one"
    )
    contention.set_defaults(handler=_cmd_bench_contention)
    add_state(contention)
    contention.add_argument("--batches", type=int, default=60, help="writer batches per mode (default: 60)")
    contention.add_argument("--changes", type=int, default=2000, help="changes per batch (default: 2000)")
    contention.add_argument("--interval", type=float, default=2.0, help="seconds between the writer's batches (default: 2)")
    contention.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")
    bench_ingest.add_argument("--state-dir", type=Path, default=Path(".icecdc-bench"), help="catalog, warehouse and broker state")
    e2e = benches.add_parser(
        "e2e",
        help="query latency, files, write amplification and writer latency over a CDC run, "
        "per maintenance strategy (none, cron, threshold, icecdc)",
    )
    e2e.set_defaults(handler=_cmd_bench_e2e)
    add_state(e2e)
    e2e.add_argument("--minutes", type=float, default=10, help="how long the stream is written (default: 10)")
    e2e.add_argument("--keys", type=int, default=20_000, help="rows in the initial load (default: 20000)")
    e2e.add_argument("--changes", type=int, default=1500, help="changes per micro-batch outside bursts (default: 1500)")
    e2e.add_argument(
        "--mix",
        default="0.7,0.2",
        metavar="UPDATES,INSERTS",
        help="shares of updates and inserts; deletes are the rest (default: 0.7,0.2)",
    )
    e2e.add_argument("--batch-seconds", type=float, default=10, help="one micro-batch every this many seconds (default: 10)")
    e2e.add_argument("--probe-seconds", type=float, default=60, help="measure every table this often (default: 60)")
    e2e.add_argument(
        "--cron-seconds",
        default="30,120",
        metavar="K[,K...]",
        help="periods of the cron strategies, one table each (default: 30,120)",
    )
    e2e.add_argument(
        "--drain-seconds",
        type=float,
        default=90,
        help="how long maintenance runs on after the last batch, at least (default: 90)",
    )
    e2e.add_argument(
        "--drain-max-seconds",
        type=float,
        help="the drain goes on until the sidecar has answered every partition, at most this long "
        "(default: --drain-seconds + 300)",
    )
    e2e.add_argument("--lookups", type=int, default=100, help="point lookups per table per probe (default: 100)")
    e2e.add_argument(
        "--strategies",
        metavar="S[,S...]",
        help="only these strategies (icecdc always; fewer tables, more probes while writing); default: all",
    )
    e2e.add_argument(
        "--partitioning",
        choices=("days", "region"),
        default="days",
        help="days: region and day, yesterday's partitions settle; region: four partitions written every batch, "
        "none settles while the stream runs (default: days)",
    )
    e2e.add_argument("--format-version", type=int, choices=(2, 3), default=2, help="Iceberg format of the tables (default: 2)")
    e2e.add_argument(
        "--hot-read-budget", type=float, help="the sidecar's compactor.hot_read_budget (default: the configuration's default)"
    )
    bench_rewrite = benches.add_parser(
        "rewrite", help="the compactor's rewrite throughput (deletes applied) against pyarrow read+write"
    )
    bench_rewrite.set_defaults(handler=_cmd_bench_rewrite)
    add_state(bench_rewrite)
    bench_rewrite.add_argument("--rows", type=int, default=1_000_000, help="rows written (default: 1000000)")
    bench_rewrite.add_argument(
        "--batches", type=int, default=12, help="batches they are written in: files per partition (default: 12)"
    )
    bench_rewrite.add_argument(
        "--deleted-share", type=float, default=0.1, help="share of rows then updated or deleted (default: 0.1)"
    )
    bench_rewrite.add_argument(
        "--regions",
        type=int,
        choices=range(1, 5),
        default=4,
        help="regions the rows spread over, one partition each; 1 puts them all in the timed one (default: 4)",
    )
    bench_rewrite.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up (default: 3)")
    bench_rewrite.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")
    e2e.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plots and summary")
    bench_manifests = benches.add_parser(
        "manifests", help="point-lookup latency with N small manifests against the same data files with the manifests merged"
    )
    bench_manifests.set_defaults(handler=_cmd_bench_manifests)
    bench_manifests.add_argument(
        "--state-dir",
        type=Path,
        default=Path(DEFAULT_STATE_DIR),
        help=f"local state directory: catalog and warehouse, no broker (default: {DEFAULT_STATE_DIR})",
    )
    bench_manifests.add_argument("--rows", type=int, default=100_000, help="rows in each table (default: 100000)")
    bench_manifests.add_argument(
        "--manifests",
        default="2,8,20,50",
        metavar="N[,N...]",
        help="commits (so manifests) each table is loaded in (default: 2,8,20,50)",
    )
    bench_manifests.add_argument("--lookups", type=int, default=100, help="point lookups on each snapshot (default: 100)")
    bench_manifests.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")

    bench_global = benches.add_parser(
        "global-deletes",
        help="reads with unresolved global equality deletes (key-only before-images) against the same table resolved, "
        "and what resolving costs",
    )
    bench_global.set_defaults(handler=_cmd_bench_global_deletes)
    bench_global.add_argument(
        "--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help=f"local state directory (default: {DEFAULT_STATE_DIR})"
    )
    bench_global.add_argument("--rows", type=int, default=200_000, help="rows loaded first (default: 200000)")
    bench_global.add_argument("--changes", type=int, default=2_000, help="key-only updates and deletes a batch (default: 2000)")
    bench_global.add_argument(
        "--batches", type=int, default=5, help="batches before the first resolution, and after (default: 5)"
    )
    bench_global.add_argument("--repeats", type=int, default=7, help="counts and aggregations on each snapshot (default: 7)")
    bench_global.add_argument("--lookups", type=int, default=50, help="point lookups on each snapshot (default: 50)")
    bench_global.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")

    bench_scale = benches.add_parser(
        "scale", help="the compactor's metadata reads, decisions, status and listings against partitions and files"
    )
    bench_scale.set_defaults(handler=_cmd_bench_scale)
    bench_scale.add_argument(
        "--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help=f"local state directory (default: {DEFAULT_STATE_DIR})"
    )
    bench_scale.add_argument(
        "--partitions", default="100,1000,10000", metavar="N[,N...]", help="partitions of each table (default: 100,1000,10000)"
    )
    bench_scale.add_argument(
        "--batches", type=int, default=5, help="writer batches per table, two files per partition each (default: 5)"
    )
    bench_scale.add_argument("--repeats", type=int, default=3, help="measurements of each step (default: 3)")
    bench_scale.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")

    bench_jobs = benches.add_parser(
        "jobs", help="settled partitions compacted per minute, one Spark job per partition against several a job"
    )
    bench_jobs.set_defaults(handler=_cmd_bench_jobs)
    bench_jobs.add_argument(
        "--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help=f"local state directory (default: {DEFAULT_STATE_DIR})"
    )
    bench_jobs.add_argument("--partitions", type=int, default=64, help="small settled partitions a run (default: 64)")
    bench_jobs.add_argument("--rows", type=int, default=200, help="rows in each partition (default: 200)")
    bench_jobs.add_argument(
        "--batches", type=int, default=3, help="writer batches, each rewriting every partition's rows (default: 3)"
    )
    bench_jobs.add_argument(
        "--per-job",
        default="1,16",
        metavar="N[,N...]",
        help="compactor.partitions_per_job settings compared side by side, run by run (default: 1,16)",
    )
    bench_jobs.add_argument("--repeats", type=int, default=3, help="runs of each setting (default: 3)")
    bench_jobs.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")

    bench_shape = benches.add_parser(
        "ingest-shape", help="the ingester's cost per batch against the batch's size and the tables it spans, with memory"
    )
    bench_shape.set_defaults(handler=_cmd_bench_ingest_shape)
    bench_shape.add_argument(
        "--state-dir", type=Path, default=Path(DEFAULT_STATE_DIR), help=f"local state directory (default: {DEFAULT_STATE_DIR})"
    )
    bench_shape.add_argument(
        "--changes", default="10000,50000,200000", metavar="N[,N...]", help="batch sizes, one table (default: 10000,50000,200000)"
    )
    bench_shape.add_argument("--tables", default="1,10,50", metavar="N[,N...]", help="tables one batch spans (default: 1,10,50)")
    bench_shape.add_argument(
        "--fan-out-changes", type=int, default=10_000, help="changes per batch over all tables, for --tables (default: 10000)"
    )
    bench_shape.add_argument(
        "--commit-threads",
        default="1,4",
        metavar="N[,N...]",
        help="ingest.commit_threads settings compared side by side at each table count (default: 1,4)",
    )
    bench_shape.add_argument("--batches", type=int, default=3, help="measured batches per point, after one warm-up (default: 3)")
    bench_shape.add_argument("--out", type=Path, default=Path("bench-results"), help="where to write JSON, plot and summary")

    config = add("config", _cmd_config, "validate a configuration file and print it with secrets masked")
    _config_arg(config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.log_format == "json")
    try:
        return args.handler(args)
    except UserError as exc:
        print(f"icecdc: {exc}", file=sys.stderr)
        return 2
    except CatalogOutage as exc:
        # EX_TEMPFAIL: nothing is wrong with the command or its data; run it again later.
        print(f"icecdc: {exc}", file=sys.stderr)
        return EXIT_CATALOG_OUTAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
