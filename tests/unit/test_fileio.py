"""Writing a new Parquet file: where a local warehouse's files land, what the footer handed back
holds, and that nothing is ever overwritten."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icecdc.runtime.fileio import write_parquet_with_footer

ROWS = pa.table({"id": pa.array([3, 1, 2], pa.int64()), "region": ["eu", None, "us"]})


def _without_serialized_size(footer: pq.FileMetaData) -> dict:
    # The only field the writer's own footer leaves at 0: the footer's size is known once written.
    return {k: v for k, v in footer.to_dict().items() if k != "serialized_size"}


@pytest.mark.parametrize("scheme", ["", "file:", "file://"])
def test_a_local_file_is_written_in_new_folders_with_the_footer_it_holds(tmp_path, scheme):
    path = tmp_path / "data" / "region=eu" / "f.parquet"
    size, footer = write_parquet_with_footer(ROWS, f"{scheme}{path}", {})
    assert size == path.stat().st_size
    assert pq.read_table(path).equals(ROWS)
    assert _without_serialized_size(footer) == _without_serialized_size(pq.read_metadata(path))
    assert footer.row_group(0).column(0).statistics.min == 1


def test_an_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "f.parquet"
    path.write_bytes(b"committed")
    with pytest.raises(FileExistsError):
        write_parquet_with_footer(ROWS, str(path), {})
    assert path.read_bytes() == b"committed"
