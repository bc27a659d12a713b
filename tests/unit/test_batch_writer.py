"""The ingester's batch writer without Spark, Kafka or a catalog: ``BatchRunner`` driven through
fakes of the tables, the batch's Spark job, the dead-letter topic and the commit events. Every fake
writes what it is asked into one shared log, so the order of work (offsets, job, dead letters,
commits, events, failpoints) and each decision of ``batch_decisions`` are checked in milliseconds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import orjson
import pyarrow as pa
import pytest

from icecdc.domain import summary
from icecdc.domain.errors import MissingPartitionSpec
from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.domain.layout import Column, PartitionTerm, TableLayout
from icecdc.domain.sourcespec import DEFAULT_RULES
from icecdc.ingest.batch_decisions import (
    MAX_REDOS,
    JobResult,
    TablesKeptChanging,
    TruncateAt,
    WrittenFile,
    erased_by_truncate,
    may_delete_globally,
)
from icecdc.ingest.evolution import ChangeKind, ColumnChange
from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.publish import DeliveryError
from icecdc.ingest.reduce import GLOBAL_PARTITION
from icecdc.ingest.stages import everywhere
from icecdc.ingest.writer import BatchRunner
from icecdc.jvm.tables import CommittedSnapshot

NEW_COLUMN = ColumnChange(ChangeKind.ADD, "note", "string")
COMMIT_TIME_MS = 1_767_225_600_000


def layout(table: str, topic: str) -> TableLayout:
    return TableLayout(
        table,
        topic,
        (Column("id", "long", True), Column("region", "string"), Column("amount", "long")),
        {"id": 1, "region": 2, "amount": 3},
        ("id",),
        (PartitionTerm("region", "region", "identity", "string", 1000),),
        0,
        f"/warehouse/{table}/data",
        global_spec_id=1,
    )


@dataclass(frozen=True)
class Record:
    """A Kafka record as the fake job reads it: what it holds and where it comes from. ``what``
    is upsert, delete (of a row in ``region``), moved (an update whose old partition is unknown:
    a global delete), tombstone, bad (rejected), truncate, new-column (asks for column ``note``
    until the table has it) or unknown-field (a field the table lacks, counted). ``lsn``: its
    position in the source's log, when the source sends one."""

    what: str
    topic: str
    offset: int
    region: str = "eu"
    partition: int = 0
    lsn: int | None = None


def records(topic: str, *whats: str | tuple[str, str], first_offset: int = 0) -> list[Record]:
    """Records at consecutive offsets; a (what, region) pair names the row's region."""
    out = []
    for offset, what in enumerate(whats, first_offset):
        kind, region = what if isinstance(what, tuple) else (what, "eu")
        out.append(Record(kind, topic, offset, region))
    return out


class FakeJob:
    """The batch's Spark job as its contract says: records from the positions on, a truncated
    table's changes below its truncate's LSN skipped (rejections are not), one file per (table,
    kind, partition), the batch's marks, rejections, truncates and schema changes."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.runs: list[dict] = []
        self.truncate_lsns: list[dict] = []

    def run(self, df: list[Record], layouts, positions, tag, truncate_lsns) -> JobResult:
        self.runs.append(dict(positions))
        self.truncate_lsns.append(dict(truncate_lsns))
        self.log.append(("job", dict(positions)))
        result = JobResult(seconds=0.25)
        by_topic = {layout.topic: layout for layout in layouts.values()}
        written: Counter[tuple[str, FileKind, tuple]] = Counter()
        for record in df:
            position = (record.topic, record.partition)
            if record.offset < positions.get(position, 0):
                continue
            table = by_topic[record.topic].table
            result.records += 1
            consumed = result.consumed[table]
            consumed[position] = max(record.offset, consumed.get(position, -1))
            partition = (record.region,)
            columns = {c.name for c in layouts[table].columns}
            if record.what == "bad":
                result.rejected.append(
                    {
                        "topic": record.topic,
                        "kafka_partition": record.partition,
                        "offset": record.offset,
                        "table": table,
                        "reason": "unparseable-json",
                        "detail": "not JSON",
                        "raw_key": bytearray(b"k"),
                        "raw_value": bytearray(b"{not json"),
                    }
                )
            elif record.what == "truncate":
                result.truncates[table][position] = TruncateAt(record.offset, record.lsn)
            elif erased_by_truncate(record.lsn, truncate_lsns.get(table)):
                continue
            elif record.what == "new-column" and NEW_COLUMN.column not in columns:
                result.schema_changes[table] = [NEW_COLUMN]
            elif record.what in ("upsert", "new-column", "unknown-field"):
                written[table, FileKind.DATA, partition] += 1
                if record.what == "unknown-field":
                    result.unknown_columns[table]["shoe_size"] += 1
            elif record.what == "delete":
                written[table, FileKind.DELETE, partition] += 1
            elif record.what == "moved":
                written[table, FileKind.DATA, partition] += 1
                written[table, FileKind.GLOBAL_DELETE, ()] += 1
        for (table, kind, partition), count in written.items():
            spec_id = layouts[table].global_spec_id if kind == FileKind.GLOBAL_DELETE else layouts[table].spec_id
            path = f"{layouts[table].data_location}/{tag}-{len(self.runs)}-{kind.value}-{'-'.join(partition)}.parquet"
            description = orjson.dumps({"spec-id": spec_id, "file-path": path}).decode()
            result.files[table].append(WrittenFile(kind, path, partition, count, 100 * count, description))
        return result


@dataclass(frozen=True)
class Commit:
    kind: str  # commit or truncate
    data: list[str]
    deletes: list[str]
    summary: dict[str, str]

    @property
    def offsets(self) -> dict:
        return orjson.loads(self.summary[summary.OFFSETS])

    def spec_ids(self, descriptions: list[str]) -> list[int]:
        return sorted(orjson.loads(d)["spec-id"] for d in descriptions)


class FakeTable:
    """An Iceberg table: its summaries newest first (so offsets read back what commits wrote),
    its partition specs and columns; ``fail`` makes every commit raise, ``before_commit`` runs
    first."""

    def __init__(self, base: TableLayout, log: list) -> None:
        self.base = base
        self.name = base.table
        self.log = log
        self.summaries: list[dict[str, str]] = []
        self.commits: list[Commit] = []
        self.columns = list(base.columns)
        self.spec_ids = {base.spec_id, base.global_spec_id}
        self.schema_frozen = False  # add_column changes nothing (the source keeps asking)
        self.fail: Exception | None = None
        self.before_commit = lambda: None

    def summaries_back_to(self, key):
        self.log.append(("read offsets", self.name))
        return list(self.summaries)

    def _commit(self, kind: str, data, deletes, tags) -> CommittedSnapshot:
        self.before_commit()
        self.log.append((kind, self.name))
        for description in (*data, *deletes):
            spec_id = orjson.loads(description)["spec-id"]
            if spec_id not in self.spec_ids:
                raise MissingPartitionSpec(spec_id, self.name)
        if self.fail is not None:
            raise self.fail
        self.commits.append(Commit(kind, list(data), list(deletes), dict(tags)))
        self.summaries.insert(0, dict(tags))
        sequence = len(self.commits)
        return CommittedSnapshot(
            100 + sequence, 99 + sequence if sequence > 1 else None, sequence, COMMIT_TIME_MS, "overwrite", 1
        )

    def commit_files(self, what, data, deletes, summary) -> CommittedSnapshot:
        return self._commit("commit", data, deletes, summary)

    def commit_truncate(self, what, data, summary) -> CommittedSnapshot:
        return self._commit("truncate", data, [], summary)

    def delete_files(self, paths) -> list[str]:
        self.log.append(("delete files", self.name, tuple(paths)))
        return []

    def add_column(self, name, iceberg_type) -> bool:
        self.log.append(("add column", self.name, name))
        if self.schema_frozen or name in {c.name for c in self.columns}:
            return False
        self.columns.append(Column(name, iceberg_type))
        return True

    def widen_column(self, name, iceberg_type) -> bool:
        return False

    def ensure_unpartitioned_spec(self) -> int:
        self.log.append(("ensure spec", self.name))
        added = max(self.spec_ids) + 4
        self.spec_ids.add(added)
        return added

    def catalog_layout(self) -> TableLayout:
        """As the catalog reads it: the current columns, no unpartitioned spec seen yet."""
        return replace(self.base, columns=tuple(self.columns), global_spec_id=None)


class FakeDeadLetters:
    def __init__(self, log: list) -> None:
        self.log = log
        self.fail = False

    def send(self, letters) -> int:
        letters = list(letters)
        self.log.append(("dead letters", sorted((letter.table, letter.offset) for letter in letters)))
        if self.fail:
            raise DeliveryError(f"{len(letters)} dead letters were not delivered")
        return len(letters)


class FakeEvents:
    def __init__(self, log: list) -> None:
        self.log = log
        self.published: list[CommitEvent] = []

    def publish(self, event: CommitEvent) -> None:
        self.log.append(("event", event.table))
        self.published.append(event)


TOPICS = {"db.orders": "orders", "db.refunds": "refunds", "db.returns": "returns"}


class Writer:
    """A ``BatchRunner`` over fakes of every table in ``names``."""

    def __init__(self, pool: ThreadPoolExecutor, *names: str) -> None:
        self.log: list = []
        self.tables = {name: FakeTable(layout(name, TOPICS[name]), self.log) for name in names or ("db.orders",)}
        self.job = FakeJob(self.log)
        self.dead_letters = FakeDeadLetters(self.log)
        self.events = FakeEvents(self.log)
        self.runner = BatchRunner(
            tables=self.tables,
            layouts={name: table.base for name, table in self.tables.items()},
            rules=dict.fromkeys(self.tables, DEFAULT_RULES),
            job=self.job,
            dead_letters=self.dead_letters,
            events=self.events,
            load_layout=lambda name: self.tables[name].catalog_layout(),
            commit_pool=pool,
            source_name="test",
            failpoint=lambda name: self.log.append(("failpoint", name)),
        )

    @property
    def orders(self) -> FakeTable:
        return self.tables["db.orders"]

    def steps(self, *kinds: str) -> list[tuple]:
        """The log entries of these kinds, in order."""
        return [entry for entry in self.log if entry[0] in kinds]


class CommitPool(ThreadPoolExecutor):
    """The commit pool, keeping the futures of what it was given."""

    def __init__(self) -> None:
        super().__init__(4, thread_name_prefix="test-commit")
        self.futures: list[Future] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future = super().submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


@pytest.fixture
def pool() -> Iterator[CommitPool]:
    with CommitPool() as executor:
        yield executor


def test_a_batch_reads_offsets_then_writes_then_sends_dead_letters_then_commits_then_publishes(pool):
    writer = Writer(pool)
    result = writer.runner.run(records("orders", "upsert", "bad", ("upsert", "us")), 0)
    assert writer.steps("read offsets", "job", "dead letters", "commit", "event", "failpoint") == [
        ("read offsets", "db.orders"),
        ("job", {}),
        ("failpoint", "after-files"),
        ("dead letters", [("db.orders", 1)]),
        ("failpoint", "after-dead-letters"),
        ("commit", "db.orders"),
        ("event", "db.orders"),
        ("failpoint", "after-commit"),
    ]
    (commit,) = writer.orders.commits
    assert len(commit.data) == 2 and commit.deletes == []
    assert commit.offsets == {"orders": {"0": 3}}
    assert commit.summary[summary.BATCH_ID] == "test:0" == result.batch_id
    assert (result.records, result.dead_letters, set(result.commits)) == (3, 1, {"db.orders"})
    stats = writer.runner.stats
    assert (stats.batches, stats.commits, stats.data_records, stats.dead_letters) == (1, 1, 2, 1)
    assert stats.dead_letters_by_reason == {"unparseable-json": 1}


def test_a_truncate_redoes_the_batch_from_after_it_and_empties_the_table_in_its_commit(pool):
    writer = Writer(pool)
    batch = records("orders", "upsert", "bad", "truncate", ("upsert", "us"), "delete", "bad")
    result = writer.runner.run(batch, 0)

    # The first run read everything; the redo reads only what follows the truncate.
    assert writer.job.runs == [{}, {("orders", 0): 3}]
    deleted = [entry for entry in writer.log if entry[0] == "delete files"]
    first_run_files, truncate_deletes = deleted
    assert len(first_run_files[2]) == 3 and all("-1-" in path for path in first_run_files[2])  # the first run's files, discarded
    assert writer.log.index(first_run_files) < writer.log.index(("job", {("orders", 0): 3}))
    # The redo's delete file is pointless after a truncate: deleted, then the truncate commits its data.
    assert [path.rsplit("/", 1)[1] for path in truncate_deletes[2]] == ["test:0-2-delete-eu.parquet"]
    assert writer.log.index(truncate_deletes) < writer.log.index(("truncate", "db.orders"))
    (commit,) = writer.orders.commits
    assert commit.kind == "truncate" and commit.deletes == []
    assert [orjson.loads(d)["file-path"].rsplit("/", 1)[1] for d in commit.data] == ["test:0-2-data-us.parquet"]
    # Offsets from the first run, which read every record; the dead letter before the truncate
    # (which the redo did not read again) is sent along with the redo's.
    assert commit.offsets == {"orders": {"0": 6}}
    assert writer.steps("dead letters") == [("dead letters", [("db.orders", 1), ("db.orders", 5)])]
    assert (result.records, result.dead_letters) == (6, 2)
    (event,) = writer.events.published
    assert event.truncated
    assert event.partitions == [PartitionDelta({"region": "us"}, "region=us", 0, data_files=1, data_bytes=100, data_records=1)]
    assert (writer.runner.stats.data_records, writer.runner.stats.delete_records) == (1, 0)


def test_a_truncate_on_one_partition_drops_the_changes_below_its_lsn_on_every_partition(pool):
    writer = Writer(pool)
    batch = [
        Record("upsert", "orders", 0, "apac", partition=0, lsn=10),
        Record("truncate", "orders", 1, partition=0, lsn=30),
        Record("upsert", "orders", 2, "us", partition=0, lsn=40),
        Record("upsert", "orders", 0, "apac", partition=1, lsn=20),  # before the truncate: gone with it
        Record("bad", "orders", 1, partition=1, lsn=25),  # before it too, and still a dead letter
        Record("upsert", "orders", 2, "eu", partition=1, lsn=35),
        Record("truncate", "orders", 0, partition=2, lsn=28),  # an earlier truncate of the same batch
        Record("upsert", "orders", 1, "apac", partition=2, lsn=29),  # after it, before the last one
    ]
    writer.runner.run(batch, 0)

    assert writer.job.runs == [{}, {("orders", 0): 2, ("orders", 2): 1}]
    assert writer.job.truncate_lsns == [{}, {"db.orders": 30}]  # the last truncate's, for every partition
    (commit,) = writer.orders.commits
    assert commit.kind == "truncate"
    assert sorted(orjson.loads(d)["file-path"].rsplit("-", 1)[1] for d in commit.data) == ["eu.parquet", "us.parquet"]
    assert commit.offsets == {"orders": {"0": 3, "1": 3, "2": 2}}
    assert writer.steps("dead letters") == [("dead letters", [("db.orders", 1)])]


def test_without_lsns_a_truncate_keeps_the_other_partitions_changes_of_its_batch(pool):
    """A connector without a log position (MySQL): not exact within one batch across partitions."""
    writer = Writer(pool)
    batch = [
        Record("truncate", "orders", 0, partition=0),
        Record("upsert", "orders", 0, "apac", partition=1, lsn=20),  # before it, but nothing to compare with
        Record("upsert", "orders", 1, "us", partition=0),
    ]
    writer.runner.run(batch, 0)

    assert writer.job.truncate_lsns == [{}, {}]
    (commit,) = writer.orders.commits
    assert sorted(orjson.loads(d)["file-path"].rsplit("-", 1)[1] for d in commit.data) == ["apac.parquet", "us.parquet"]


def test_a_schema_change_is_made_before_the_batch_is_done_again_with_the_new_layout(pool):
    writer = Writer(pool)
    writer.runner.run(records("orders", "upsert", "new-column", "upsert"), 0)

    assert writer.job.runs == [{}, {}]  # no truncate: the redo reads what the first run read
    assert writer.steps("job", "delete files", "add column", "failpoint", "commit") == [
        ("job", {}),
        ("delete files", "db.orders", ("/warehouse/db.orders/data/test:0-1-data-eu.parquet",)),
        ("add column", "db.orders", "note"),
        ("failpoint", "after-schema-change"),
        ("job", {}),
        ("failpoint", "after-files"),
        ("failpoint", "after-dead-letters"),
        ("commit", "db.orders"),
        ("failpoint", "after-commit"),
    ]
    now = writer.runner.layouts["db.orders"]
    assert "note" in {c.name for c in now.columns}
    assert now.global_spec_id == 1  # kept, though the catalog's view of the table did not show it
    (commit,) = writer.orders.commits
    assert [orjson.loads(d)["file-path"].rsplit("/", 1)[1] for d in commit.data] == ["test:0-2-data-eu.parquet"]
    assert writer.events.published[0].partitions[0].data_records == 3


def test_a_batch_whose_tables_keep_changing_fails_after_the_redo_limit_and_commits_nothing(pool):
    writer = Writer(pool)
    writer.orders.schema_frozen = True  # every run asks for the column again
    with pytest.raises(TablesKeptChanging, match="kept changing"):
        writer.runner.run(records("orders", "upsert", "new-column"), 0)
    assert len(writer.job.runs) == MAX_REDOS + 1
    assert writer.steps("add column") == [("add column", "db.orders", "note")] * MAX_REDOS
    assert writer.steps("dead letters", "commit", "event") == []
    assert ("failpoint", "after-files") not in writer.log


def test_a_lost_unpartitioned_spec_is_added_again_and_the_deletes_name_it(pool):
    writer = Writer(pool)
    writer.orders.spec_ids = {0}  # the global deletes' spec 1 was expired with old metadata
    writer.runner.run(records("orders", "upsert", ("moved", "us"), "delete"), 0)

    assert writer.steps("commit", "ensure spec", "event") == [
        ("commit", "db.orders"),
        ("ensure spec", "db.orders"),
        ("commit", "db.orders"),
        ("event", "db.orders"),
    ]
    (commit,) = writer.orders.commits
    assert commit.spec_ids(commit.deletes) == [0, 4]  # the partition's delete as it was, the global one under the new spec
    assert commit.spec_ids(commit.data) == [0, 0]
    assert writer.runner.layouts["db.orders"].global_spec_id == 4
    assert writer.events.published[0].global_delete_files == 1


def test_a_failing_table_commit_is_raised_after_every_other_table_committed_and_published(pool):
    writer = Writer(pool, "db.orders", "db.refunds", "db.returns")
    refunds, returns = writer.tables["db.refunds"], writer.tables["db.returns"]
    refunds.fail = RuntimeError("the catalog said no")
    # The last table's commit starts only once the refunds commit has failed: the pool's futures
    # are the three tables' offset reads, then their commits.
    returns.before_commit = lambda: pool.futures[3 + 1].exception(timeout=30)
    batch = records("orders", "upsert") + records("refunds", "upsert") + records("returns", "upsert")
    with pytest.raises(RuntimeError, match="the catalog said no"):
        writer.runner.run(batch, 0)

    assert [len(t.commits) for t in writer.tables.values()] == [1, 0, 1]
    assert sorted(writer.steps("event")) == [("event", "db.orders"), ("event", "db.returns")]
    assert writer.steps("failpoint")[-2:] == [("failpoint", "after-commit")] * 2
    assert all(future.done() for future in pool.futures)


def test_several_tables_commit_side_by_side_each_with_its_own_offsets(pool):
    writer = Writer(pool, "db.orders", "db.refunds")
    batch = records("orders", "upsert", "delete", "upsert") + records("refunds", ("upsert", "us"))
    result = writer.runner.run(batch, 0)
    assert set(result.commits) == {"db.orders", "db.refunds"} == set(result.commit_seconds)
    assert writer.orders.commits[0].offsets == {"orders": {"0": 3}}
    assert writer.tables["db.refunds"].commits[0].offsets == {"refunds": {"0": 1}}
    assert writer.runner.committed_offsets() == {"db.orders": {"orders": {0: 3}}, "db.refunds": {"refunds": {0: 1}}}
    assert writer.runner.topic_positions(writer.runner.committed_offsets()) == {("orders", 0): 3, ("refunds", 0): 1}


def test_dead_letters_are_delivered_before_any_table_commits(pool):
    writer = Writer(pool, "db.orders", "db.refunds")
    batch = records("orders", "upsert", "bad", "upsert") + records("refunds", "bad")
    writer.runner.run(batch, 0)
    steps = writer.steps("dead letters", "commit")
    assert steps[0] == ("dead letters", [("db.orders", 1), ("db.refunds", 0)])  # one send, before both commits
    assert sorted(steps[1:]) == [("commit", "db.orders"), ("commit", "db.refunds")]
    # A table whose batch held only rejected records still commits, to move its offsets past them.
    (refunds,) = writer.tables["db.refunds"].commits
    assert (refunds.data, refunds.deletes, refunds.offsets) == ([], [], {"refunds": {"0": 1}})


def test_undelivered_dead_letters_fail_the_batch_before_anything_commits(pool):
    writer = Writer(pool)
    writer.dead_letters.fail = True
    with pytest.raises(DeliveryError):
        writer.runner.run(records("orders", "upsert", "bad"), 0)
    assert writer.steps("commit", "event") == []
    assert ("failpoint", "after-dead-letters") not in writer.log
    assert writer.runner.committed_offsets() == {"db.orders": {}}  # the replay reads the batch again


def test_a_replayed_batch_commits_nothing_and_an_overlapping_one_only_its_new_part(pool):
    writer = Writer(pool)
    batch = records("orders", "upsert", ("upsert", "us"), "delete")
    writer.runner.run(batch, 0)
    again = writer.runner.run(batch, 0)  # e.g. Spark replaying after a crash

    assert writer.job.runs[1] == {("orders", 0): 3}  # from the offsets the table committed
    assert (again.records, again.commits, again.dead_letters) == (0, {}, 0)
    assert len(writer.orders.commits) == 1 and len(writer.events.published) == 1
    assert writer.steps("failpoint").count(("failpoint", "after-files")) == 1
    partly = writer.runner.run([*batch, *records("orders", ("upsert", "apac"), first_offset=3)], 1)
    assert partly.records == 1
    assert writer.orders.commits[-1].offsets == {"orders": {"0": 4}}
    assert len(writer.orders.commits[-1].data) == 1
    stats = writer.runner.stats
    assert (stats.batches, stats.batches_skipped, stats.records, stats.commits) == (3, 1, 4, 2)


def test_a_batch_of_tombstones_only_commits_nothing(pool):
    writer = Writer(pool)
    result = writer.runner.run(records("orders", "tombstone", "tombstone"), 0)
    assert (result.records, result.commits) == (2, {})
    assert writer.steps("commit", "truncate", "event", "dead letters") == []
    assert writer.runner.stats.batches_skipped == 0  # read and counted, just not worth a snapshot


def test_the_commit_event_describes_the_committed_snapshot_and_what_it_added(pool):
    writer = Writer(pool)
    # An earlier commit recorded another topic's offsets too: they are carried forward.
    writer.orders.summaries = [{summary.OFFSETS: orjson.dumps({"orders": {"0": 0}, "legacy": {"3": 7}}).decode()}]
    batch = records("orders", "upsert", "upsert", ("upsert", "us"), "delete", ("moved", "apac"), "unknown-field")
    writer.runner.run(batch, 7)

    (event,) = writer.events.published
    assert CommitEvent.from_json(event.to_json()) == event  # valid against the schema
    assert replace(event, partitions=[]) == CommitEvent(
        table="db.orders",
        snapshot_id=101,
        parent_snapshot_id=None,
        sequence_number=1,
        commit_time_ms=COMMIT_TIME_MS,
        operation="overwrite",
        writer=summary.INGEST_WRITER,
        batch_id="test:7",
        source_offsets={"orders": {"0": 6}, "legacy": {"3": 7}},
        global_delete_files=1,
        global_delete_records=1,
        truncated=False,
        unknown_columns={"shoe_size": 1},
    )
    assert sorted(event.partitions, key=lambda p: p.partition_path) == [
        PartitionDelta({"region": "apac"}, "region=apac", 0, data_files=1, data_bytes=100, data_records=1),
        PartitionDelta(
            {"region": "eu"},
            "region=eu",
            0,
            data_files=1,
            data_bytes=300,
            data_records=3,
            equality_delete_files=1,
            equality_delete_records=1,
        ),
        PartitionDelta({"region": "us"}, "region=us", 0, data_files=1, data_bytes=100, data_records=1),
    ]
    stats = writer.runner.stats
    assert (stats.data_records, stats.delete_records, stats.interleaved_commits) == (5, 2, 1)


def test_only_a_keyed_table_whose_key_does_not_give_the_partition_needs_a_spec_for_global_deletes():
    columns = (Column("id", "long", True), Column("region", "string"))
    regions = (PartitionTerm("region", "region", "identity", "string", 1000),)

    def of(key: tuple[str, ...], partition: tuple[PartitionTerm, ...] = regions) -> TableLayout:
        return TableLayout("db.t", "t", columns, {"id": 1, "region": 2}, key, partition, 0, "/w")

    assert may_delete_globally(of(("id",)), DEFAULT_RULES)
    assert not may_delete_globally(of(("id", "region")), DEFAULT_RULES), "the key gives the old partition"
    assert not may_delete_globally(of(("id",), ()), DEFAULT_RULES), "an unpartitioned table's deletes cover it all"
    assert not may_delete_globally(of(()), DEFAULT_RULES), "a table without a key deletes nothing"
    older = replace(of(("id", "region")), older_spec_data=True)
    assert may_delete_globally(older, DEFAULT_RULES), "an older spec's data files: every delete is global"
    assert not may_delete_globally(replace(of(()), older_spec_data=True), DEFAULT_RULES)


def test_while_an_older_spec_holds_data_every_delete_is_global():
    keys = pa.table({"id": [1, 2, 3]})
    pieces = {
        ("eu", FileKind.DATA): [keys.slice(0, 1)],
        ("eu", FileKind.DELETE): [keys.slice(1, 1)],
        ("us", FileKind.DELETE): [keys.slice(2, 1)],
        (GLOBAL_PARTITION, FileKind.GLOBAL_DELETE): [keys.slice(0, 1)],
    }
    moved = everywhere(pieces)
    assert moved.keys() == {("eu", FileKind.DATA), (GLOBAL_PARTITION, FileKind.GLOBAL_DELETE)}
    assert sorted(pa.concat_tables(moved[GLOBAL_PARTITION, FileKind.GLOBAL_DELETE]).column("id").to_pylist()) == [1, 2, 3]
