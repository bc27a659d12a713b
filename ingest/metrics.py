"""The ingester's Prometheus metrics (served by ``icecdc.runtime.health`` on ``ingest.http``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BATCHES = Counter("icecdc_ingest_batches_total", "Micro-batches processed (including replays with nothing new)")
RECORDS = Counter("icecdc_ingest_records_total", "Kafka records consumed into committed batches")
DEAD_LETTERS = Counter("icecdc_ingest_dead_letters_total", "Records sent to the dead-letter topic", ["reason"])
COMMITS = Counter("icecdc_ingest_commits_total", "Iceberg commits", ["table"])
ROWS_WRITTEN = Counter("icecdc_ingest_rows_written_total", "Rows written: data rows and equality-delete keys", ["table", "kind"])
COMMIT_SECONDS = Histogram(
    "icecdc_ingest_commit_seconds", "Iceberg commit latency", ["table"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
)
COMMIT_INTERLEAVED = Counter(
    "icecdc_ingest_commit_interleaved_total",
    "Commits by others (compactions) that landed during an ingest commit, each costing it a retry",
    ["table"],
)
BATCH_ENDS = Counter(
    "icecdc_ingest_batch_ends_total",
    "Direct-reader batches by why they stopped collecting records: full, caught-up or delay-reached",
    ["reason"],
)
BATCH_SECONDS = Histogram(
    "icecdc_ingest_batch_seconds", "Micro-batch latency, read to commit", buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
)
JOB_SECONDS = Histogram(
    "icecdc_ingest_job_seconds",
    "A batch's job (parse, reduce, write files), by where it ran: driver or spark (ingest.driver_batch_records)",
    ["where"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
COMMIT_EVENTS = Counter("icecdc_ingest_commit_events_published_total", "Commit events delivered to the commit topic")
COMMIT_EVENTS_RETRIED = Counter(
    "icecdc_ingest_commit_events_retried_total",
    "Commit events whose delivery failed after librdkafka's own retries, kept and sent again",
)
LAG = Gauge(
    "icecdc_ingest_lag_records",
    "Records behind the high watermarks (approximate; the embedded broker's watermarks are off by a few)",
)
SKIPPED = Counter("icecdc_ingest_skipped_records_total", "Records that are not row changes, skipped", ["table", "kind"])
UNKNOWN_COLUMNS = Counter(
    "icecdc_ingest_unknown_column_values_total",
    "Values of source fields the table has no column for (not written)",
    ["table", "column"],
)
SCHEMA_CHANGES = Counter("icecdc_ingest_schema_changes_total", "Columns added or widened to follow the source", ["table", "kind"])
TRUNCATES = Counter("icecdc_ingest_truncates_total", "Truncates applied (the table emptied in one commit)", ["table"])
UNAVAILABLE_ROWS = Counter(
    "icecdc_ingest_unavailable_rows_total",
    "Rows whose unsent (TOAST) values the batch did not hold: completed from the table, or dead-lettered",
    ["table", "outcome"],
)
