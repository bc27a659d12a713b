"""The decisions of one micro-batch, over the plain values its job hands the driver: whether the
job must run again and from where (a schema change, a truncate), which rejected records become dead
letters, which tables commit what and how far their offsets advance, the commit event of a
committed snapshot, and the running totals. No Spark, Kafka, Java or catalog here: ``writer`` does
the I/O, in the order its docstring gives.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson

from icecdc.domain import summary
from icecdc.domain.events import CommitEvent, PartitionDelta
from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.domain.sourcespec import SourceRules, UnknownPartition
from icecdc.ingest import offsets as offset_log
from icecdc.ingest.debezium import Reason
from icecdc.ingest.evolution import ColumnChange
from icecdc.ingest.filemeta import FileKind
from icecdc.ingest.unavailable import MovedImage, UnresolvedRow

Position = tuple[str, int]  # (topic, Kafka partition)


@dataclass(frozen=True)
class TruncateAt:
    """Where a truncate is: its offset on its Kafka partition, and its position in the source's
    log (PostgreSQL's ``source.lsn``; None from a connector that sends none)."""

    offset: int
    lsn: int | None = None


# table -> position -> the table's last truncate there
Truncates = Mapping[str, Mapping[Position, TruncateAt]]

# A write task reduces and writes this many records at most; a batch of up to this size is
# written by one task, so it adds one file per touched partition and kind. Larger, a large batch
# is one task on one core while the others idle (docs/BENCHMARKS.md, row "Records a second"); a
# source at the default ``max_batch_records`` (50,000) still writes one file per partition and kind.
ROWS_PER_WRITE_TASK = 100_000


@dataclass(frozen=True)
class WriteSpread:
    """How the write stage spreads a batch's rows over its tasks: ``tasks`` tasks, rows hashed
    by table and key, or by table alone (``whole_tables``).

    Sized from the largest batch the source can deliver, since the job cannot count its input
    before it runs. Up to ``ROWS_PER_WRITE_TASK`` records one task writes the batch, so each
    touched partition gets one file per kind. A source of several tables would then leave the
    other cores idle while one task writes every table's many small files; hashing by table
    alone gives each core whole tables, so no partition gets a second file."""

    tasks: int
    whole_tables: bool = False

    @classmethod
    def for_source(cls, max_batch_records: int, tables: int, cores: int) -> WriteSpread:
        tasks = max(1, -(-max_batch_records // ROWS_PER_WRITE_TASK))
        if tasks == 1 and tables > 1 and cores > 1:
            return cls(min(tables, cores), whole_tables=True)
        return cls(tasks)

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns the rows are hashed by (every change of a key must reach one task)."""
        return ("table",) if self.whole_tables else ("table", "key")


# A batch is done again at most this many times as its tables change under it (a schema change
# or a truncate each ask for one redo).
MAX_REDOS = 4


@dataclass(frozen=True)
class WrittenFile:
    kind: FileKind
    path: str
    partition: PartitionKey
    record_count: int
    file_size: int
    description: str  # Iceberg's content-file JSON, made where the file was written (filemeta.py)


@dataclass
class JobResult:
    """What one run of a batch's job found (``job.read_result``)."""

    seconds: float = 0.0
    in_driver: bool = False  # run in the driver rather than as a Spark job (``job.BatchJob``)
    records: int = 0  # records read past the committed offsets
    consumed: dict[str, dict[Position, int]] = field(default_factory=lambda: defaultdict(dict))  # table -> highest offset read
    rejected: list[dict[str, Any]] = field(default_factory=list)  # rows with a reason
    files: dict[str, list[WrittenFile]] = field(default_factory=lambda: defaultdict(list))
    schema_changes: dict[str, list[ColumnChange]] = field(default_factory=dict)
    unknown_columns: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    skipped: dict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter)
    )  # records that are not changes, by kind
    truncates: dict[str, dict[Position, TruncateAt]] = field(default_factory=lambda: defaultdict(dict))  # the last per position
    # Rows with values the batch does not hold, and the images key changes moved (``unavailable``).
    unresolved: dict[str, list[UnresolvedRow]] = field(default_factory=lambda: defaultdict(list))
    moved: dict[str, list[MovedImage]] = field(default_factory=lambda: defaultdict(list))
    schema_prefixes: dict[str, bytes] = field(default_factory=dict)  # topic -> a wrapper prefix its records carried whole

    def written_paths(self, table: str | None = None) -> list[str]:
        return [f.path for t, files in self.files.items() if table in (None, t) for f in files]


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    table: str | None
    reason: str
    detail: str
    key: bytes | None
    value: bytes | None


def _bytes(value: bytes | bytearray | None) -> bytes | None:
    return bytes(value) if value is not None else None


def dead_letters_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[DeadLetter]:
    """From the parse stage's rejected rows (Spark hands binary columns back as bytearray)."""
    return [
        DeadLetter(
            r["topic"],
            r["kafka_partition"],
            r["offset"],
            r["table"],
            r["reason"],
            r["detail"],
            _bytes(r["raw_key"]),
            _bytes(r["raw_value"]),
        )
        for r in rows
    ]


def unresolvable_letters(table: str, rows: Iterable[UnresolvedRow], detail: Callable[[UnresolvedRow], str]) -> list[DeadLetter]:
    """The last change of each row whose unsent values exist nowhere."""
    return [
        DeadLetter(
            r.last.topic,
            r.last.partition,
            r.last.offset,
            table,
            Reason.UNAVAILABLE_VALUE.value,
            detail(r),
            r.last.key,
            r.last.value,
        )
        for r in rows
    ]


def topic_positions(layouts: Mapping[str, TableLayout], committed: Mapping[str, offset_log.Offsets]) -> dict[Position, int]:
    """(topic, partition) -> next offset to read, each topic as committed by its own table."""
    return {
        (layouts[table].topic, partition): offset
        for table, topics in committed.items()
        for partition, offset in topics.get(layouts[table].topic, {}).items()
    }


def may_delete_globally(layout: TableLayout, rules: SourceRules) -> bool:
    """Whether the table's batches may write global deletes (so it needs an unpartitioned spec):
    for keys whose old partition is unknown, or for every key while data files of an older spec
    are live (``TableLayout.older_spec_data``)."""
    if layout.append_only:
        return False
    unknown = rules.unknown_partition is UnknownPartition.GLOBAL_DELETE
    return layout.older_spec_data or (unknown and bool(layout.partition) and not layout.key_determines_partition)


def reloaded_layout(before: TableLayout, loaded: TableLayout) -> TableLayout:
    """A table's layout read again after a schema change, keeping the unpartitioned spec the
    writer found or added (the catalog's view may predate it)."""
    return replace(loaded, global_spec_id=loaded.global_spec_id or before.global_spec_id)


# ---- redoing a batch ----


class TablesKeptChanging(RuntimeError):
    """A batch asked for more redos than ``MAX_REDOS``."""


@dataclass(frozen=True)
class Redo:
    """The batch's job runs again, once these column changes are made, from these positions, and
    without the changes of a truncated table below its truncate's LSN (``erased_by_truncate``);
    the files of the run that asked for it are discarded."""

    schema_changes: Mapping[str, Sequence[ColumnChange]]
    positions: Mapping[Position, int]
    truncate_lsns: Mapping[str, int]  # table -> its last truncate's LSN


def truncate_lsn(at: Mapping[Position, TruncateAt]) -> int | None:
    """The LSN of a table's last truncate in a batch, on whichever partition; None when the
    connector sent none."""
    return max((t.lsn for t in at.values() if t.lsn is not None), default=None)


def erased_by_truncate(lsn: int | None, truncate_at: int | None) -> bool:
    """Whether a change of a table came before the table's truncate in the source, by their LSNs.

    Kafka orders nothing across partitions, and a truncate (no key) lands on one partition of the
    topic while the table's changes, keyed by primary key, land on all of them: the offsets cannot
    tell which changes on the other partitions came first. PostgreSQL's log can. TRUNCATE takes an
    ACCESS EXCLUSIVE lock on the table, and every change to a table holds a lock on it that
    conflicts with that one until its transaction ends: so every change committed before the
    truncate was written to the log before the truncate's lock was granted (a lower LSN), and
    every change after it waits for the truncating transaction to commit (a higher LSN); changes
    in the truncate's own transaction are in the log in the order they were made. For one table,
    LSN order is the order of its changes around a truncate. Without an LSN on either side (MySQL
    sends a binlog position) the change is kept, as after the truncate: not exact within one batch
    across partitions."""
    return lsn is not None and truncate_at is not None and lsn < truncate_at


class BatchRedos:
    """The redos of one batch. A batch whose records ask for new columns, or hold a truncate, is
    done again once the tables are ready for it (rare: a schema change, a truncate); a redo after a
    truncate reads only what follows it, since what precedes it is emptied with the table: on the
    truncate's own partition from its offset on, and on every partition the changes whose LSN is
    not below the truncate's."""

    def __init__(self, tag: str, positions: Mapping[Position, int], limit: int = MAX_REDOS) -> None:
        self._tag = tag
        self._positions = dict(positions)
        self._limit = limit
        self.done = 0
        self.truncated: dict[str, dict[Position, TruncateAt]] = {}  # the truncates redone for, by table

    def after(self, job: JobResult) -> Redo | None:
        """The redo ``job`` asks for; None when it found no column change and no truncate of a
        table not yet redone for. Raises TablesKeptChanging past the limit."""
        new_truncates = {table: dict(at) for table, at in job.truncates.items() if at and table not in self.truncated}
        if not job.schema_changes and not new_truncates:
            return None
        if self.done == self._limit:
            raise TablesKeptChanging(f"batch {self._tag}: the tables kept changing under it ({self._limit} attempts)")
        self.done += 1
        self.truncated.update(new_truncates)
        positions = dict(self._positions)
        for at in self.truncated.values():
            positions.update({position: truncate.offset + 1 for position, truncate in at.items()})
        lsns = {table: truncate_lsn(at) for table, at in self.truncated.items()}
        return Redo(dict(job.schema_changes), positions, {table: lsn for table, lsn in lsns.items() if lsn is not None})


def _before_truncate(row: Mapping[str, Any], truncated: Truncates) -> bool:
    """Whether a record came before its table's truncate on its partition in this batch (a redo
    does not read it)."""
    at = truncated.get(row.get("table") or "", {}).get((row["topic"], row["kafka_partition"]))
    return at is not None and bool(row["offset"] <= at.offset)


def dead_letters(first: JobResult, last: JobResult, truncated: Truncates) -> list[DeadLetter]:
    """The batch's rejected records: the last run's, and the first run's from before a truncate
    (which no redo parsed again)."""
    if last is first:
        return dead_letters_from_rows(first.rejected)
    return dead_letters_from_rows(last.rejected + [r for r in first.rejected if _before_truncate(r, truncated)])


# ---- committing ----


@dataclass(frozen=True)
class TableCommit:
    """One table's commit of a batch: its files and the offsets it advances to, in one snapshot."""

    table: str
    batch_id: str
    written: tuple[WrittenFile, ...]  # what the batch wrote for the table
    offsets: offset_log.Offsets
    truncate: bool  # the commit empties the table first

    @property
    def what(self) -> str:
        what = f"committing batch {self.batch_id} to {self.table}"
        return f"{what} (a truncate)" if self.truncate else what

    @property
    def summary(self) -> dict[str, str]:
        return offset_log.batch_summary(self.offsets, self.batch_id)

    @property
    def files(self) -> tuple[WrittenFile, ...]:
        """The files the commit adds: after a truncate the batch's own rows are all there is, so
        its delete files have nothing to apply to."""
        if self.truncate:
            return tuple(f for f in self.written if f.kind == FileKind.DATA)
        return self.written

    @property
    def discarded(self) -> list[str]:
        """The paths of written files the commit leaves out (to delete before it)."""
        return [f.path for f in self.written if self.truncate and f.kind != FileKind.DATA]

    @property
    def data(self) -> list[str]:
        return [f.description for f in self.files if f.kind == FileKind.DATA]

    @property
    def deletes(self) -> list[str]:
        return [f.description for f in self.files if f.kind != FileKind.DATA]

    def rows(self, kind: FileKind) -> int:
        return sum(f.record_count for f in self.files if f.kind == kind)

    @property
    def global_delete_files(self) -> int:
        return sum(f.kind == FileKind.GLOBAL_DELETE for f in self.files)


def table_commits(
    batch_id: str,
    committed: Mapping[str, offset_log.Offsets],
    first: JobResult,
    last: JobResult,
    truncated: Truncates,
    letters: Sequence[DeadLetter],
) -> list[TableCommit]:
    """One commit per table the batch read, with the offsets advanced past what the first run read
    (it read every new record). A table whose batch wrote nothing (tombstones only, say) commits
    nothing, since replaying it changes nothing, unless it sent dead letters or was truncated."""
    rejected_tables = {letter.table for letter in letters}
    return [
        TableCommit(
            table,
            batch_id,
            tuple(last.files.get(table, [])),
            offset_log.advance(committed.get(table, {}), consumed),
            table in truncated,
        )
        for table, consumed in first.consumed.items()
        if last.files.get(table) or table in rejected_tables or table in truncated
    ]


def with_spec_id(description: str, old: int, new: int) -> str:
    """A file's content-file JSON naming partition spec ``new`` where it named ``old`` (a spec the
    table lost and got again under a new id)."""
    document = orjson.loads(description)
    if document.get("spec-id") == old:
        document["spec-id"] = new
    return orjson.dumps(document).decode()


def partition_deltas(layout: TableLayout, files: Iterable[WrittenFile]) -> list[PartitionDelta]:
    """What a commit added, per partition (global deletes are in none: the event counts them apart)."""
    by_partition: dict[PartitionKey, Counter[str]] = {}
    for f in files:
        if f.kind == FileKind.GLOBAL_DELETE:
            continue
        counts = by_partition.setdefault(f.partition, Counter())
        if f.kind == FileKind.DATA:
            counts.update(data_files=1, data_records=f.record_count, data_bytes=f.file_size)
        else:
            counts.update(equality_delete_files=1, equality_delete_records=f.record_count)
    return [
        PartitionDelta(
            layout.partition_record(p),
            layout.partition_path(p),
            layout.spec_id,
            data_files=counts["data_files"],
            data_bytes=counts["data_bytes"],
            data_records=counts["data_records"],
            equality_delete_files=counts["equality_delete_files"],
            equality_delete_records=counts["equality_delete_records"],
        )
        for p, counts in by_partition.items()
    ]


class Committed(Protocol):
    """A committed snapshot (``jvm.tables.CommittedSnapshot``)."""

    @property
    def snapshot_id(self) -> int: ...
    @property
    def parent_snapshot_id(self) -> int | None: ...
    @property
    def sequence_number(self) -> int: ...
    @property
    def timestamp_ms(self) -> int: ...
    @property
    def operation(self) -> str: ...
    @property
    def interleaved(self) -> int: ...


def commit_event(
    commit: TableCommit, snapshot: Committed, layout: TableLayout, unknown_columns: Mapping[str, int]
) -> CommitEvent:
    return CommitEvent(
        table=commit.table,
        snapshot_id=snapshot.snapshot_id,
        parent_snapshot_id=snapshot.parent_snapshot_id,
        sequence_number=snapshot.sequence_number,
        commit_time_ms=snapshot.timestamp_ms,
        operation=snapshot.operation,
        writer=summary.INGEST_WRITER,
        batch_id=commit.batch_id,
        source_offsets={topic: {str(p): o for p, o in parts.items()} for topic, parts in commit.offsets.items()},
        partitions=partition_deltas(layout, commit.files),
        global_delete_files=commit.global_delete_files,
        global_delete_records=commit.rows(FileKind.GLOBAL_DELETE),
        truncated=commit.truncate,
        unknown_columns=dict(unknown_columns),
    )


# ---- totals ----


@dataclass
class IngestStats:
    """Running totals, for progress lines and metrics."""

    batches: int = 0
    batches_skipped: int = 0
    records: int = 0
    dead_letters: int = 0
    dead_letters_by_reason: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    commits: int = 0
    data_records: int = 0
    delete_records: int = 0
    last_commit_seconds: float = 0.0
    # Commits by others (the compactor) that landed during one of ours and cost it a retry.
    interleaved_commits: int = 0
    last_job_seconds: float = 0.0  # the Spark job: parse, shuffle, reduce, write files
    skipped: Counter[str] = field(default_factory=Counter)  # records that are not row changes, by kind

    def count_batch(self, records: int) -> None:
        self.batches += 1
        self.records += records
        if not records:
            self.batches_skipped += 1

    def count_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        self.dead_letters += len(letters)
        for letter in letters:
            self.dead_letters_by_reason[letter.reason] += 1

    def count_skipped(self, skipped: Mapping[str, Mapping[str, int]]) -> None:
        for kinds in skipped.values():
            self.skipped.update(kinds)

    def count_commit(self, commit: TableCommit, snapshot: Committed, seconds: float) -> None:
        self.last_commit_seconds = seconds
        self.commits += 1
        self.interleaved_commits += snapshot.interleaved
        self.data_records += commit.rows(FileKind.DATA)
        self.delete_records += commit.rows(FileKind.DELETE) + commit.rows(FileKind.GLOBAL_DELETE)
