"""The random histories of the Spark property tests, driven one way: the upstream database
(tests/cdc.py) and the ingester's writer, one micro-batch a step, with maintenance after some
batches, and writer batches committed while it runs (after its starting snapshot, before its
commit). At the end the table holds the rows the change stream implies, every writer snapshot
the rows after its batch, and every maintenance snapshot exactly its parent's rows (time travel).

The same kinds of history run by the thousand on the in-memory model
(tests/unit/test_model_properties.py); these keep a few examples each on the real stack."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from hypothesis import event

from icecdc.compactor.key_index import KeyIndex
from icecdc.compactor.rewrite import Committer, CompactionResult
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable
from icecdc.runtime.config import Config
from tests.cdc import Change, SourceDatabase, table_rows
from tests.integration.test_compactor import POSITION_DELETES, Stream
from tests.integration.test_ingest_writer import batch_writer, qualified

M = TypeVar("M")  # what a test's maintenance step is made of


class History(Generic[M]):
    """One history under way: the writer's batches and the maintenance snapshots so far."""

    def __init__(self, spark, config: Config, write, source: SourceDatabase) -> None:
        self.config = config
        self.table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
        self.stream = Stream(spark, config, write)
        self.stream.source = self.source = source
        self.writer_snapshots: dict[int, list] = {}  # snapshot -> the model's rows after that batch
        self.maintenance: list[CommittedSnapshot] = []
        # The sidecar's key index, kept across the history's conversions as the sidecar keeps it.
        self.key_index = KeyIndex(1 << 30)

    def write(self, batch: list[Change]) -> None:
        pairs = self.source.apply(batch)
        if pairs:
            self.stream(pairs)
            self.table.refresh()
            self.writer_snapshots[self.table.current_snapshot().snapshot_id] = self.source.expected_rows()

    def committer(self, during: list[Change] | None) -> Committer:
        """A commit gate that lets the writer commit ``during`` first, after the maintenance's
        starting snapshot: neither side may fail the other (the writer only adds files, and
        maintenance keeps the starting sequence number or writes positions only)."""

        def commit(attempt: Callable[[], CommittedSnapshot]) -> CommittedSnapshot:
            if during:
                self.write(during)
            return attempt()

        return commit

    def record(self, results: Sequence[CompactionResult], during: list[Change] | None) -> None:
        committed = {r.committed.snapshot_id: r.committed for r in results if r.committed is not None}
        assert len(committed) <= 1, "one commit for the whole job"
        self.maintenance += committed.values()
        if committed:
            works = ", ".join(sorted({r.work.value for r in results if r.committed is not None}))
            event(f"committed {works}{' during a writer commit' if during else ''}")


# One step of a history: a writer batch, and maybe maintenance after it, with a writer batch
# committed while it runs.
Step = tuple[list[Change], "tuple[M, list[Change] | None] | None"]
Maintain = Callable[[History[M], M, Committer], Sequence[CompactionResult]]


def run_history(
    spark,
    config: Config,
    initial: list[Change],
    steps: Sequence[Step],
    maintain: Maintain[M],
    source: SourceDatabase | None = None,
) -> History[M]:
    """Write ``initial``, then each step's batch and its maintenance (``maintain`` plans and runs
    it through the commit gate it is given; returns what it committed, nothing when there was
    nothing to do); then check the table (the head of the branch icecdc commits to) and its
    history."""
    name = qualified(config)
    with batch_writer(spark, config) as write:
        history: History[M] = History(spark, config, write, source or SourceDatabase())
        history.write(initial)
        for batch, maintenance in steps:
            history.write(batch)
            if maintenance is not None:
                chosen, during = maintenance
                history.record(maintain(history, chosen, history.committer(during)), during)
    rows = table_rows(spark, name)  # main's rows, Spark's cached table refreshed
    if history.table.ref.staged:  # main follows the staging branch, whose head holds every batch
        history.table.refresh()
        rows = rows_at(spark, name, history.table.current_snapshot().snapshot_id)
    assert rows == history.source.expected_rows()
    assert_history_kept_rows(spark, name, history.writer_snapshots, history.maintenance, config.tables[0].format_version or 2)
    return history


def assert_history_kept_rows(
    spark, name: str, writer_snapshots: dict[int, list], maintenance_snapshots: list[CommittedSnapshot], format_version: int
) -> None:
    """Every writer snapshot holds the model's rows after its batch, every maintenance snapshot
    exactly its parent's rows (time travel), and format v3 holds no Parquet position deletes.

    On format v3 a maintenance snapshot also keeps every row's lineage: the spec requires a
    rewrite to copy each row's ``_row_id`` and ``_last_updated_sequence_number``, and a row that
    came back with new ones would read as changed to every consumer of the table's changes."""
    lineage = format_version >= 3
    for snapshot_id, expected in writer_snapshots.items():
        assert rows_at(spark, name, snapshot_id) == expected, f"writer snapshot {snapshot_id}"
    parents = {r.snapshot_id: r.parent_id for r in spark.sql(f"SELECT snapshot_id, parent_id FROM {name}.snapshots").collect()}
    for committed in maintenance_snapshots:
        kept = rows_at(spark, name, committed.snapshot_id, lineage)
        assert kept == rows_at(spark, name, parents[committed.snapshot_id], lineage), committed
    if format_version == 3:
        positions = spark.sql(f"SELECT file_format FROM {name}.delete_files WHERE content = {POSITION_DELETES}").collect()
        assert {r.file_format for r in positions} <= {"PUFFIN"}


def rows_at(spark, name: str, snapshot_id: int, lineage: bool = False) -> list:
    """The rows at a snapshot, sorted; with ``lineage``, each with its v3 row id and the
    sequence number of its last update."""
    columns = "id, region, amount, updated_at" + (", _row_id, _last_updated_sequence_number" if lineage else "")
    return sorted(tuple(r) for r in spark.sql(f"SELECT {columns} FROM {name} VERSION AS OF {snapshot_id}").collect())
