"""The Flink-style upsert sink of icecdc/testbed/upsert_sink alone on the real stack: Iceberg's own Java
writers through the JVM, one RowDelta per checkpoint with no validations. Its table must hold
exactly its model's rows at every checkpoint, and its history must show what Flink's upsert sink
writes: equality deletes across checkpoints, file-scoped position deletes within one."""

from __future__ import annotations

import pytest

from icecdc.testbed.upsert_sink import Change, ChangeGenerator, UpsertSink, apply_changes, create_table, plan_checkpoint
from icecdc.testbed.writers.model import Row

POSITION_DELETES = 1
EQUALITY_DELETES = 2
CHECKPOINTS = 9
INTERVAL_SECONDS = 1.0  # Flink's checkpoint interval
COMMIT_SECONDS = 20.0  # the bound on writing and committing one checkpoint of 40 changes
# Iceberg's reserved field id of a position-delete file's ``file_path`` column.
FILE_PATH_FIELD = 2147483546


def test_a_checkpoint_deletes_a_key_written_in_it_by_position_and_others_by_equality():
    committed = {1: Row(1, "eu", 10, "new", 110), 2: Row(2, "us", 20, "new", 220)}
    changes = [
        Change.upsert(Row(1, "apac", 11, "paid", 111)),  # moves: its committed row is in eu
        Change.upsert(Row(3, "eu", 30, "new", 330)),
        Change.upsert(Row(3, "eu", 31, "paid", 331)),  # twice in the checkpoint
        Change.upsert(Row(1, "us", 12, "paid", 112)),
        Change.delete(2),
    ]
    plan = {p.region: p for p in plan_checkpoint(committed, changes)}
    assert plan["eu"].equality_deletes == [1, 3] and plan["eu"].position_deletes == [0]
    assert [r.amount for r in plan["eu"].rows] == [30, 31]
    assert plan["apac"].position_deletes == [0] and plan["apac"].equality_deletes == []
    assert plan["us"].equality_deletes == [2] and [r.amount for r in plan["us"].rows] == [12]
    assert apply_changes(committed, changes) == {1: Row(1, "us", 12, "paid", 112), 3: Row(3, "eu", 31, "paid", 331)}


def test_a_delete_of_an_unknown_key_is_refused_with_its_reason():
    with pytest.raises(ValueError, match="key 7"):
        plan_checkpoint({}, [Change.delete(7)])


def test_the_generator_moves_rows_and_changes_keys_twice_in_a_checkpoint():
    generator, model = ChangeGenerator(seed=3), {}
    moved = position_deletes = 0
    for _ in range(20):
        changes = generator.checkpoint(model, 40)
        position_deletes += sum(len(p.position_deletes) for p in plan_checkpoint(model, changes))
        moved += sum(1 for c in changes if c.row is not None and c.id in model and model[c.id].region != c.row.region)
        model = apply_changes(model, changes)
    assert moved > 0 and position_deletes > 0 and len(model) > 100


def test_the_upsert_sink_keeps_its_table_equal_to_its_model(spark, stack_config, unique):
    catalog = stack_config.catalog.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.it")
    name = f"{catalog}.it.upserts_{unique}"
    create_table(spark, name)
    sink = UpsertSink(spark, name, seed=64, changes_per_checkpoint=40)
    sink.start(CHECKPOINTS, INTERVAL_SECONDS)
    sink.wait_for_commits(CHECKPOINTS, CHECKPOINTS * (INTERVAL_SECONDS + COMMIT_SECONDS))
    sink.stop()

    assert sink.refused == []
    assert sink.commits == CHECKPOINTS
    for checkpoint in sink.checkpoints:
        assert sink.table_diff(checkpoint) == [], f"checkpoint {checkpoint.checkpoint_id}"
    assert sink.table_diff() == []

    snapshots = spark.sql(f"SELECT snapshot_id, summary FROM {name}.snapshots ORDER BY committed_at").collect()
    assert [s.snapshot_id for s in snapshots] == [c.snapshot_id for c in sink.checkpoints]
    assert all(s.summary["flink.job-id"] == sink.job_id for s in snapshots)
    assert [int(s.summary["flink.max-committed-checkpoint-id"]) for s in snapshots] == list(range(1, CHECKPOINTS + 1))

    entries = spark.sql(
        f"SELECT snapshot_id, data_file.content AS content, data_file.file_path AS path, "
        f"data_file.record_count AS records, data_file.lower_bounds AS lower, data_file.upper_bounds AS upper "
        f"FROM {name}.entries"
    ).collect()
    equality = [e for e in entries if e.content == EQUALITY_DELETES]
    positions = [e for e in entries if e.content == POSITION_DELETES]
    assert len({e.snapshot_id for e in equality}) >= 2, "equality deletes across checkpoints"
    assert positions, "a key written twice in a checkpoint is deleted by position"
    data_files = {(e.snapshot_id, e.path) for e in entries if e.content == 0}
    for delete in positions:
        target = bytes(delete.lower[FILE_PATH_FIELD]).decode()
        assert bytes(delete.upper[FILE_PATH_FIELD]).decode() == target, "file-scoped: one data file"
        assert (delete.snapshot_id, target) in data_files, "it names a data file of its own commit"
    assert sum(e.records for e in positions) == sum(c.position_deletes for c in sink.checkpoints)
    assert sum(e.records for e in equality) == sum(c.equality_deletes for c in sink.checkpoints)


def test_a_rewrite_between_the_files_and_the_commit_refuses_nothing(spark, stack_config, unique):
    """The sidecar's rewrite (a ``replace`` with the starting sequence number) landing while the
    sink writes a checkpoint: the sink validates nothing, and its equality deletes still apply to
    the rewritten files, so the table stays exact."""
    catalog = stack_config.catalog.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.it")
    name = f"{catalog}.it.upserts_{unique}"
    create_table(spark, name)
    sink = UpsertSink(spark, name, seed=7, changes_per_checkpoint=40)
    sink.commit_checkpoints(3)
    options = "map('rewrite-all', 'true', 'use-starting-sequence-number', 'true')"
    rewrite = f"CALL {catalog}.system.rewrite_data_files(table => '{name.split('.', 1)[1]}', options => {options})"
    rewritten = []
    checkpoint = sink.commit_checkpoint(before_commit=lambda: rewritten.append(spark.sql(rewrite).first()))

    assert checkpoint is not None and sink.refused == []
    assert rewritten[0].rewritten_data_files_count > 0
    operations = [r.operation for r in spark.sql(f"SELECT operation FROM {name}.snapshots ORDER BY committed_at").collect()]
    assert operations[-2:] == ["replace", "overwrite"]
    for done in sink.checkpoints:
        assert sink.table_diff(done) == [], f"checkpoint {done.checkpoint_id}"
