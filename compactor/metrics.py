"""The compactor's Prometheus metrics (served on ``compactor.http`` by ``icecdc.runtime.health``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from icecdc.domain.events import CommitEvent, CompactionCounts, CompactionKind, CompactionOutcome

PARTITIONS = Gauge("icecdc_compactor_partitions", "Partitions by state", ["table", "state"])
COMMIT_EVENTS = Counter("icecdc_compactor_commit_events_total", "Commit events consumed", ["outcome"])
STARTED = Counter("icecdc_compactions_started_total", "Compactions started", ["table", "kind"])
FINISHED = Counter(
    "icecdc_compactions_total",
    "Compactions finished, by outcome (committed, conflict, failed, skipped, abandoned)",
    ["table", "kind", "outcome"],
)
BYTES_READ = Counter("icecdc_compactor_bytes_read_total", "Data file bytes rewritten", ["table"])
BYTES_WRITTEN = Counter("icecdc_compactor_bytes_written_total", "Data file bytes this replica's compactions committed", ["table"])
# Beside BYTES_WRITTEN: the write amplification is (the bytes every replica wrote + the writer's)
# over the writer's. Every replica reads every commit event, so take this from one replica.
WRITER_BYTES = Counter(
    "icecdc_compactor_writer_bytes_total", "Data file bytes the writer committed, from its commit events", ["table"]
)
DATA_FILES_REMOVED = Counter("icecdc_compactor_data_files_removed_total", "Data files replaced by compactions", ["table"])
DATA_FILES_ADDED = Counter("icecdc_compactor_data_files_added_total", "Data files written by compactions", ["table"])
DELETE_FILES_REMOVED = Counter("icecdc_compactor_delete_files_removed_total", "Delete files removed by compactions", ["table"])
POSITION_DELETE_FILES_ADDED = Counter(
    "icecdc_compactor_position_delete_files_added_total",
    "Position-delete files written by equality-to-position conversions",
    ["table"],
)
SETTLE_TO_COMPACTED = Histogram(
    "icecdc_compactor_settle_to_compacted_seconds",
    "From a partition settling to its compaction committing",
    ["table"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
)
GLOBAL_DELETE_FILES = Gauge(
    "icecdc_compactor_global_delete_files",
    "Live global equality-delete files (keys whose old partition was unknown; they apply to every partition)",
    ["table"],
)
GLOBAL_DELETE_AGE = Gauge(
    "icecdc_compactor_global_delete_age_seconds", "Age of the oldest live global equality-delete file (0: none)", ["table"]
)
OLDEST_EQUALITY_DELETE_AGE = Gauge(
    "icecdc_compactor_oldest_equality_delete_age_seconds",
    "Age of the table's oldest live equality-delete file, partitioned or global (0: none); "
    "compactor.portable_within_seconds is its target",
    ["table"],
)
PORTABLE = Gauge(
    "icecdc_compactor_portable",
    "1 when the table holds no live equality-delete file (readers that cannot apply them can read it), else 0",
    ["table"],
)
MANIFESTS_READ = Counter(
    "icecdc_compactor_manifests_read_total",
    "Manifests a metadata reconcile needed: opened (new since the last read) or cached (read before)",
    ["table", "source"],
)

# The key index (``key_index``): bytes held over keys held is its bytes per key.
KEY_INDEX_BYTES = Gauge("icecdc_compactor_key_index_bytes", "Bytes the key index holds", ["table"])
KEY_INDEX_KEYS = Gauge("icecdc_compactor_key_index_keys", "Keys (data file rows) the key index holds", ["table"])


def compaction_finished(table: str, kind: CompactionKind, outcome: CompactionOutcome, counts: CompactionCounts) -> None:
    FINISHED.labels(table, kind.value, outcome.value).inc()
    BYTES_READ.labels(table).inc(counts.bytes_rewritten)
    BYTES_WRITTEN.labels(table).inc(counts.bytes_added)
    DATA_FILES_REMOVED.labels(table).inc(counts.data_files_rewritten)
    DATA_FILES_ADDED.labels(table).inc(counts.data_files_added)
    DELETE_FILES_REMOVED.labels(table).inc(counts.delete_files_removed)
    POSITION_DELETE_FILES_ADDED.labels(table).inc(counts.position_delete_files_added)


def writer_committed(event: CommitEvent) -> None:
    WRITER_BYTES.labels(event.table).inc(sum(p.data_bytes for p in event.partitions))


MAIN_MOVES = Counter(
    "icecdc_compactor_main_moves_total",
    "Times a staged table's main was moved to its staging branch's newest portable snapshot",
    ["table"],
)
MAIN_BEHIND = Gauge(
    "icecdc_compactor_main_behind_seconds",
    "How far a staged table's main is behind its staging branch's head, by commit time (0: at the head)",
    ["table"],
)
