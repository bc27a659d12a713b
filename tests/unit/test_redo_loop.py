"""The redo loop (``ingest/redo.py``) over the fake job and tables of
tests/unit/test_batch_writer.py: which runs it keeps, what it discards and changes between runs.
How a redo's positions and truncate LSNs are chosen is ``batch_decisions.BatchRedos``'s, checked
there."""

from __future__ import annotations

from icecdc.ingest.batch_decisions import IngestStats
from icecdc.ingest.redo import RedoLoop
from tests.unit.test_batch_writer import NEW_COLUMN, TOPICS, FakeJob, FakeTable, layout, records


class Loop:
    def __init__(self) -> None:
        self.log: list = []
        self.table = FakeTable(layout("db.orders", TOPICS["db.orders"]), self.log)
        self.layouts = {"db.orders": self.table.base}
        self.job = FakeJob(self.log)
        self.stats = IngestStats()
        self.loop = RedoLoop(
            tables={"db.orders": self.table},
            layouts=self.layouts,
            job=self.job,
            load_layout=lambda name: self.table.catalog_layout(),
            stats=self.stats,
            failpoint=lambda name: self.log.append(("failpoint", name)),
        )


def test_a_batch_that_asks_for_no_redo_runs_its_job_once():
    loop = Loop()
    runs = loop.loop.run(records("orders", "upsert", "upsert"), {}, "test:0")
    assert runs.first is runs.last
    assert not runs.truncated
    assert loop.job.runs == [{}]
    assert loop.stats.last_job_seconds == 0.25


def test_a_schema_change_discards_the_run_changes_the_table_and_runs_again_with_its_new_layout():
    loop = Loop()
    runs = loop.loop.run(records("orders", "upsert", "new-column"), {}, "test:0")
    assert [entry[0] for entry in loop.log] == ["job", "delete files", "add column", "failpoint", "job"]
    assert NEW_COLUMN.column in {c.name for c in loop.layouts["db.orders"].columns}
    assert loop.layouts["db.orders"].global_spec_id == loop.table.base.global_spec_id  # kept over the catalog's
    assert runs.first.records == runs.last.records == 2
    assert loop.stats.last_job_seconds == 0.5
