"""An ``orders`` table in a real PostgreSQL database, changed by SQL transactions: the upstream of
the demo on the real source and of the real source's latency bench.

The table has the shape of the synthetic demo's (``id``, ``region``, ``status``, ``amount``,
``updated_at``; partitioned downstream by region and day), at PostgreSQL's default REPLICA
IDENTITY. A transaction holds one to three statements: inserts, updates and deletes of one row or
of several in one statement. Updates stamp the row with the current day, moving it into today's
partition, and some change its region too. A share of transactions rolls back. Rows change soon
after they are placed: updates and deletes pick among the newest ``recent_keys`` ids, which may
already be deleted, and then change nothing, as a statement of an application would.

Nothing here models the table's state: the database is the truth, and whoever checks a copy of
the table compares it with ``SELECT *``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

COLUMNS = ("id", "region", "status", "amount", "updated_at")
REGIONS = ("eu", "us", "apac", "latam")
STATUSES = ("new", "paid", "shipped", "returned")
START = dt.datetime(2025, 1, 1)
# When a statement stamps rows with its own moment (the latency bench): the statement's clock in
# UTC, within a millisecond of its transaction's commit in an autocommit session.
CLOCK = "clock_timestamp() AT TIME ZONE 'UTC'"


class Statement(str, Enum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass
class TransactionCounts:
    """What a workload has done so far."""

    committed: int = 0
    rolled_back: int = 0
    statements: dict[Statement, int] = field(default_factory=lambda: dict.fromkeys(Statement, 0))
    # Rows the committed statements changed, as PostgreSQL counted them.
    rows_changed: int = 0

    def describe(self) -> str:
        kinds = ", ".join(f"{count} {kind.value}s" for kind, count in self.statements.items())
        return (
            f"{self.committed} transactions committed ({kinds}; {self.rows_changed} rows changed), {self.rolled_back} rolled back"
        )


class _Rollback(Exception):
    """Ends a transaction the workload chose to roll back."""


@dataclass
class OrdersTransactions:
    """The workload on ``table``; ``create`` and ``load`` it, then run ``transactions``."""

    table: str = "orders"
    seed: int = 7
    # Loaded rows fall on one of the first ``days`` days; later rows, and updated ones, on
    # ``today`` (the stream's present, which the demo moves forward so older days cool down).
    days: int = 3
    today: int = 3
    recent_keys: int = 1_000
    # Shares of statements; deletes are the rest.
    updates: float = 0.7
    inserts: float = 0.2
    # Of updates, the share that also moves the row to another region.
    region_moves: float = 0.3
    # Of statements, the share that changes several rows (2 to 5) at once.
    multi_row: float = 0.2
    max_statements: int = 3
    rollback_share: float = 0.03
    # Stamp rows with the statement's clock (CLOCK) instead of a moment of ``today``.
    clock: bool = False
    counts: TransactionCounts = field(default_factory=TransactionCounts)
    next_key: int = 1

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        # Keys from here on are this workload's (several may share a table, each with its own range).
        self._first_key = self.next_key

    def create(self, db: psycopg.Connection[Any]) -> None:
        db.execute(
            f"CREATE TABLE {self.table} (id bigint PRIMARY KEY, region text NOT NULL, status text NOT NULL, "
            "amount numeric(12, 2) NOT NULL, updated_at timestamp NOT NULL)"
        )

    def _moment(self, day: int) -> dt.datetime:
        return START + dt.timedelta(days=day, seconds=self._random.randrange(86_400))

    def _amount(self) -> Decimal:
        return Decimal(self._random.randrange(100, 1_000_000)) / 100

    def load(self, db: psycopg.Connection[Any], count: int) -> None:
        """``count`` rows over the first ``days`` days, in one COPY (what Debezium's snapshot reads)."""
        r = self._random
        with db.cursor().copy(f"COPY {self.table} ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for _ in range(count):
                key, self.next_key = self.next_key, self.next_key + 1
                copy.write_row((key, r.choice(REGIONS), r.choice(STATUSES), self._amount(), self._moment(r.randrange(self.days))))

    def _recent(self, count: int) -> list[int]:
        lowest = max(self._first_key, self.next_key - self.recent_keys)
        return [self._random.randrange(lowest, self.next_key) for _ in range(count)] if self.next_key > lowest else []

    def _statement(self) -> tuple[Statement, str, Sequence[Any]]:
        r = self._random
        rows = r.randint(2, 5) if r.random() < self.multi_row else 1
        draw = r.random()
        # The rows a statement stamps share its moment.
        stamp, moment = (CLOCK, []) if self.clock else ("%s", [self._moment(self.today)])
        if self.next_key == self._first_key or self.updates <= draw < self.updates + self.inserts:
            params: list[Any] = []
            for key in range(self.next_key, self.next_key + rows):
                params += [key, r.choice(REGIONS), r.choice(STATUSES), self._amount(), *moment]
            self.next_key += rows
            values = ", ".join([f"(%s, %s, %s, %s, {stamp})"] * rows)
            return Statement.INSERT, f"INSERT INTO {self.table} ({', '.join(COLUMNS)}) VALUES {values}", params
        keys = self._recent(rows)
        if draw >= self.updates:
            return Statement.DELETE, f"DELETE FROM {self.table} WHERE id = ANY(%s)", [keys]
        if r.random() < self.region_moves:
            sql = f"UPDATE {self.table} SET region = %s, status = %s, updated_at = {stamp} WHERE id = ANY(%s)"
            return Statement.UPDATE, sql, [r.choice(REGIONS), r.choice(STATUSES), *moment, keys]
        sql = f"UPDATE {self.table} SET status = %s, amount = amount + %s, updated_at = {stamp} WHERE id = ANY(%s)"
        return Statement.UPDATE, sql, [r.choice(STATUSES), self._amount(), *moment, keys]

    def transaction(self, db: psycopg.Connection[Any]) -> None:
        """One transaction of one to ``max_statements`` statements, rolled back at times. ``db``
        is in autocommit mode: a transaction of one statement is that statement alone, as an
        application's would be (no BEGIN and COMMIT round trips)."""
        statements = [self._statement() for _ in range(self._random.randint(1, self.max_statements))]
        rollback = self._random.random() < self.rollback_share
        changed = 0
        try:
            with contextlib.nullcontext() if len(statements) == 1 and not rollback else db.transaction():
                for _kind, sql, params in statements:
                    changed += db.execute(sql, params).rowcount
                if rollback:
                    raise _Rollback
        except _Rollback:
            self.counts.rolled_back += 1
            return
        self.counts.committed += 1
        self.counts.rows_changed += changed
        for kind, _sql, _params in statements:
            self.counts.statements[kind] += 1

    def transactions(self, db: psycopg.Connection[Any], count: int) -> None:
        for _ in range(count):
            self.transaction(db)


def table_rows(db: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    """The table's rows as ``SELECT *`` returns them, in key order."""
    return [tuple(row) for row in db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()]
