"""The loads ``bench source-latency`` drives PostgreSQL with: icecdc's own orders transactions
(``OrdersLoad``), or PostgreSQL's own ``pgbench`` and its TPC-B-like script (``PgbenchLoad``).

A load says which tables it writes, what they become in Iceberg, and which of its rows carry
their transaction's clock (``StampedRows``): the latency is measured on those. PostgreSQL holds
the truth: the bench compares the mirror with ``SELECT`` of each source table.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from icecdc.bench.read_probe import LOOKUPS, ORDERS_READS, ReadShape
from icecdc.testbed.orders import OrdersTransactions
from icecdc.testbed.pgbench import (
    ACCOUNTS_PER_SCALE,
    HISTORY_SCHEMA,
    KEYED_SCHEMAS,
    ROWS_PER_TRANSACTION,
    parse_report,
    run_pgbench,
)
from icecdc.testbed.postgres import ThrowawayPostgres
from icecdc.workload import orders_table

TICKS_PER_SECOND = 100  # the orders pacer's
KEYS_PER_CONNECTION = 1_000_000_000
PGBENCH_HISTORY = "pgbench_history"
# pgbench's report comes once its run ends: this long past its -T for it to finish.
PGBENCH_GRACE_SECONDS = 120


class LoadKind(str, Enum):
    ORDERS = "orders"  # icecdc's orders transactions (icecdc.testbed.orders), paced by the bench
    PGBENCH = "pgbench"  # pgbench -R RATE, its built-in TPC-B-like script


@dataclass(frozen=True)
class StampedRows:
    """The source table whose rows carry their transaction's clock, the column that holds it, and
    the columns that tell one row version from another (the stamp among them)."""

    table: str
    stamp: str
    identity: tuple[str, ...]


@dataclass(frozen=True)
class LoadRun:
    """What a load did."""

    committed: int  # transactions
    rows_changed: int
    started: float  # epoch seconds
    elapsed: float  # seconds
    detail: str = ""  # what the load's own tool says of its run


@dataclass(frozen=True)
class ProbedTable:
    """The table the read probes read, how, and the keys they look up."""

    table: str  # the source table
    shape: ReadShape
    keys: Callable[[random.Random], list[int]]


class Load(Protocol):
    kind: LoadKind
    stamped: StampedRows

    @property
    def source_tables(self) -> tuple[str, ...]: ...

    def describe(self) -> str: ...

    def prepare(self, postgres: ThrowawayPostgres) -> None:
        """Make the source tables and their first rows, before the connector starts."""

    def specs(self, prefix: str, topic: Callable[[str], str]) -> list[dict[str, Any]]:
        """The Iceberg tables, by source table, each named ``prefix_<source table>``."""

    def first(self, postgres: ThrowawayPostgres) -> None:
        """A transaction the bench sees through to Iceberg before the load: the first Spark jobs are slow."""

    def drive(self, postgres: ThrowawayPostgres, rate: float, seconds: float) -> LoadRun: ...

    def probed(self) -> ProbedTable: ...


def iceberg_name(prefix: str, table: str) -> str:
    return f"{prefix}_{table}"


class PacedLoad:
    """``rate`` transactions a second for ``seconds`` over one connection and thread per workload;
    behind schedule each runs as fast as it can."""

    def __init__(self, postgres: ThrowawayPostgres, workloads: list[OrdersTransactions], rate: float, seconds: float) -> None:
        self._postgres, self.workloads, self._seconds = postgres, workloads, seconds
        self._rate = rate / len(workloads)
        self.started, self.elapsed = 0.0, 0.0  # started: wall clock (epoch seconds)
        self._start = threading.Barrier(len(workloads) + 1)
        self._threads = [threading.Thread(target=self._run, args=(w,), name="paced-load", daemon=True) for w in workloads]
        self.errors: list[BaseException] = []

    def _run(self, workload: OrdersTransactions) -> None:
        try:
            with self._postgres.connect() as db:
                self._start.wait()
                begun, done = time.monotonic(), 0
                while (now := time.monotonic() - begun) < self._seconds:
                    due = int(now * self._rate)
                    if done >= due:
                        time.sleep(1 / TICKS_PER_SECOND)
                        continue
                    for _ in range(min(due - done, int(self._rate / TICKS_PER_SECOND) + 1)):
                        workload.transaction(db)
                        done += 1
        except BaseException as exc:  # noqa: BLE001 - carried to the bench's thread, which raises it
            self.errors.append(exc)

    def run(self) -> LoadRun:
        for thread in self._threads:
            thread.start()
        self._start.wait()
        self.started, begun = time.time(), time.monotonic()
        for thread in self._threads:
            thread.join()
        self.elapsed = time.monotonic() - begun
        if self.errors:
            raise self.errors[0]
        committed = sum(w.counts.committed for w in self.workloads)
        return LoadRun(committed, sum(w.counts.rows_changed for w in self.workloads), self.started, self.elapsed)


class OrdersLoad:
    """icecdc's orders transactions, one statement each, stamped with the statement's clock, over
    ``connections`` connections with a key range each (a connection's updates and deletes pick
    among its own keys)."""

    kind = LoadKind.ORDERS

    def __init__(self, run: int, connections: int) -> None:
        self._table = f"orders_{run}"
        self.stamped = StampedRows(self._table, "updated_at", ("id", "updated_at"))
        self.connections = connections
        self.workloads = [
            OrdersTransactions(
                table=self._table,
                seed=run * 1_000 + i,
                next_key=i * KEYS_PER_CONNECTION + 1,
                max_statements=1,
                rollback_share=0.0,
                multi_row=0.1,
                clock=True,
                recent_keys=5_000,
            )
            for i in range(connections)
        ]

    @property
    def source_tables(self) -> tuple[str, ...]:
        return (self._table,)

    def describe(self) -> str:
        return f"icecdc's orders transactions on {self.connections} connections"

    def prepare(self, postgres: ThrowawayPostgres) -> None:
        with postgres.connect() as db:
            self.workloads[0].create(db)

    def specs(self, prefix: str, topic: Callable[[str], str]) -> list[dict[str, Any]]:
        spec = {**orders_table(iceberg_name(prefix, self._table), topic(self._table)), "before_image": "key"}
        return [{**spec, "partition_by": ["region"]}]

    def first(self, postgres: ThrowawayPostgres) -> None:
        with postgres.connect() as db:
            self.workloads[0].transaction(db)  # a workload's first statement inserts

    def drive(self, postgres: ThrowawayPostgres, rate: float, seconds: float) -> LoadRun:
        return PacedLoad(postgres, self.workloads, rate, seconds).run()

    def probed(self) -> ProbedTable:
        def keys(rng: random.Random) -> list[int]:
            inserted = [(i * KEYS_PER_CONNECTION + 1, w.next_key) for i, w in enumerate(self.workloads)]
            ranges = [(low, high) for low, high in inserted if high > low]
            return [rng.randrange(*rng.choice(ranges)) for _ in range(LOOKUPS)]

        return ProbedTable(self._table, ORDERS_READS, keys)


class PgbenchLoad:
    """``pgbench -R RATE`` with its built-in TPC-B-like script over ``clients`` clients, on the
    tables ``pgbench -i -s SCALE`` made. Each transaction updates a random account, its teller and
    its branch (at scale 1, the one branches row every transaction updates) and inserts a
    history row. History has no primary key: it is mirrored append-only, and its ``mtime``, the
    transaction's start, is the stamp. A transaction's start precedes its commit by its own
    latency, which pgbench reports: the bench's latency errs high by that much. Every table is
    partitioned by branch (``bid``)."""

    kind = LoadKind.PGBENCH
    stamped = StampedRows(PGBENCH_HISTORY, "mtime", ("tid", "bid", "aid", "delta", "mtime"))

    def __init__(self, scale: int, clients: int) -> None:
        self.scale, self.clients = scale, clients

    @property
    def source_tables(self) -> tuple[str, ...]:
        return (*KEYED_SCHEMAS, PGBENCH_HISTORY)

    def describe(self) -> str:
        return f"pgbench's TPC-B-like script at scale {self.scale} on {self.clients} clients"

    def prepare(self, postgres: ThrowawayPostgres) -> None:
        run_pgbench(postgres, "-i", "-q", "-s", str(self.scale))  # drops the tables of an earlier run first

    def specs(self, prefix: str, topic: Callable[[str], str]) -> list[dict[str, Any]]:
        keyed = [
            {
                "name": iceberg_name(prefix, table),
                "topic": topic(table),
                "primary_key": [next(iter(schema))],
                "partition_by": ["bid"],
                "schema": schema,
            }
            for table, schema in KEYED_SCHEMAS.items()
        ]
        history = {
            "name": iceberg_name(prefix, PGBENCH_HISTORY),
            "topic": topic(PGBENCH_HISTORY),
            "partition_by": ["bid"],
            "schema": HISTORY_SCHEMA,
        }
        return [*keyed, history]

    def first(self, postgres: ThrowawayPostgres) -> None:
        run_pgbench(postgres, "-n", "-b", "tpcb-like", "-t", "1")

    def drive(self, postgres: ThrowawayPostgres, rate: float, seconds: float) -> LoadRun:
        started, begun = time.time(), time.monotonic()
        report = parse_report(
            run_pgbench(
                postgres,
                *("-n", "-b", "tpcb-like", "-M", "prepared", "-R", f"{rate:g}", "-T", f"{seconds:g}"),
                # One thread: its event loop keeps the clients at this rate, and leaves the cores to the pipeline.
                *("-c", str(self.clients), "-j", "1"),
                timeout=seconds + PGBENCH_GRACE_SECONDS,
            )
        )
        elapsed = time.monotonic() - begun
        detail = f"pgbench's mean transaction latency {report.latency_ms:.1f} ms"
        return LoadRun(report.transactions, ROWS_PER_TRANSACTION * report.transactions, started, elapsed, detail)

    def probed(self) -> ProbedTable:
        accounts = self.scale * ACCOUNTS_PER_SCALE

        def keys(rng: random.Random) -> list[int]:
            return [rng.randint(1, accounts) for _ in range(LOOKUPS)]

        shape = ReadShape("bid", "SELECT bid, count(*), sum(abalance) FROM {t} GROUP BY bid", "aid")
        return ProbedTable("pgbench_accounts", shape, keys)


def make_load(kind: LoadKind, run: int, connections: int, scale: int) -> Load:
    if kind is LoadKind.PGBENCH:
        return PgbenchLoad(scale, connections)
    return OrdersLoad(run, connections)
