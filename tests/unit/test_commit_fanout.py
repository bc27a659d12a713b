"""The commit fan-out (``ingest/commit_fanout.py``) over the fake tables and events of
tests/unit/test_batch_writer.py: each table's commit, its event after it, and what the log says
once. The order against the batch's other steps is checked there."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest

from icecdc.domain.sourcespec import DEFAULT_RULES
from icecdc.ingest.batch_decisions import IngestStats, JobResult, TableCommit, WrittenFile
from icecdc.ingest.commit_fanout import CommitFanOut
from icecdc.ingest.filemeta import FileKind
from tests.unit.test_batch_writer import TOPICS, CommitPool, FakeEvents, FakeTable, layout


def written(table: FakeTable, kind: FileKind, rows: int = 1) -> WrittenFile:
    everywhere = kind is FileKind.GLOBAL_DELETE
    spec_id, partition = (table.base.global_spec_id, ()) if everywhere else (table.base.spec_id, ("eu",))
    path = f"{table.base.data_location}/{kind.value}.parquet"
    return WrittenFile(kind, path, partition, rows, 100, orjson.dumps({"spec-id": spec_id, "file-path": path}).decode())


class FanOut:
    """A ``CommitFanOut`` over fake tables, writing into one log."""

    def __init__(self, pool: CommitPool, *names: str) -> None:
        self.log: list = []
        self.pool = pool
        self.tables = {name: FakeTable(layout(name, TOPICS[name]), self.log) for name in names}
        self.layouts = {name: table.base for name, table in self.tables.items()}
        self.events = FakeEvents(self.log)
        self.stats = IngestStats()
        self.fanout = CommitFanOut(
            tables=self.tables,
            layouts=self.layouts,
            rules=dict.fromkeys(self.tables, DEFAULT_RULES),
            events=self.events,
            pool=pool,
            stats=self.stats,
            failpoint=lambda name: self.log.append(("failpoint", name)),
        )

    def commit(self, batch: int, *kinds: FileKind) -> list:
        commits = [
            TableCommit(name, f"test:{batch}", tuple(written(table, kind) for kind in kinds), {"orders": {"0": batch}}, False)
            for name, table in self.tables.items()
        ]
        return self.fanout.commit_all(commits, JobResult())


@pytest.fixture
def pool() -> Iterator[CommitPool]:
    with CommitPool() as executor:
        yield executor


def test_one_table_commits_on_the_calling_thread_then_publishes_its_event(pool):
    fanout = FanOut(pool, "db.orders")
    (done,) = fanout.commit(1, FileKind.DATA)
    assert not pool.futures
    assert fanout.log == [("commit", "db.orders"), ("event", "db.orders"), ("failpoint", "after-commit")]
    assert (done.table, done.snapshot.snapshot_id) == ("db.orders", 101)
    assert fanout.events.published[0].snapshot_id == 101
    assert fanout.stats.data_records == 1


def test_several_tables_commit_on_the_pool_and_come_back_in_the_order_given(pool):
    fanout = FanOut(pool, "db.orders", "db.refunds", "db.returns")
    done = fanout.commit(1, FileKind.DATA)
    assert len(pool.futures) == 3
    assert [d.table for d in done] == ["db.orders", "db.refunds", "db.returns"]
    assert sorted(event.table for event in fanout.events.published) == ["db.orders", "db.refunds", "db.returns"]


def test_a_lost_unpartitioned_spec_is_added_again_and_kept_for_the_next_batches(pool):
    fanout = FanOut(pool, "db.orders")
    fanout.tables["db.orders"].spec_ids.discard(1)  # expired with the metadata no live file used
    fanout.commit(1, FileKind.DATA, FileKind.GLOBAL_DELETE)
    (commit,) = fanout.tables["db.orders"].commits
    assert commit.spec_ids(commit.deletes) == [4]
    assert fanout.layouts["db.orders"].global_spec_id == 4


def test_a_tables_first_global_deletes_are_explained_in_the_log_once(pool, caplog):
    fanout = FanOut(pool, "db.orders")
    with caplog.at_level(logging.INFO, logger="icecdc.ingest.commit_fanout"):
        fanout.commit(1, FileKind.DATA, FileKind.GLOBAL_DELETE)
        fanout.commit(2, FileKind.GLOBAL_DELETE)
    explained = [r for r in caplog.records if "deleted in every partition" in r.getMessage()]
    assert len(explained) == 1
    assert "(before_image: key)" in explained[0].getMessage()
