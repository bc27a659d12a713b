"""Values the source did not send (Debezium's placeholder for an unchanged TOAST value): detected
at parse, folded per key, resolved on the driver from the key's earlier version. The batches run
through the product's own job as it runs in the driver (``ingest/job.py``: the stages of
``ingest/stages.py``, Parquet files in a temporary directory, no Spark) and its ``BatchRunner``, over a table model that applies the committed files
and answers the writer's key lookups; the property test holds random histories, split into random
batches, to the rows the statements imply."""

from __future__ import annotations

import base64
import datetime as dt
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import count, pairwise
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, LongType, NestedField, StringType

from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.domain.sourcespec import SourceRules, UnavailableValues
from icecdc.ingest.batch import Image, KeyChange, Moved, reduce_key
from icecdc.ingest.batch_decisions import WriteSpread
from icecdc.ingest.debezium import (
    NEW_KEY_HEADER,
    OLD_KEY_HEADER,
    UNAVAILABLE_PLACEHOLDER,
    UNAVAILABLE_PLACEHOLDER_BASE64,
    Reason,
    key_from_header,
    unavailable_columns,
)
from icecdc.ingest.job import BatchJob
from icecdc.ingest.records import PolledRecords
from icecdc.ingest.unavailable import (
    KEEP_MOVES_BATCHES,
    MovedImage,
    PendingMoves,
    SourceRecord,
    UnresolvedRow,
    resolve,
    rows_to_read,
)
from icecdc.ingest.writer import BatchRunner
from icecdc.jvm.tables import CommittedSnapshot
from icecdc.runtime.config import TableConfig

TABLE, TOPIC = "db.items", "pg.public.items"
COLUMNS = (
    Column("id", "long", True),
    Column("region", "string"),
    Column("qty", "long"),
    Column("notes", "string"),
    Column("blob", "binary"),
)
WIDE = ("notes", "blob")


def items_layout(directory: Path) -> TableLayout:
    types = {"long": LongType(), "string": StringType(), "binary": BinaryType()}
    schema = Schema(*(NestedField(i, c.name, types[c.type], required=c.required) for i, c in enumerate(COLUMNS, start=1)))
    return TableLayout(
        TABLE,
        TOPIC,
        COLUMNS,
        {c.name: i for i, c in enumerate(COLUMNS, start=1)},
        ("id",),
        (PartitionTerm("region", "region", "identity", "string", 1000),),
        0,
        str(directory),
        schema.model_dump_json(),
        global_spec_id=1,
    )


# ---- Debezium records, as the real connector sends them under REPLICA IDENTITY DEFAULT ----


@dataclass
class Source:
    """A PostgreSQL table and the records its statements make the connector send."""

    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    offsets: Iterator[int] = field(default_factory=count)

    def _send(self, key: int, value: dict[str, Any] | None, headers: dict[str, int] | None = None) -> None:
        self.records.append(
            {
                "key": orjson.dumps({"id": key}),
                "value": None if value is None else orjson.dumps(value),
                "topic": TOPIC,
                "partition": 0,
                "offset": next(self.offsets),
                "timestamp": dt.datetime(2026, 1, 1),
                "timestampType": 0,
                "headers": [{"key": k, "value": orjson.dumps({"id": v})} for k, v in (headers or {}).items()],
            }
        )

    def insert(self, key: int, region: str, notes: str | None, blob: bytes | None) -> None:
        row = {"id": key, "region": region, "qty": 0, "notes": notes, "blob": _b64(blob)}
        self.rows[key] = row
        self._send(key, {"op": "c", "before": None, "after": row})

    def update(self, key: int, *, qty: int, region: str | None = None, **wide: Any) -> None:
        """``wide`` sets notes or blob; those not given are left alone (sent as the placeholder)."""
        row = self.rows[key] | {"qty": qty} | ({"region": region} if region else {})
        row |= {name: _b64(value) if name == "blob" else value for name, value in wide.items()}
        self.rows[key] = row
        self._send(key, {"op": "u", "before": None, "after": _unsent(row, set(WIDE) - set(wide))})

    def delete(self, key: int) -> None:
        row = self.rows.pop(key)
        self._send(key, {"op": "d", "before": {"id": key}, "after": None})
        self._send(key, None)
        assert row

    def change_key(self, old: int, new: int) -> None:
        """UPDATE ... SET id = new: delete + tombstone of the old key, create of the new one
        with the wide values it did not touch as placeholders."""
        row = self.rows.pop(old) | {"id": new}
        self.rows[new] = row
        self._send(old, {"op": "d", "before": {"id": old}, "after": None}, {NEW_KEY_HEADER: new})
        self._send(old, None)
        self._send(new, {"op": "c", "before": None, "after": _unsent(row, set(WIDE))}, {OLD_KEY_HEADER: old})


def _b64(blob: bytes | None) -> str | None:
    return None if blob is None else base64.b64encode(blob).decode()


def _unsent(row: dict[str, Any], left_alone: set[str]) -> dict[str, Any]:
    """Debezium's after-image: values stored out of line that the statement left alone are the
    placeholder (nulls are not stored out of line)."""
    placeholders = {"notes": UNAVAILABLE_PLACEHOLDER, "blob": UNAVAILABLE_PLACEHOLDER_BASE64}
    return {k: placeholders[k] if k in left_alone and v is not None else v for k, v in row.items()}


# ---- the ingester over a table model ----


def _file_rows(description: str) -> list[dict[str, Any]]:
    rows = pq.read_table(orjson.loads(description)["file-path"]).to_pylist()
    return [{k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in r.items()} for r in rows]


class ModelTable:
    """The table's rows as its commits leave them (an equality delete of a commit never hits the
    commit's own data), and the writer's key lookup: the rows of a snapshot, or the current rows
    and, for a key they lack, the rows before the last commit (``IcebergTable.key_rows``)."""

    def __init__(self) -> None:
        self.rows: dict[tuple, dict[str, Any]] = {}
        self.snapshots: dict[int, dict[tuple, dict[str, Any]]] = {}  # snapshot id -> its rows
        self.summaries: list[dict[str, str]] = []
        self.lookups: list[set[tuple]] = []

    def summaries_back_to(self, key):
        return list(reversed(self.summaries))

    def commit_files(self, what, data, deletes, summary) -> CommittedSnapshot:
        for description in deletes:
            for key in _file_rows(description):
                self.rows.pop((key["id"],), None)
        for description in data:
            for row in _file_rows(description):
                assert (row["id"],) not in self.rows, "one version of a key per commit"
                self.rows[(row["id"],)] = row
        self.summaries.append(dict(summary))
        n = len(self.summaries)
        self.snapshots[n] = dict(self.rows)
        return CommittedSnapshot(n, n - 1 or None, n, 0, "overwrite")

    def key_rows(self, key_columns, keys, columns, snapshot_id=None):
        self.lookups.append(set(keys))
        if snapshot_id is None:
            before_last = self.snapshots.get(len(self.summaries) - 1, {})
            found = {k: self.rows.get(k) or before_last.get(k) for k in keys}
        else:
            found = {k: self.snapshots[snapshot_id].get(k) for k in keys}
        return {k: {c: row[c] for c in columns} for k, row in found.items() if row is not None}

    def commit_truncate(self, what, data, summary):
        raise AssertionError("no truncates here")

    def delete_files(self, paths):
        return list(paths)

    def add_column(self, name, iceberg_type):
        return False

    def widen_column(self, name, iceberg_type):
        return False

    def ensure_unpartitioned_spec(self):
        return 1


class Ingester:
    def __init__(self, directory: Path, mode: UnavailableValues = UnavailableValues.RESOLVE) -> None:
        self.table = ModelTable()
        self.letters: list = []
        self.layout = items_layout(directory)
        rules = {TABLE: SourceRules(unavailable_values=mode)}
        self.pool = ThreadPoolExecutor(1)
        self.runner = BatchRunner(
            tables={TABLE: self.table},
            layouts={TABLE: self.layout},
            rules=rules,
            job=BatchJob(rules, {}, WriteSpread(1), parse_tasks=1, driver_batch_records=1_000_000),
            dead_letters=self,
            events=self,
            load_layout=lambda name: self.layout,
            commit_pool=self.pool,
            failpoint=lambda name: None,
        )
        self.batches = 0

    def send(self, letters) -> int:
        self.letters += letters
        return len(letters)

    def publish(self, event) -> None:
        pass

    def ingest(self, records: list[dict[str, Any]]) -> None:
        self.batches += 1
        self.runner.run(PolledRecords(None, records), self.batches)  # in the driver: no Spark here

    def rows(self) -> dict[int, dict[str, Any]]:
        return {k[0]: row for k, row in self.table.rows.items()}


@pytest.fixture
def ingester(tmp_path) -> Iterator[Ingester]:
    made = Ingester(tmp_path)
    yield made
    made.pool.shutdown()


WIDE_TEXT = "x" * 9000


def test_an_update_that_leaves_a_wide_value_alone_keeps_it_and_reads_only_its_key(ingester):
    source = Source()
    source.insert(1, "eu", WIDE_TEXT, b"\x00\x01" * 5000)
    source.insert(2, "us", "other", None)
    ingester.ingest(source.records)
    first = len(source.records)
    source.update(1, qty=5, region="us")  # moves partition; notes and blob unsent
    source.update(2, qty=7, notes="set")
    ingester.ingest(source.records[first:])

    assert ingester.rows() == source.rows
    assert ingester.table.lookups == [{(1,)}], "only the key whose values the batch lacked is read"
    assert len(ingester.table.summaries) == 2, "the completed row is in its batch's one commit"
    assert ingester.letters == []


def test_an_earlier_change_in_the_batch_resolves_without_a_read(ingester):
    source = Source()
    source.insert(1, "eu", WIDE_TEXT, None)
    source.update(1, qty=1)
    source.update(1, qty=2, notes="new")
    source.update(1, qty=3)
    ingester.ingest(source.records)
    assert ingester.rows() == source.rows
    assert ingester.table.lookups == []


def test_a_key_change_takes_the_old_keys_image_of_the_batch_not_the_stale_table(ingester):
    source = Source()
    source.insert(1, "eu", "before", b"old")
    ingester.ingest(source.records)
    first = len(source.records)
    source.update(1, qty=1, notes=WIDE_TEXT)  # the table still says "before"
    source.change_key(1, 10)
    source.update(10, qty=2)
    ingester.ingest(source.records[first:])
    assert ingester.rows() == source.rows and ingester.rows()[10]["notes"] == WIDE_TEXT
    assert ingester.letters == []


def test_two_moves_between_the_same_keys_in_one_batch_each_keep_their_own_values(ingester):
    """1 -> 0, 0 -> 2, then a new row 1 -> 0, in one batch: the row at 2 has the first row's
    values, the row at 0 the second's. The property test below found both taking the later move's."""
    source = Source()
    source.insert(1, "eu", "first", b"first")
    source.change_key(1, 0)
    source.insert(1, "us", "second", b"second")
    source.change_key(0, 2)
    source.change_key(1, 0)
    ingester.ingest(source.records)
    assert ingester.letters == [] and ingester.rows() == source.rows
    assert (ingester.rows()[2]["notes"], ingester.rows()[0]["notes"]) == ("first", "second")


def test_a_row_moved_back_and_forth_in_one_batch_keeps_its_values(ingester):
    """2 -> 0, 0 -> 2, 2 -> 0: each move is followed once (the property test below found the
    third taken for a loop and the row dead-lettered)."""
    source = Source()
    source.insert(2, "eu", "kept", b"kept")
    for old, new in ((2, 0), (0, 2), (2, 0)):
        source.change_key(old, new)
    ingester.ingest(source.records)
    assert ingester.letters == [] and ingester.rows() == source.rows
    assert ingester.rows()[0]["notes"] == "kept"


@pytest.mark.parametrize("updated_before_the_move", [False, True])
@pytest.mark.parametrize("tombstone_alone", [False, True])
def test_a_key_change_split_by_batch_boundaries_keeps_its_values(ingester, updated_before_the_move, tombstone_alone):
    """The create of a key change in the batch after its delete, or with its tombstone in a batch
    of its own between them: the create's batch reads the old key as the delete's batch found it
    (the snapshot before it), or takes its image. The random histories split into batches found
    the three-batch case dead-lettered or given an older value."""
    source = Source()
    source.insert(1, "eu", "committed", b"blob")
    ingester.ingest(source.records)
    first = len(source.records)
    if updated_before_the_move:
        source.update(1, qty=1, notes=WIDE_TEXT)
    source.change_key(1, 10)
    *delete, tombstone, create = source.records[first:]
    if tombstone_alone:
        source.insert(2, "us", "other", None)  # with the tombstone: its batch commits
        create |= {"offset": next(source.offsets)}
        batches = [delete, [tombstone, source.records[-1]], [create]]
    else:
        batches = [[*delete, tombstone], [create]]
    for batch in batches:
        ingester.ingest(batch)
    assert ingester.letters == [] and ingester.rows() == source.rows
    assert ingester.rows()[10]["notes"] == (WIDE_TEXT if updated_before_the_move else "committed")


def test_a_key_changes_create_later_than_its_images_are_kept_is_dead_lettered_not_guessed(ingester):
    source = Source()
    source.insert(1, "eu", "committed", b"blob")
    source.change_key(1, 10)
    *moved, create = source.records
    ingester.ingest(moved)
    for n in range(KEEP_MOVES_BATCHES):  # batches of other keys
        source.insert(100 + n, "us", "other", None)
        ingester.ingest(source.records[-1:])
    ingester.ingest([create | {"offset": next(source.offsets)}])
    (letter,) = ingester.letters
    assert letter.reason == "unavailable-value" and "no earlier version" in letter.detail
    assert 10 not in ingester.rows() and 1 not in ingester.rows()


def test_a_row_with_no_earlier_version_is_dead_lettered_and_the_rest_committed(ingester):
    source = Source()
    source.insert(1, "eu", "kept", None)
    source.rows[2] = {"id": 2, "region": "eu", "qty": 0, "notes": "never seen", "blob": None}
    source.update(2, qty=1)  # its insert predates what the ingester read
    ingester.ingest(source.records)

    (letter,) = ingester.letters
    assert letter.reason == Reason.UNAVAILABLE_VALUE == "unavailable-value"
    assert "['notes']" in letter.detail and "no earlier version" in letter.detail
    assert letter.offset == 1 and orjson.loads(letter.value)["after"]["notes"] == UNAVAILABLE_PLACEHOLDER
    assert ingester.rows() == {1: source.rows[1]}
    assert ingester.table.summaries, "the batch committed its offsets"


def test_dead_letter_mode_rejects_the_changes_that_carry_the_placeholder(tmp_path):
    ingester = Ingester(tmp_path, UnavailableValues.DEAD_LETTER)
    source = Source()
    source.insert(1, "eu", WIDE_TEXT, b"blob")
    source.update(1, qty=1)
    source.update(1, qty=2, notes="set", blob=b"set")
    ingester.ingest(source.records)
    (letter,) = ingester.letters
    assert letter.reason == "unavailable-value" and letter.offset == 1
    assert "['blob', 'notes']" in letter.detail and "unavailable_values is dead-letter" in letter.detail
    assert ingester.rows() == source.rows
    ingester.pool.shutdown()


def test_keep_placeholder_writes_what_came(tmp_path):
    ingester = Ingester(tmp_path, UnavailableValues.KEEP_PLACEHOLDER)
    source = Source()
    source.insert(1, "eu", WIDE_TEXT, None)
    source.update(1, qty=1)
    ingester.ingest(source.records)
    assert ingester.rows()[1]["notes"] == UNAVAILABLE_PLACEHOLDER
    assert ingester.table.lookups == [] and ingester.letters == []
    ingester.pool.shutdown()


# ---- the pure parts ----


def test_placeholders_are_found_in_text_and_binary_columns_only():
    after = {"id": 1, "region": UNAVAILABLE_PLACEHOLDER, "notes": UNAVAILABLE_PLACEHOLDER, "blob": UNAVAILABLE_PLACEHOLDER_BASE64}
    assert unavailable_columns(after, COLUMNS) == {"region", "notes", "blob"}
    assert unavailable_columns({"id": 1, "notes": "x", "blob": None}, COLUMNS) == frozenset()
    assert unavailable_columns({"id": 1, "qty": 5, "blob": UNAVAILABLE_PLACEHOLDER}, COLUMNS) == frozenset(), (
        "a binary column's placeholder is its bytes in base64"
    )


def test_key_change_headers_are_read_wrapped_or_not():
    assert key_from_header(b'{"id": 4}', COLUMNS, ("id",)) == (4,)
    assert key_from_header(b'{"schema": {}, "payload": {"id": 4}}', COLUMNS, ("id",)) == (4,)
    assert key_from_header(b"not json", COLUMNS, ("id",)) is None
    assert key_from_header(None, COLUMNS, ("id",)) is None


def _change(op: str, notes: str | None, *, unavailable: bool = False, **kwargs: Any) -> KeyChange:
    after = None if op == "d" else {"id": 1, "region": "eu", "notes": notes}
    return KeyChange(op, after, (("eu",),), unavailable=frozenset({"notes"} if unavailable else ()), **kwargs)


def test_the_fold_takes_a_value_from_the_previous_image_and_leaves_the_rest_unresolved():
    assert reduce_key([_change("c", "a"), _change("u", None, unavailable=True)], (1,)).row["notes"] == "a"
    result = reduce_key([_change("u", None, unavailable=True), _change("u", None, unavailable=True)], (1,))
    assert (result.row["notes"], result.unresolved, result.source) == (None, {"notes"}, (1,))
    after_delete = reduce_key([_change("d", None), _change("u", None, unavailable=True)], (1,))
    assert after_delete.unresolved == {"notes"} and after_delete.source is None, "no earlier version to name"
    moved_in = reduce_key([_change("c", None, unavailable=True, moved_from=(9,))], (1,))
    assert moved_in.source == (9,)
    moved_away = reduce_key([_change("c", "a"), _change("d", None, moved_to=(5,))], (1,))
    assert moved_away.row is None and moved_away.moved == (Moved((5,), Image({"id": 1, "region": "eu", "notes": "a"})),)
    assert reduce_key([_change("d", None, moved_to=(5,))], (1,)).moved == (Moved((5,), None),), "the table's row moved"
    assert reduce_key([_change("d", None), _change("d", None, moved_to=(5,))], (1,)).moved == (), "nothing left to move"


def test_pending_key_changes_leave_when_a_create_took_them_or_after_their_batches():
    pending = PendingMoves(keep_batches=2)
    taken, kept = MovedImage((1,), (2,), None), MovedImage((3,), (4,), Image({"id": 3}))
    pending.advance([taken, kept], 7, [])
    assert [(m.key, m.before) for m in pending.with_batch([])] == [((1,), 7), ((3,), 7)], "with the snapshot found"
    (carried_taken, carried_kept) = pending.with_batch([])
    pending.advance([], 8, [carried_taken])
    assert pending.with_batch([]) == [carried_kept]
    pending.advance([], 9, [])
    assert len(pending) == 0


def test_resolution_follows_key_changes_through_the_batch_then_the_table():
    record = SourceRecord(TOPIC, 0, 0, None, None)
    pending = [UnresolvedRow((3,), Image({"id": 3, "notes": None}, frozenset({"notes"}), (2,)), (), True, record)]
    # 1 -> 2 in the batch, with 1's notes unsent too; 2 -> 3 in the batch
    moved = [
        MovedImage((2,), (3,), Image({"id": 2, "notes": None}, frozenset({"notes"}), (1,))),
        MovedImage((1,), (2,), Image({"id": 1, "notes": None}, frozenset({"notes"}), (1,))),
    ]
    assert rows_to_read(pending, moved) == {((1,), None)}
    done = resolve(pending, moved, {((1,), None): {"notes": "from the table"}})
    assert done.rows == [{"id": 3, "notes": "from the table"}] and done.unresolvable == []
    assert resolve(pending, moved, {}).unresolvable == pending
    swapped = [MovedImage((2,), (3,), Image({"id": 2, "notes": None}, frozenset({"notes"}), (3,)))]
    assert resolve(pending, [*swapped, MovedImage((3,), (2,), swapped[0].image)], {}).unresolvable == pending


def test_the_option_is_per_table_and_resolves_by_default():
    spec = {"name": "db.t", "topic": "t", "primary_key": ["id"]}
    assert TableConfig.model_validate(spec).source_rules.unavailable_values is UnavailableValues.RESOLVE
    for value in ("resolve", "dead-letter", "keep-placeholder"):
        rules = TableConfig.model_validate(spec | {"unavailable_values": value}).source_rules
        assert rules.unavailable_values.value == value
    with pytest.raises(ValueError, match="unavailable_values"):
        TableConfig.model_validate(spec | {"unavailable_values": "guess"})


# ---- random histories ----

statement = st.tuples(
    st.sampled_from(["insert", "update", "update", "update", "delete", "move"]), st.integers(0, 5), st.randoms()
)
key_change_statement = st.tuples(st.sampled_from(["insert", "update", "move", "move"]), st.integers(0, 2), st.randoms())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(statements=st.lists(statement, min_size=1, max_size=40), cuts=st.lists(st.integers(0, 200), max_size=30))
def test_random_histories_in_random_batches_end_exact_and_never_hold_the_placeholder(tmp_path, statements, cuts):
    _check_history(tmp_path, statements, cuts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(statements=st.lists(key_change_statement, min_size=1, max_size=20), cuts=st.lists(st.integers(0, 60), max_size=30))
def test_random_key_changes_among_three_keys_in_random_batches_end_exact(tmp_path, statements, cuts):
    """Rows moved back and forth between few keys, so that one batch moves rows between the same
    two keys more than once (1 -> 0, 0 -> 2, a new 1 -> 0), and batch boundaries fall between a
    key change's delete, tombstone and create: the histories above rarely hold either."""
    _check_history(tmp_path, statements, cuts)


def _check_history(tmp_path: Path, statements: list[tuple[str, int, random.Random]], cuts: list[int]) -> None:
    source = Source()
    for kind, key, rng in statements:
        _apply(source, kind, key, rng)
    ingester = Ingester(tmp_path)
    bounds = sorted({0, len(source.records), *(c for c in cuts if c < len(source.records))})
    for start, end in pairwise(bounds):
        ingester.ingest(source.records[start:end])
    ingester.pool.shutdown()

    assert ingester.letters == []
    assert ingester.rows() == source.rows
    for row in ingester.rows().values():
        assert UNAVAILABLE_PLACEHOLDER not in (row["notes"], row["region"])
        assert row["blob"] != UNAVAILABLE_PLACEHOLDER_BASE64


def _apply(source: Source, kind: str, key: int, rng: random.Random) -> None:
    present = key in source.rows
    notes = rng.choice([None, "short", WIDE_TEXT[: rng.randrange(1, 50)] + str(rng.random())])
    blob = rng.choice([None, rng.randbytes(rng.randrange(1, 20))])
    if kind == "insert" or not present:
        if not present:
            source.insert(key, rng.choice(["eu", "us"]), notes, blob)
    elif kind == "update":
        wide = {name: value for name, value in (("notes", notes), ("blob", blob)) if rng.random() < 0.1}
        source.update(key, qty=rng.randrange(100), region=rng.choice([None, "eu", "us"]), **wide)
    elif kind == "delete":
        source.delete(key)
    else:
        free = [k for k in range(10) if k not in source.rows]
        # Half the time the lowest free key, so that keys are reused within a batch.
        source.change_key(key, free[0] if rng.random() < 0.5 else rng.choice(free))
