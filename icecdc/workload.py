"""A synthetic upstream table that emits Debezium change events, for the demo and the
benchmarks: inserts, updates (some moving rows to another partition) and deletes in a chosen
mix, with the state those changes imply kept alongside so results can be checked."""

from __future__ import annotations

import datetime as dt
import itertools
import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import pandas as pd

ORDERS_SCHEMA = {"id": "long", "region": "string", "status": "string", "amount": "decimal(12, 2)", "updated_at": "timestamp"}
ORDERS_PARTITIONING = ["region", "days(updated_at)"]
REGIONS = ("eu", "us", "apac", "latam")
STATUSES = ("new", "paid", "shipped", "returned")
START = dt.datetime(2025, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)
# A wide text column's values are slices of this (letters drawn once): as compressible as prose
# is not, so a partition's bytes grow with its rows as a user's wide table's do.
_TEXT = "".join(random.Random(0).choices("abcdefghijklmnopqrstuvwxyz ", k=1 << 20))


def _dumps(value: Any) -> bytes:
    # Copied to its size: orjson's bytes keep the 4 KB buffer they were written in (a key's
    # dozen bytes too), and a bench's initial load holds hundreds of thousands of records.
    return bytes(memoryview(orjson.dumps(value)))


def orders_table(name: str, topic: str, *, note: bool = False) -> dict[str, Any]:
    """``note``: with the wide text column ``OrdersWorkload(note_chars=...)`` fills."""
    # This source sends every column of the old row with each update and delete.
    return {
        "name": name,
        "topic": topic,
        "primary_key": ["id"],
        "partition_by": ORDERS_PARTITIONING,
        "schema": {**ORDERS_SCHEMA, "note": "string"} if note else ORDERS_SCHEMA,
        "before_image": "full",
    }


@dataclass(frozen=True)
class Change:
    op: str  # c, u, d
    key: int
    row: dict[str, Any] | None  # after-image (None for deletes)
    record: tuple[bytes, bytes]  # the Debezium record (key, value)


@dataclass
class OrdersWorkload:
    """An ``orders`` table changing over simulated days; ``rows`` is its current state."""

    seed: int = 7
    # New rows are stamped on a random one of the first ``days`` days, or on ``today`` when set
    # (the stream's present, which the demo moves forward so that older days cool down).
    days: int = 3
    today: int | None = None
    # When > 0, updates and deletes pick among the newest this many keys: orders change soon
    # after they are placed, so a day's partition stops being written a while after that day.
    recent_keys: int = 0
    # The share of updates and deletes that pick among all keys instead: late changes to rows
    # of days long past (a refund, a correction), which reopen partitions that had settled.
    late_share: float = 0.0
    # When > 0, every row has a ``note`` of this many characters, which an update keeps with
    # probability ``note_keep`` (a wide column most changes leave alone, like a description).
    note_chars: int = 0
    note_keep: float = 0.0
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    next_key: int = 1

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._notes: dict[int, str] = {}

    def _row(self, key: int) -> dict[str, Any]:
        r = self._random
        day = r.randrange(self.days) if self.today is None else self.today
        moment = START + dt.timedelta(days=day, seconds=r.randrange(86_400))
        row = {
            "id": key,
            "region": r.choice(REGIONS),
            "status": r.choice(STATUSES),
            "amount": f"{r.randrange(100, 1_000_000) / 100:.2f}",
            "updated_at": (moment - _EPOCH) // dt.timedelta(microseconds=1),
        }
        if self.note_chars:
            row["note"] = self._note(r.randrange(len(_TEXT) - self.note_chars))
        return row

    def _note(self, start: int) -> str:
        # One string per slice, shared by the rows that drew it: at users' partition sizes
        # (millions of rows) the notes would otherwise be most of the model's memory.
        note = self._notes.get(start)
        if note is None:
            note = self._notes[start] = _TEXT[start : start + self.note_chars]
        return note

    def _record(self, op: str, key: int, before: dict[str, Any] | None, after: dict[str, Any] | None) -> tuple[bytes, bytes]:
        value = {
            "op": op,
            "before": before,
            "after": after,
            "source": {"connector": "icecdc-workload"},
            "ts_ms": self._random.randrange(1 << 40),
        }
        return _dumps({"id": key}), _dumps(value)

    def insert(self) -> Change:
        key, self.next_key = self.next_key, self.next_key + 1
        row = self._row(key)
        self.rows[key] = row
        return Change("c", key, row, self._record("c", key, None, row))

    def update(self) -> Change:
        key = self._pick()
        before = self.rows[key]
        after = {**self._row(key), "id": key}
        if self.note_chars and self._random.random() < self.note_keep:
            after["note"] = before["note"]
        self.rows[key] = after
        return Change("u", key, after, self._record("u", key, before, after))

    def delete(self) -> Change:
        key = self._pick()
        before = self.rows.pop(key)
        return Change("d", key, None, self._record("d", key, before, None))

    def _pick(self) -> int:
        # An existing key without listing them all: retry random ids until one exists (callers
        # only pick when rows is non-empty); among the recent keys first, then among all.
        late = self.late_share and self._random.random() < self.late_share
        lowest = max(1, self.next_key - self.recent_keys) if self.recent_keys and not late else 1
        for attempt in itertools.count():
            key = self._random.randrange(lowest if attempt < 100 else 1, self.next_key)
            if key in self.rows:
                return key
        raise AssertionError("unreachable")

    def sample_keys(self, rng: random.Random, count: int) -> list[int]:
        """``count`` distinct keys of the current rows (all of them when there are fewer), drawn
        by ``rng`` without listing the rows when they are many."""
        if count * 4 >= len(self.rows):
            return rng.sample(sorted(self.rows), min(count, len(self.rows)))
        picked: dict[int, None] = {}
        while len(picked) < count:
            key = rng.randrange(1, self.next_key)
            if key in self.rows:
                picked[key] = None
        return list(picked)

    def load(self, count: int) -> list[Change]:
        return [self.insert() for _ in range(count)]

    def changes(self, count: int, updates: float = 0.7, inserts: float = 0.2) -> list[Change]:
        """``count`` changes: the given shares of updates and inserts, deletes for the rest."""
        out = []
        for _ in range(count):
            draw = self._random.random()
            if not self.rows or (draw >= updates and draw < updates + inserts):
                out.append(self.insert())
            elif draw < updates:
                out.append(self.update())
            else:
                out.append(self.delete())
        return out

    def expected_frame(self) -> pd.DataFrame:
        """``expected_rows`` as a pandas frame, column by column (no row tuples: the model may
        hold millions of rows), for Spark to compare with a table."""
        import pandas as pd

        rows = self.rows.values()
        return pd.DataFrame(
            {
                "id": pd.array([r["id"] for r in rows], dtype="int64"),
                "region": [r["region"] for r in rows],
                "status": [r["status"] for r in rows],
                "amount": [Decimal(r["amount"]) for r in rows],
                "updated_at": pd.to_datetime([r["updated_at"] for r in rows], unit="us"),
            }
        )

    def expected_rows(self) -> list[tuple[Any, ...]]:
        """The current state as Spark returns it (Decimal amounts, naive UTC datetimes)."""
        return sorted(
            (r["id"], r["region"], r["status"], Decimal(r["amount"]), _EPOCH + dt.timedelta(microseconds=r["updated_at"]))
            for r in self.rows.values()
        )
