"""How the write stage spreads a batch over its tasks (``plan.WriteSpread``)."""

from __future__ import annotations

from icecdc.ingest.batch_decisions import ROWS_PER_WRITE_TASK, WriteSpread


def test_one_table_up_to_a_task_of_records_is_one_task_hashed_by_key() -> None:
    assert WriteSpread.for_source(50_000, tables=1, cores=2) == WriteSpread(1)
    assert WriteSpread(1).columns == ("table", "key")


def test_several_tables_give_each_core_whole_tables() -> None:
    spread = WriteSpread.for_source(50_000, tables=50, cores=2)
    assert spread == WriteSpread(2, whole_tables=True)
    assert spread.columns == ("table",)
    assert WriteSpread.for_source(10_000, tables=3, cores=8) == WriteSpread(3, whole_tables=True)


def test_one_core_or_larger_batches_keep_hashing_by_key() -> None:
    assert WriteSpread.for_source(50_000, tables=50, cores=1) == WriteSpread(1)
    # Past a task's worth of records a table's keys spread over tasks, as one table's do.
    assert WriteSpread.for_source(ROWS_PER_WRITE_TASK + 1, tables=50, cores=2) == WriteSpread(2)
    assert WriteSpread.for_source(500_000, tables=1, cores=2) == WriteSpread(5)
