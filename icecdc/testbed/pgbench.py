"""PostgreSQL's own load generator, ``pgbench``, run against a throwaway cluster: ``-i`` makes its
four tables, and a run executes its TPC-B-like script, each transaction updating three keyed
tables and inserting one row into ``pgbench_history``, which has no primary key.

The binary comes with the server's (Debian's ``postgresql`` package), beside ``initdb``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from icecdc.testbed.postgres import PostgresError, ThrowawayPostgres, server_bindir

# pgbench's history table as icecdc mirrors it: the Iceberg type of each column as the Debezium
# connector sends it (``mtime`` is a timestamp without time zone, ``filler`` a char(22), null in
# every row pgbench inserts).
HISTORY_SCHEMA = {"tid": "int", "bid": "int", "aid": "int", "delta": "int", "mtime": "timestamp", "filler": "string"}
HISTORY_COLUMNS = tuple(HISTORY_SCHEMA)


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
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise PostgresError(f"pgbench {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result.stdout
