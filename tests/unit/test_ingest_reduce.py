"""The write stage's reduce over Arrow columns (``ingest/reduce.py``) against the per-key rule
(``batch.reduce_key``), on random change rows as the parse stage sends them: keys changed any
number of times, rows moving between partitions, old partitions unknown (global deletes), and
keys whose changes are not plain mixed in (they go the per-key way)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.ingest.batch import KeyChange, reduce_key
from icecdc.ingest.fastparse import change_columns, key_text
from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.reduce import GLOBAL_PARTITION, KeyGroups, append_rows, plain_rows, reduce_plain_keys
from icecdc.ingest.stage_rows import PARSED

LAYOUT = TableLayout(
    "db.t",
    "t",
    (Column("id", "long", True), Column("name", "string", True), Column("region", "string"), Column("amount", "decimal(9, 2)")),
    {"id": 1, "name": 2, "region": 3, "amount": 4},
    ("id", "name"),
    (PartitionTerm("region", "region", "identity", "string", 1000),),
    0,
    "/w",
)
REGIONS = ("eu", "us", None)


@st.composite
def changes(draw: st.DrawFn) -> KeyChange:
    op = draw(st.sampled_from(["c", "r", "u", "d"]))
    after = None
    if op != "d":
        after = {"id": 0, "name": "", "region": draw(st.sampled_from(REGIONS)), "amount": draw(st.sampled_from(["1.00", None]))}
    new = (after["region"],) if after is not None else None
    if op in ("c", "r"):
        return KeyChange(op, after, (new,) if new else ())
    if draw(st.integers(0, 4)) == 0:
        return KeyChange(op, after, (), global_delete=True)
    old = (draw(st.sampled_from(REGIONS)),)
    return KeyChange(op, after, (old,) if new in (None, old) else (old, new))


def _rows(history: dict[tuple[int, str], list[KeyChange]], special: set[tuple[int, str]]) -> pa.Table:
    rows = []
    offset = 0
    for (id_, name), key_changes in sorted(history.items(), key=lambda item: key_text(LAYOUT.primary_key, item[0])):
        for change in key_changes:
            after = {**change.after, "id": id_, "name": name} if change.after is not None else None
            change = KeyChange(change.op, after, change.prior_partitions, change.global_delete)
            offset += 1
            rows.append(
                {
                    "table": LAYOUT.table,
                    "kafka_partition": 0,
                    "offset": offset,
                    "op": change.op,
                    "key": key_text(LAYOUT.primary_key, (id_, name)),
                    **change_columns(LAYOUT, change),
                    "change": orjson.dumps({"unavailable": []}) if (id_, name) in special else None,
                }
            )
    return pa.Table.from_pylist(rows, schema=PARSED)


def _expected(history: dict[tuple[int, str], list[KeyChange]], special: set[tuple[int, str]]) -> dict[Any, list[Any]]:
    files: dict[Any, list[Any]] = defaultdict(list)
    for key, key_changes in history.items():
        if key in special:
            continue
        id_, name = key
        fixed = [
            KeyChange(c.op, {**c.after, "id": id_, "name": name} if c.after else None, c.prior_partitions, c.global_delete)
            for c in key_changes
        ]
        result = reduce_key(fixed, key)
        key_row = {"id": id_, "name": name}
        if result.row is not None:
            files[orjson.dumps(LAYOUT.partition_of(result.row)).decode(), FileKind.DATA].append(result.row)
        if result.global_delete:
            files[GLOBAL_PARTITION, FileKind.GLOBAL_DELETE].append(key_row)
        for partition in result.delete_partitions:
            files[orjson.dumps(partition).decode(), FileKind.DELETE].append(key_row)
    return {where: sorted(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows) for where, rows in files.items()}


keys = st.tuples(st.integers(-3, 40), st.sampled_from(["a", "b", 'q"uote', "é"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=st.dictionaries(keys, st.lists(changes(), min_size=1, max_size=5), max_size=30),
    special_share=st.integers(0, 3),
)
def test_the_columnar_reduce_writes_what_the_per_key_rule_does(
    history: dict[tuple[int, str], list[KeyChange]], special_share: int
) -> None:
    special = {key for i, key in enumerate(sorted(history)) if special_share and i % 4 < special_share - 1}
    rows = _rows(history, special)
    plain = plain_rows(rows)
    assert sum(plain.to_pylist()) == sum(len(c) for k, c in history.items() if k not in special)
    files = reduce_plain_keys(LAYOUT, rows.filter(plain))
    got = {
        where: sorted(orjson.dumps(_canonical(r), option=orjson.OPT_SORT_KEYS) for r in arrow.to_pylist())
        for where, arrow in files.items()
    }
    assert got == _expected(history, special)


def _canonical(row: dict[str, Any]) -> dict[str, Any]:
    return {name: str(value) if name == "amount" and value is not None else value for name, value in row.items()}


def test_key_groups_follow_the_key_column() -> None:
    groups = KeyGroups.of(pa.array(["a", "a", "b", "c", "c", "c"]))
    assert groups.group.tolist() == [0, 0, 1, 2, 2, 2]
    assert groups.ends.tolist() == [False, True, True, False, False, True]
    assert groups.any(pa.array([False, True, False, None, False, False])).tolist() == [True, False, False]
    assert KeyGroups.of(pa.array([], pa.string())).count == 0


def test_a_table_without_a_primary_key_keeps_every_row_two_equal_ones_too() -> None:
    keyless = TableLayout(
        LAYOUT.table, LAYOUT.topic, LAYOUT.columns, LAYOUT.field_ids, (), LAYOUT.partition, 0, LAYOUT.data_location
    )
    images = [
        {"id": 1, "name": "a", "region": "eu", "amount": "1.00"},
        {"id": 1, "name": "a", "region": "eu", "amount": "1.00"},  # the same row again: a second row
        {"id": 2, "name": "b", "region": "us", "amount": None},
        {"id": 3, "name": "c", "region": None, "amount": "2.50"},
    ]
    rows = pa.Table.from_pylist(
        [
            {
                "table": keyless.table,
                "kafka_partition": 0,
                "offset": offset,
                "op": "c" if offset % 2 else "r",
                "key": key_text((), ()),
                **change_columns(keyless, KeyChange("c", image, ())),
            }
            for offset, image in enumerate(images)
        ],
        schema=PARSED,
    )
    files = append_rows(keyless, rows)
    assert set(files) == {('["eu"]', FileKind.DATA), ('["us"]', FileKind.DATA), ("[null]", FileKind.DATA)}
    got = sorted(orjson.dumps(_canonical(r), option=orjson.OPT_SORT_KEYS) for arrow in files.values() for r in arrow.to_pylist())
    assert got == sorted(orjson.dumps(_canonical(r), option=orjson.OPT_SORT_KEYS) for r in images)
    assert files['["eu"]', FileKind.DATA].num_rows == 2
