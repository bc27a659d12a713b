"""A table's sort order as the compactor reads it (pyiceberg metadata into plain data) and as the
arrow engine applies it: rows sorted by pyarrow agree with Python's own sort of the same rows,
for every direction and null order, and a merge of interleaved files writes one sorted file."""

from __future__ import annotations

import functools

import hypothesis.strategies as st
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from pyiceberg.schema import Schema
from pyiceberg.table import sorting
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestampType

from icecdc.compactor.positions import FileDeletes, key_reader
from icecdc.compactor.row_merge import RowMerge, merge, sorted_rows
from icecdc.domain.layout import sort_order_from_pyiceberg
from icecdc.domain.sort_order import UNSORTED, ArrowSortKey, NullOrder, SortDirection, SortField, SortOrder, sort_order_of
from icecdc.runtime.fileio import FIELD_ID

SCHEMA = Schema(NestedField(1, "id", LongType()), NestedField(2, "region", StringType()), NestedField(3, "at", TimestampType()))


def iceberg_field(source_id: int, transform=None, direction=sorting.SortDirection.ASC, null_order=sorting.NullOrder.NULLS_FIRST):
    return sorting.SortField(
        source_id=source_id, transform=transform or IdentityTransform(), direction=direction, null_order=null_order
    )


def test_a_pyiceberg_sort_order_becomes_plain_data_by_column_name():
    order = sorting.SortOrder(
        iceberg_field(2),
        iceberg_field(1, direction=sorting.SortDirection.DESC, null_order=sorting.NullOrder.NULLS_LAST),
        order_id=3,
    )
    read = sort_order_from_pyiceberg(SCHEMA, order)
    assert read == SortOrder(
        3,
        (
            SortField("region", "identity", SortDirection.ASC, NullOrder.NULLS_FIRST),
            SortField("id", "identity", SortDirection.DESC, NullOrder.NULLS_LAST),
        ),
    )
    assert read.applies and str(read) == "region asc nulls-first, id desc nulls-last"
    assert sort_order_from_pyiceberg(SCHEMA, sorting.UNSORTED_SORT_ORDER) == UNSORTED
    assert not UNSORTED.applies and not UNSORTED.is_sorted


@pytest.mark.parametrize(
    ("fields", "unsupported"),
    [
        ([iceberg_field(1), iceberg_field(1, BucketTransform(4))], "bucket[4](id) asc nulls-first"),
        ([iceberg_field(3, DayTransform())], "day(at) asc nulls-first"),
        ([iceberg_field(9)], "None asc nulls-first"),  # a dropped column
    ],
)
def test_an_order_with_a_transform_other_than_identity_is_kept_but_not_applied(fields, unsupported):
    read = sort_order_from_pyiceberg(SCHEMA, sorting.SortOrder(*fields, order_id=1))
    assert read.is_sorted and not read.applies
    assert ", ".join(map(str, read.unsupported)) == unsupported
    with pytest.raises(ValueError, match="cannot be applied by the arrow engine"):
        read.arrow_keys()


def test_each_field_sorts_by_its_direction_after_a_null_flag_placing_its_nulls():
    order = sort_order_of(1, [("id", "identity", "asc", "nulls-first"), ("region", "identity", "desc", "nulls-last")])
    assert order.arrow_keys() == (
        ArrowSortKey("id", "ascending", "descending"),
        ArrowSortKey("region", "descending", "ascending"),
    )


def _python_key(order: SortOrder, row: dict) -> tuple:
    """An independent model of Iceberg's ordering: per field, nulls first or last, then the value
    in its direction (negated ints for descending)."""
    key = []
    for field in order.fields:
        value = row[field.column]
        null_rank = 0 if (value is None) == (field.null_order is NullOrder.NULLS_FIRST) else 1
        sign = 1 if field.direction is SortDirection.ASC else -1
        key += [null_rank, 0 if value is None else sign * value]
    return tuple(key)


values = st.one_of(st.none(), st.integers(-5, 5))
directions = st.sampled_from(["asc", "desc"])
null_orders = st.sampled_from(["nulls-first", "nulls-last"])


@settings(deadline=None)
@given(
    rows=st.lists(st.tuples(values, values), max_size=40),
    first=st.tuples(directions, null_orders),
    second=st.tuples(directions, null_orders),
)
def test_rows_sorted_by_pyarrow_are_in_the_model_s_order_and_stable(rows, first, second):
    order = sort_order_of(1, [("a", "identity", *first), ("b", "identity", *second)])
    table = pa.table({"a": [a for a, _ in rows], "b": [b for _, b in rows], "arrival": list(range(len(rows)))})
    got = sorted_rows(table, order).to_pylist()
    # Python's sort is stable: equal keys keep arrival order, as the rewrite's must.
    assert got == sorted(table.to_pylist(), key=functools.partial(_python_key, order))
    assert sorted_rows(table, order).schema == table.schema  # no null flag left behind


def _field(name: str, type_: pa.DataType, field_id: int) -> pa.Field:
    return pa.field(name, type_, metadata={FIELD_ID: str(field_id).encode()})


def test_a_merge_of_interleaved_files_writes_one_file_sorted_by_the_table_s_order(tmp_path):
    schema = pa.schema([_field("id", pa.int64(), 1), _field("name", pa.string(), 2)])
    paths = []
    for n in range(3):
        ids = list(range(n, 30, 3))  # file n holds ids n, n+3, ...: every file's range overlaps the others'
        path = str(tmp_path / f"d{n}.parquet")
        pq.write_table(pa.table({"id": ids, "name": [str(i) for i in ids]}, schema=schema), path)
        paths.append(path)
    inputs = tuple(FileDeletes(p) for p in paths)
    by_id = sort_order_of(1, [("id", "identity", "asc", "nulls-first")])
    sorted_file = merge(RowMerge(inputs, schema, str(tmp_path / "sorted.parquet"), by_id), {}, key_reader({}))
    arrival = merge(RowMerge(inputs, schema, str(tmp_path / "arrival.parquet")), {}, key_reader({}))
    assert pq.read_table(sorted_file.path).column("id").to_pylist() == list(range(30))
    # Unsorted tables are unchanged: arrival order, file after file.
    assert pq.read_table(arrival.path).column("id").to_pylist() == [i for n in range(3) for i in range(n, 30, 3)]
