"""The foreign writers of icecdc/testbed/writers alone (no sidecar): each ends with its table equal to its
model and no refused commit, and the harness does record a refusal when one happens."""

from __future__ import annotations

from pathlib import Path

import pytest

from icecdc.testbed.writers import AppendWriter, BatchKind, ChangeGenerator, Gate, MergeWriter, Row, TableModel, WriteMode, diff
from icecdc.testbed.writers.model import Batch, Change, Op

TRIGGER_SECONDS = 1.0
MIXED_BATCHES = 8


def summaries(spark, table: str) -> list[dict[str, str]]:
    """Each snapshot's summary, with its operation, oldest first."""
    spark.sql(f"REFRESH TABLE {table}")
    query = f"SELECT operation, summary FROM {table}.snapshots ORDER BY committed_at"
    return [{**r["summary"], "operation": r["operation"]} for r in spark.sql(query).collect()]


def total(spark, table: str, key: str) -> int:
    return sum(int(s.get(key, "0")) for s in summaries(spark, table))


# -- the model, without Spark ------------------------------------------------------------------
def test_the_model_applies_moves_deletes_and_rejects_a_key_twice():
    model = TableModel()
    model.apply(
        Batch(0, BatchKind.MERGE, (Change(Op.INSERT, Row(1, "eu", 5, "new", 10)), Change(Op.INSERT, Row(2, "us", 6, "new", 10))))
    )
    model.apply(
        Batch(1, BatchKind.MERGE, (Change(Op.UPDATE, Row(1, "us", 7, "paid", 11)), Change(Op.DELETE, Row(2, "us", 6, "new", 10))))
    )
    assert model.rows == {1: Row(1, "us", 7, "paid", 11)}
    with pytest.raises(ValueError, match="twice"):
        model.apply(Batch(2, BatchKind.MERGE, (Change(Op.DELETE, Row(1, "us", 7, "paid", 11)),) * 2))


def test_the_generator_changes_existing_keys_and_moves_some_across_regions():
    changes = ChangeGenerator(seed=3)
    changes.inserts(100)
    before = dict(changes.model.rows)
    batch = changes.merge(40)
    updated = [c.row for c in batch.changes if c.op is Op.UPDATE]
    assert all(c.row.id in before for c in batch.changes if c.op is not Op.INSERT)
    assert all(c.row.id not in before for c in batch.changes if c.op is Op.INSERT)
    assert any(row.region != before[row.id].region for row in updated)
    assert sum(c.op is Op.DELETE for c in batch.changes) == 6
    assert ChangeGenerator(seed=3).inserts(100) == ChangeGenerator(seed=3).inserts(100)


def test_the_diff_names_missing_unexpected_changed_and_duplicate_rows():
    expected = {1: Row(1, "eu", 5, "new", 10), 2: Row(2, "us", 6, "new", 10)}
    actual = [Row(2, "us", 9, "new", 10), Row(3, "eu", 1, "new", 1), Row(3, "eu", 1, "new", 1)]
    lines = diff(expected, actual)
    assert lines[0] == "key 3 appears 2 times"
    assert lines[1].startswith("missing Row(id=1")
    assert lines[2].startswith("unexpected Row(id=3")
    assert lines[3].startswith("key 2: expected")
    assert diff(expected, list(expected.values())) == []


# -- each writer alone -------------------------------------------------------------------------
def mixed_feed(changes: ChangeGenerator) -> list[Batch]:
    """A seed of inserts, then MERGEs of updates (some moving region), inserts and deletes, with
    one UPDATE and one DELETE statement among them."""
    feed = [changes.inserts(300)]
    for index in range(MIXED_BATCHES):
        feed.append(changes.update(15) if index == 3 else changes.delete(10) if index == 6 else changes.merge(40))
    return feed


@pytest.mark.parametrize(
    ("mode", "format_version"),
    [
        (WriteMode.MERGE_ON_READ, 2),
        (WriteMode.MERGE_ON_READ, 3),
        pytest.param(WriteMode.COPY_ON_WRITE, 2, marks=pytest.mark.slow),
        pytest.param(WriteMode.COPY_ON_WRITE, 3, marks=pytest.mark.slow),
    ],
    ids=["mor-v2", "mor-v3", "cow-v2", "cow-v3"],
)
def test_a_merge_writer_alone_ends_equal_to_its_model(spark, tmp_path: Path, unique: str, mode: WriteMode, format_version: int):
    table = f"lake.foreign.merge_{unique}"
    writer = MergeWriter(spark, table, tmp_path, format_version=format_version, trigger_seconds=TRIGGER_SECONDS, mode=mode)
    feed = mixed_feed(ChangeGenerator(seed=format_version))
    with writer:
        writer.feed(feed)
        writer.wait_for_commits(len(feed))
    assert writer.refused == []
    assert writer.committed == [batch.seq for batch in feed]
    writer.assert_matches()
    assert len(summaries(spark, table)) == len(feed)  # one commit per batch
    # The table really is in the mode asked for: deletes in place, or files rewritten.
    deletes = total(spark, table, "added-dvs" if format_version == 3 else "added-position-delete-files")
    if mode is WriteMode.MERGE_ON_READ:
        assert deletes > 0
        assert total(spark, table, "deleted-data-files") == 0
    else:
        assert deletes == 0
        assert total(spark, table, "deleted-data-files") > 0


@pytest.mark.parametrize("format_version", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_the_append_writer_adds_many_small_files_per_commit(spark, tmp_path: Path, unique: str, format_version: int):
    table = f"lake.foreign.append_{unique}"
    writer = AppendWriter(
        spark, table, tmp_path, format_version=format_version, trigger_seconds=TRIGGER_SECONDS, files_per_commit=4
    )
    changes = ChangeGenerator(seed=7)
    feed = [changes.inserts(200, BatchKind.APPEND) for _ in range(MIXED_BATCHES)]
    with writer:
        writer.feed(feed)
        writer.wait_for_commits(len(feed))
    assert writer.refused == []
    writer.assert_matches()
    appends = [s for s in summaries(spark, table) if s["operation"] == "append"]
    assert len(appends) == len(feed)
    # Four tasks, each holding rows of every region: more files than partitions in each commit.
    assert all(int(s["added-data-files"]) > 3 for s in appends)
    assert total(spark, table, "added-delete-files") == 0
    # The check is independent of the writer: a row the model does not know of removed is a diff.
    spark.sql(f"DELETE FROM {table} WHERE id = 1")
    with pytest.raises(AssertionError, match=r"missing Row\(id=1,"):
        writer.assert_matches()


# -- the harness sees a refusal ----------------------------------------------------------------
def rewrite_during_the_next_merge(spark, writer: MergeWriter, gate: Gate, changes: ChangeGenerator) -> None:
    """Commit a seed, then hold the next MERGE's job after its scan while a rewrite replaces every
    data file, including those the MERGE deletes rows from, so Iceberg refuses the MERGE."""
    writer.feed([changes.inserts(200)])
    writer.wait_for_commits(1)
    gate.arm()
    writer.feed([changes.merge(40)])
    gate.wait_entered(timeout=writer.margin_seconds)
    spark.sql(f"REFRESH TABLE {writer.table}")
    name = writer.table.removeprefix("lake.")
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{name}', options => map('rewrite-all', 'true'))")
    gate.open()


@pytest.mark.parametrize("format_version", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_a_rewrite_between_a_merge_scan_and_its_commit_is_a_recorded_refusal(
    spark, tmp_path: Path, unique: str, format_version: int
):
    gate = Gate(tmp_path / "gate")
    writer = MergeWriter(
        spark,
        f"lake.foreign.refused_{unique}",
        tmp_path,
        format_version=format_version,
        trigger_seconds=TRIGGER_SECONDS,
        retry=True,
        gate=gate,
        refresh=True,
    )
    with writer:
        rewrite_during_the_next_merge(spark, writer, gate, ChangeGenerator(seed=11))
        writer.wait_for_commits(2)
    assert [(r.seq, r.attempt) for r in writer.refused] == [(1, 1)]
    assert "Cannot commit, missing data files" in writer.refused[0].error
    assert writer.retries == 1
    writer.assert_matches()


def test_without_retry_a_refusal_stops_the_query_and_the_model_keeps_only_committed_batches(spark, tmp_path: Path, unique: str):
    gate = Gate(tmp_path / "gate")
    writer = MergeWriter(spark, f"lake.foreign.stopped_{unique}", tmp_path, trigger_seconds=TRIGGER_SECONDS, gate=gate)
    with writer:
        rewrite_during_the_next_merge(spark, writer, gate, ChangeGenerator(seed=13))
        with pytest.raises(RuntimeError, match="stopped after 1 commits"):
            writer.wait_for_commits(2)
    assert [r.seq for r in writer.refused] == [1]
    assert writer.committed == [0]
    writer.assert_matches()
