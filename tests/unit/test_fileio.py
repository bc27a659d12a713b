"""Writing a new Parquet file: where a local warehouse's files land, that the bytes handed back
are the file's, and that nothing is ever overwritten."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icecdc.runtime.fileio import write_new_parquet

ROWS = pa.table({"id": pa.array([3, 1, 2], pa.int64()), "region": ["eu", None, "us"]})


@pytest.mark.parametrize("scheme", ["", "file:", "file://"])
def test_a_local_file_is_written_in_new_folders_with_the_bytes_handed_back(tmp_path, scheme):
    path = tmp_path / "data" / "region=eu" / "f.parquet"
    data = write_new_parquet(ROWS, f"{scheme}{path}", {})
    assert data == path.read_bytes()
    assert pq.read_table(path).equals(ROWS)


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
