"""Writing a new Parquet file: where a local warehouse's files land, that the bytes handed back
are the file's, and that nothing is ever overwritten."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icecdc.domain.layout import FIELD_ID, PRIMITIVE_TYPES, arrow_type
from icecdc.runtime.fileio import dictionary_columns, write_new_parquet, write_parquet

ROWS = pa.table({"id": pa.array([3, 1, 2], pa.int64()), "region": ["eu", None, "us"]})


@pytest.mark.parametrize("scheme", ["", "file:", "file://"])
def test_a_local_file_is_written_in_new_folders_with_the_bytes_handed_back(tmp_path, scheme):
    path = tmp_path / "data" / "region=eu" / "f.parquet"
    data = write_new_parquet(ROWS, f"{scheme}{path}", {})
    assert data == path.read_bytes()
    assert pq.read_table(path).equals(ROWS)


def test_files_land_beside_each_other_in_a_folder_that_exists(tmp_path):
    first, second = tmp_path / "p" / "a.parquet", tmp_path / "p" / "b.parquet"
    write_new_parquet(ROWS, str(first), {})
    data = write_new_parquet(ROWS, str(second), {})
    assert data == second.read_bytes() and first.exists()


def test_an_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "f.parquet"
    path.write_bytes(b"committed")
    with pytest.raises(FileExistsError):
        write_new_parquet(ROWS, str(path), {})
    assert path.read_bytes() == b"committed"


@pytest.mark.parametrize("use_dictionary", [True, False])
def test_a_file_is_written_with_or_without_dictionary_pages_and_reads_the_same(tmp_path, use_dictionary):
    path = tmp_path / "f.parquet"
    write_new_parquet(ROWS, str(path), {}, use_dictionary=use_dictionary)
    columns = pq.ParquetFile(path).metadata.row_group(0)
    assert [columns.column(i).has_dictionary_page for i in range(columns.num_columns)] == [use_dictionary] * 2
    assert [columns.column(i).compression for i in range(columns.num_columns)] == ["ZSTD"] * 2
    assert pq.read_table(path).equals(ROWS)


# A value of each column type: the primitives, a narrow decimal and the widest one.
SAMPLES = {
    "boolean": True,
    "int": 7,
    "long": 8,
    "float": 1.5,
    "double": 2.5,
    "date": dt.date(2024, 2, 29),
    "timestamp": dt.datetime(2024, 1, 1, 1, 2, 3, 4),
    "timestamptz": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    "string": "s",
    "binary": b"b",
    "decimal(10, 2)": decimal.Decimal("1.23"),
    "decimal(38, 6)": decimal.Decimal("-1.5"),
}


def test_a_batch_file_without_the_arrow_schema_reads_back_every_type_and_field_id(tmp_path):
    """A batch's files leave out the Arrow schema (``stages.write_file``): every column type the
    writer produces must read back from the Parquet schema alone, field ids and nullability
    included, or the compactor's reads of those files would see other types."""
    assert set(PRIMITIVE_TYPES) <= set(SAMPLES), "a new column type needs a sample here"
    fields = [
        pa.field(f"c{i}", arrow_type(kind), nullable=i % 2 == 0, metadata={FIELD_ID: str(i + 1).encode()})
        for i, kind in enumerate(SAMPLES)
    ]
    rows = pa.Table.from_pylist([{f.name: v for f, v in zip(fields, SAMPLES.values(), strict=True)}], schema=pa.schema(fields))
    path = tmp_path / "f.parquet"
    write_new_parquet(rows, str(path), {}, use_dictionary=False, store_schema=False)
    assert b"ARROW:schema" not in (pq.ParquetFile(path).schema_arrow.metadata or {})
    read = pq.read_table(path)
    assert read.schema.equals(rows.schema, check_metadata=True)
    assert read.equals(rows)


def _encodings(path) -> dict[str, set[str]]:
    row_group = pq.ParquetFile(path).metadata.row_group(0)
    return {row_group.column(i).path_in_schema: set(row_group.column(i).encodings) for i in range(row_group.num_columns)}


def test_the_compactors_files_give_a_dictionary_only_to_columns_whose_values_repeat(tmp_path):
    rows = pa.table(
        {
            "id": pa.array(range(1000), pa.int64()),  # every value distinct
            "status": pa.array(["new", "paid", "shipped", None] * 250),
            "nothing": pa.nulls(1000, pa.string()),  # one value, null
            "half": pa.array([i // 2 for i in range(1000)], pa.int64()),  # one value in two: still worth it
        }
    )
    assert dictionary_columns(rows) == ["status", "nothing", "half"]
    assert dictionary_columns(rows.slice(0, 0)) == ["id", "status", "nothing", "half"]
    path = tmp_path / "pack.parquet"
    write_parquet(rows, str(path), {})
    encodings = _encodings(path)
    assert "RLE_DICTIONARY" not in encodings["id"] and "RLE_DICTIONARY" in encodings["status"]
    assert b"ARROW:schema" not in (pq.ParquetFile(path).schema_arrow.metadata or {})
    assert pq.read_table(path).equals(rows)


def test_every_column_type_can_be_given_a_dictionary_or_not(tmp_path):
    fields = [pa.field(f"c{i}", arrow_type(kind)) for i, kind in enumerate(SAMPLES)]
    row = {f.name: v for f, v in zip(fields, SAMPLES.values(), strict=True)}
    repeated = pa.Table.from_pylist([row, row], schema=pa.schema(fields))
    assert dictionary_columns(repeated) == [f.name for f in fields]
    assert dictionary_columns(repeated.slice(0, 1)) == []  # one value in one row: plain
    nested = pa.table({"s": pa.array([{"a": 1}] * 4), "l": pa.array([[1]] * 4)})
    assert dictionary_columns(nested) == []
