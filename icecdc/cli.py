"""The ``icecdc`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from icecdc.bench import add_benchmarks
from icecdc.domain.errors import CatalogOutage, UserError
from icecdc.options import embedded_stack_arguments
from icecdc.runtime.config import load_config
from icecdc.runtime.logs import setup_logging

log = logging.getLogger("icecdc")
EXIT_CATALOG_OUTAGE = 75


def _config_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--config", "-c", type=Path, required=required, help="the icecdc YAML configuration file")


def _cmd_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    print(json.dumps(config.redacted(), indent=2))
    return 0


def _cmd_tables(args: argparse.Namespace) -> int:
    from icecdc.runtime.catalog import ensure_tables
    from icecdc.runtime.spark import spark_session

    config = load_config(args.config)
    with spark_session(config, "icecdc-tables") as spark:
        created = ensure_tables(spark, config)
    for table in config.tables:
        print(f"{table.name}: {'created' if table.name in created else 'exists, matches the config'}")
    return 0


def _broker(args: argparse.Namespace):
    from icecdc.runtime.broker import EmbeddedBroker

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
# SIGTERM or SIGINT once the work in flight is done (not 143: see ``icecdc.runtime.lifecycle``).
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
    from icecdc.runtime.lifecycle import stop_on_signals

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


def _cmd_portable_snapshot(args: argparse.Namespace) -> int:
    from icecdc import portable_snapshot

    config = load_config(args.config)
    unknown = [t for t in args.table if t not in {c.name for c in config.tables}]
    if unknown:
        raise UserError(f"not a configured table: {', '.join(unknown)}")
    found = portable_snapshot.portable_snapshots(config, args.table or None)
    if args.json:
        print(json.dumps({table: portable_snapshot.to_dict(p) for table, p in found.items()}, indent=2))
    else:
        print("\n".join(portable_snapshot.describe(table, p) for table, p in found.items()))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from icecdc.demo import DemoSource, run_demo

    return run_demo(args.state_dir.resolve(), port=args.port, keep_broker=args.keep_broker, source=DemoSource(args.source))


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

    demo = add(
        "demo",
        _cmd_demo,
        "run the local demo on the embedded stack (broker, SQLite catalog, local warehouse), from a throwaway PostgreSQL "
        "through the Debezium connector by default",
    )
    embedded_stack_arguments(demo)
    demo.add_argument(
        "--source",
        choices=["postgres", "synthetic"],
        default="postgres",
        help="postgres: SQL transactions in a throwaway PostgreSQL read by the real Debezium connector (default); "
        "synthetic: generated Debezium events, no database",
    )
    demo.add_argument("--keep-broker", action="store_true", help="leave the embedded broker running afterwards")

    broker = add("broker", _cmd_broker, "start, stop or check the embedded Kafka-protocol broker")
    broker.add_argument("action", choices=["start", "stop", "status"])
    embedded_stack_arguments(broker)

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

    portable = add(
        "portable-snapshot",
        _cmd_portable_snapshot,
        "print each table's newest snapshot with no live equality delete, the one readers that cannot apply "
        "them (pyiceberg, Polars, DuckDB by snapshot id) read exactly, and how far it is behind the current one",
    )
    _config_arg(portable)
    portable.add_argument("--table", action="append", default=[], help="a configured table (repeatable; default: all)")
    portable.add_argument("--json", action="store_true", help="print JSON instead of one line a table")

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

    add_benchmarks(add("bench", None, "benchmarks against the alternatives (see docs/BENCHMARKS.md)"))

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
