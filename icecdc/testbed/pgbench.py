"""PostgreSQL's own load generator, ``pgbench``, run against a throwaway cluster: ``-i`` makes its
four tables, and a run executes its TPC-B-like script, each transaction updating three keyed
tables and inserting one row into ``pgbench_history``, which has no primary key.

The binary comes with the server's (Debian's ``postgresql`` package), beside ``initdb``.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from icecdc.testbed.postgres import PostgresError, ThrowawayPostgres, server_bindir

# pgbench's history table as icecdc mirrors it: the Iceberg type of each column as the Debezium
# connector sends it (``mtime`` is a timestamp without time zone, ``filler`` a char(22), null in
# every row pgbench inserts).
HISTORY_SCHEMA = {"tid": "int", "bid": "int", "aid": "int", "delta": "int", "mtime": "timestamp", "filler": "string"}
HISTORY_COLUMNS = tuple(HISTORY_SCHEMA)
# The three keyed tables, each keyed by its first column (``pgbench -i`` adds the primary keys).
# ``filler`` is blank-padded in accounts and null in branches and tellers.
KEYED_SCHEMAS = {
    "pgbench_accounts": {"aid": "int", "bid": "int", "abalance": "int", "filler": "string"},
    "pgbench_branches": {"bid": "int", "bbalance": "int", "filler": "string"},
    "pgbench_tellers": {"tid": "int", "bid": "int", "tbalance": "int", "filler": "string"},
}
ACCOUNTS_PER_SCALE = 100_000  # pgbench -i's rows of pgbench_accounts per unit of scale
ROWS_PER_TRANSACTION = 4  # the TPC-B-like script: three updates and one insert


def pgbench_binary(bindir: Path | None = None) -> Path:
    """``pgbench`` beside the server's binaries."""
    binary = (bindir or server_bindir()) / "pgbench"
    if not binary.exists():
        raise PostgresError(f"pgbench is missing from {binary.parent}: it comes with PostgreSQL's server package")
    return binary


def run_pgbench(database: ThrowawayPostgres, *args: str, timeout: float = 600.0) -> str:
    """Run ``pgbench`` with ``args`` against ``database``; its report (stdout). Raises PostgresError."""
    command = [
        str(pgbench_binary(database.bindir)),
        "-h",
        database.host,
        "-p",
        str(database.port),
        "-U",
        database.user,
        *args,
        database.database,
    ]
    # Sessions in UTC: history's ``mtime`` (a timestamp without time zone) is then the epoch's clock.
    environment = {**os.environ, "PGTZ": "UTC"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=environment)
    if result.returncode != 0:
        raise PostgresError(f"pgbench {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result.stdout


@dataclass(frozen=True)
class PgbenchReport:
    """What a ``pgbench`` run reports of itself."""

    transactions: int  # processed, that is committed
    latency_ms: float  # its mean transaction latency, from its schedule when rate-limited (nan: not reported)


def parse_report(report: str) -> PgbenchReport:
    """``pgbench``'s report (stdout) as figures. Raises PostgresError when it has no transaction count."""
    processed = re.search(r"number of transactions actually processed: (\d+)", report)
    if processed is None:
        raise PostgresError(f"pgbench's report has no transaction count: {report[-1000:]}")
    latency = re.search(r"latency average = ([\d.]+) ms", report)
    return PgbenchReport(int(processed.group(1)), float(latency.group(1)) if latency else float("nan"))
