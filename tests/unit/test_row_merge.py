"""The arrow rewrite engine's executor side on real Parquet files, without Spark: which rows a
merge keeps (equality deletes with null-equals-null, position deletes, several files sharing
their deletes), the table's current schema (columns found by field id, added ones null, promoted
types cast), and the bins of one partition's files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from icecdc.compactor.positions import (
    FILE_PATH_FIELD_ID,
    POSITION_DELETE_SCHEMA,
    EqualityDeletes,
    FileDeletes,
    PositionDeletes,
    deleted_positions,
    deleted_positions_of,
    key_reader,
)
from icecdc.compactor.row_merge import RowMerge, bins, merge
from icecdc.runtime.fileio import FIELD_ID

assert FILE_PATH_FIELD_ID  # the position-delete schema's ids are the spec's


def field(name: str, type_: pa.DataType, field_id: int) -> pa.Field:
    return pa.field(name, type_, metadata={FIELD_ID: str(field_id).encode()})


ID, NAME, SCORE = field("id", pa.int64(), 1), field("name", pa.string(), 2), field("score", pa.int64(), 3)
TABLE_SCHEMA = pa.schema([ID, NAME, SCORE])


def write(path, columns: dict[pa.Field, list]) -> str:
    schema = pa.schema(list(columns))
    pq.write_table(pa.Table.from_arrays([pa.array(v, f.type) for f, v in columns.items()], schema=schema), path)
    return str(path)


def test_a_merge_keeps_the_rows_no_delete_removes_in_the_current_schema(tmp_path):
    # Written before "score" existed, with "name" under an old column name and ids as int32.
    old = write(
        tmp_path / "old.parquet", {field("id", pa.int32(), 1): [1, 2, 3, None], field("label", pa.string(), 2): list("abcd")}
    )
    new = write(tmp_path / "new.parquet", {ID: [5, 6, 7], NAME: list("efg"), SCORE: [50, 60, 70]})
    keys = write(tmp_path / "eq.parquet", {ID: [2, None, 6]})  # null deletes the row whose id is null
    positions = tmp_path / "pos.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([new]), pa.array([0], pa.int64())], schema=POSITION_DELETE_SCHEMA), positions)
    job = RowMerge(
        (
            FileDeletes(old, (EqualityDeletes(keys, (1,)),)),
            FileDeletes(new, (EqualityDeletes(keys, (1,)),), (PositionDeletes(str(positions)),)),
        ),
        TABLE_SCHEMA,
        str(tmp_path / "out.parquet"),
    )
    merged = merge(job, {}, key_reader({}))
    rows = pq.read_table(merged.path)
    assert merged.records == 3 and merged.source == old
    assert rows.to_pylist() == [
        {"id": 1, "name": "a", "score": None},
        {"id": 3, "name": "c", "score": None},
        {"id": 7, "name": "g", "score": 70},
    ]
    assert [f.metadata[FIELD_ID] for f in pq.read_schema(merged.path)] == [b"1", b"2", b"3"]  # Iceberg's field ids


def test_a_merge_whose_deletes_remove_every_row_writes_nothing(tmp_path):
    data = write(tmp_path / "d.parquet", {ID: [1, 2], NAME: list("ab"), SCORE: [1, 2]})
    keys = write(tmp_path / "eq.parquet", {ID: [1, 2]})
    job = RowMerge((FileDeletes(data, (EqualityDeletes(keys, (1,)),)),), TABLE_SCHEMA, str(tmp_path / "out.parquet"))
    assert merge(job, {}, key_reader({})).path is None
    assert not (tmp_path / "out.parquet").exists()


def test_files_sharing_their_deletes_are_matched_together_with_the_same_result(tmp_path):
    files = [write(tmp_path / f"d{i}.parquet", {ID: list(range(10 * i, 10 * i + 10))}) for i in range(3)]
    keys = EqualityDeletes(write(tmp_path / "eq.parquet", {ID: [3, 12, 13, 29, 99]}), (1,))
    other = EqualityDeletes(write(tmp_path / "eq2.parquet", {ID: [0, 25]}), (1,))
    deletes = [(files[0], [keys]), (files[1], [keys]), (files[2], [keys, other])]
    together = deleted_positions_of([FileDeletes(path, tuple(eq)) for path, eq in deletes], {})
    alone = [deleted_positions(path, eq, (), {}) for path, eq in deletes]
    assert (
        [sorted(new.to_pylist()) for _, new in together] == [sorted(new.to_pylist()) for _, new in alone] == [[3], [2, 3], [5, 9]]
    )


def test_a_partition_s_files_are_packed_in_runs_of_the_target_size():
    files = [("a", 40), ("b", 50), ("c", 30), ("d", 200), ("e", 10)]
    assert bins(files, 100) == [["e", "c", "a"], ["b"], ["d"]]  # smallest first
    assert bins(files, 1000) == [["e", "c", "a", "b", "d"]]
    assert bins([], 100) == []
