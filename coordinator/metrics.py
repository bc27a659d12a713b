"""The coordinator's Prometheus metrics (served by the compactor's HTTP endpoint)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

COMMIT_ATTEMPTS = Counter(
    "icecdc_compactor_commit_attempts_total",
    "Catalog commit attempts by compactions (a lost compare-and-set retried inside Iceberg counts once more)",
    ["table"],
)
COMMIT_CONFLICTS = Counter(
    "icecdc_compactor_commit_conflicts_total",
    "Compaction commit attempts that lost: cas (another commit won the catalog's compare-and-set), "
    "validation (files changed under the compaction), lease (ownership lost), "
    "writer (another writer wrote the partitions again before the commit)",
    ["table", "kind"],
)
COMMIT_RETRIES = Counter(
    "icecdc_compactor_commit_retries_total", "Compaction commits tried again after a lost compare-and-set", ["table"]
)
COMMIT_GAVE_UP = Counter(
    "icecdc_compactor_commit_gave_up_total", "Compactions given up after losing every commit attempt", ["table"]
)
QUIET_WAIT = Histogram(
    "icecdc_compactor_quiet_wait_seconds",
    "Time a ready compaction waited for the writer's quiet window",
    ["table"],
    buckets=(0, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
SLOTS_HELD = Gauge("icecdc_compactor_slots_held", "Ownership slots this replica holds")
MAINTENANCE = Counter("icecdc_maintenance_runs_total", "Maintenance runs by kind and outcome", ["table", "kind", "outcome"])
SNAPSHOTS_EXPIRED = Counter("icecdc_maintenance_snapshots_expired_total", "Snapshots expired", ["table"])
ORPHANS_REMOVED = Counter("icecdc_maintenance_orphan_files_removed_total", "Orphan files removed", ["table"])
MANIFESTS_REWRITTEN = Counter(
    "icecdc_maintenance_manifests_rewritten_total", "Manifests replaced by manifest rewrites", ["table"]
)
