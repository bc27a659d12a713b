"""The one YAML configuration file every icecdc command reads.

Validation errors name the offending key by its path (``tables[0].partition_by[1]``). Secrets
stay out of the file: any string value may reference the environment as ``${NAME}`` or
``${NAME:-default}``, expanded before validation (the docker-compose convention, so the same
file works on a laptop, in compose and in a Kubernetes pod fed from a Secret).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from icecdc.domain.errors import UserError
from icecdc.domain.sourcespec import BeforeImage, SourceRules, TruncateMode, UnavailableValues, UnknownPartition
from icecdc.domain.tableref import MAIN_BRANCH, TableRef
from icecdc.domain.tablespec import (
    PartitionField,
    TableShape,
    TableSpecError,
    normalize_type,
    parse_partition_field,
)
from icecdc.runtime.logs import register_secrets

DEFAULT_STATE_DIR = ".icecdc"
EMBEDDED_BROKER_PORT = 19092

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BRANCH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_SECRET_KEY = re.compile(r"(password|secret|token|credential|jaas|private|key\.pem)", re.IGNORECASE)


class ConfigError(UserError, ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


class _Strict(BaseModel):
    # Unknown keys are errors: a typo such as `primry_key` must not be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


ScalarProperty = str | int | float | bool


class KafkaConfig(_Strict):
    bootstrap_servers: str = f"127.0.0.1:{EMBEDDED_BROKER_PORT}"
    # Extra librdkafka settings passed through as-is (security.protocol, sasl.*, ssl.*, ...).
    properties: dict[str, ScalarProperty] = Field(default_factory=dict)

    def client_config(
        self, defaults: Mapping[str, ScalarProperty] | None = None, **overrides: ScalarProperty
    ) -> dict[str, ScalarProperty]:
        """librdkafka settings: icecdc's defaults, then the user's properties, then the caller's
        overrides (which are what the code depends on, e.g. manual offset commits)."""
        return {"bootstrap.servers": self.bootstrap_servers, **(defaults or {}), **self.properties, **overrides}


class CatalogRetryConfig(_Strict):
    """How long a command rides out a catalog that does not answer (a lock held past the busy
    timeout, a REST catalog restarting, a database failover): every catalog call is retried
    with jittered exponential backoff, from ``backoff_seconds`` up to ``backoff_max_seconds``
    between tries, and the command stops (exit code 75) once the catalog has been unavailable
    for ``give_up_seconds`` without a break."""

    give_up_seconds: float = Field(default=600.0, gt=0)
    backoff_seconds: float = Field(default=1.0, gt=0)
    backoff_max_seconds: float = Field(default=30.0, gt=0)


class CatalogConfig(_Strict):
    name: str = "lake"
    # Iceberg catalog properties, given to Spark (spark.sql.catalog.<name>.<key>) and to pyiceberg.
    properties: dict[str, str]
    retry: CatalogRetryConfig = Field(default_factory=CatalogRetryConfig)

    @field_validator("name")
    @classmethod
    def _name_is_identifier(cls, value: str) -> str:
        if not _IDENT.match(value):
            raise ValueError(f"catalog name {value!r} must be a SQL identifier (letters, digits, _)")
        return value

    @field_validator("properties")
    @classmethod
    def _has_type(cls, value: dict[str, str]) -> dict[str, str]:
        if "type" not in value and "catalog-impl" not in value:
            raise ValueError("needs 'type' (jdbc, rest, hive, glue, hadoop, ...) or 'catalog-impl'")
        return value


class TableConfig(_Strict):
    name: str
    # The Kafka topic icecdc's ingester mirrors into the table. Unset, another writer writes the
    # table and only the sidecar keeps it.
    topic: str | None = None
    # The source's primary key. Empty on an ingested table, the table is mirrored append-only.
    primary_key: list[str] = Field(default_factory=list)
    partition_by: list[str] = Field(default_factory=list)
    # column -> Iceberg type; when given, the table is created if missing and checked if present.
    schema_: dict[str, str] | None = Field(default=None, alias="schema")
    # Extra table properties applied when icecdc creates the table.
    properties: dict[str, str] = Field(default_factory=dict)
    # The Iceberg format version a created table gets (2 when unset). 3 turns position deletes
    # into deletion vectors, which readers apply faster; engines that cannot read format v3 (Spark
    # before Iceberg 1.8, most query engines of 2025) cannot read such a table at all, and no
    # table goes back from 3 to 2. Set, it is also checked against an existing table.
    format_version: Literal[2, 3] | None = None
    # What the source's before-images hold (icecdc/domain/sourcespec.py, docs/ingest.md "Sources as they
    # are"). The default trusts them for the key only, which is never wrong; ``full`` saves the
    # global deletes of updates and deletes whose old partition the key does not determine.
    before_image: BeforeImage = BeforeImage.KEY
    # An update or delete whose row's old partition is unknown: deleted in every partition (exact),
    # or dead-lettered, or taken not to have moved.
    unknown_partition: UnknownPartition = UnknownPartition.GLOBAL_DELETE
    # A truncate (op t) empties the table at its offset, or goes to the dead-letter topic.
    truncate: TruncateMode = TruncateMode.APPLY
    # The table follows the source's columns, as the Connect schema wrapper tells them: a new
    # field becomes a new optional column, a widening Iceberg allows is made, one commit each
    # before the batch's data. Off: new fields are counted and logged, never written.
    evolve_schema: bool = True
    # Without the schema wrapper, a new field's column type is taken from its JSON values (number
    # -> long or double, text -> string, true/false -> boolean). Off: counted and logged.
    infer_new_columns: bool = False
    # A value the source did not send (Debezium's placeholder for an unchanged TOAST value):
    # resolved from the row's earlier version (exact), dead-lettered, or written as it came.
    unavailable_values: UnavailableValues = UnavailableValues.RESOLVE
    # Staged commits: the ingester and the compactor commit to this branch, and the compactor
    # moves ``main`` to the branch's newest snapshot without equality deletes, so every engine
    # that reads ``main`` (Snowflake, Databricks, pyiceberg, Polars) can read it at any moment,
    # a conversion behind the writer. Unset: everything commits to ``main`` and equality deletes
    # live there until converted (docs/compactor.md, "Staged commits", says what each costs).
    staging_branch: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("name")
    @classmethod
    def _qualified(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) < 2 or not all(_IDENT.match(p) for p in parts):
            raise ValueError(f"table name {value!r} must be namespace.table (e.g. db.orders)")
        return value

    @field_validator("staging_branch")
    @classmethod
    def _branch(cls, value: str | None) -> str | None:
        if value is not None and (value == MAIN_BRANCH or not _BRANCH.match(value)):
            raise ValueError(
                f"staging_branch {value!r} must be a branch name other than {MAIN_BRANCH!r} (letters, digits, _ . -)"
            )
        return value

    @field_validator("schema_")
    @classmethod
    def _types(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("schema must list at least one column")
        out = {}
        for column, kind in value.items():
            if not _IDENT.match(column):
                raise ValueError(f"column name {column!r} must be an identifier")
            try:
                out[column] = normalize_type(str(kind))
            except TableSpecError as exc:
                raise ValueError(f"column {column!r}: {exc}") from None
        return out

    @model_validator(mode="after")
    def _keys_and_partitions_fit_schema(self) -> TableConfig:
        columns = self.schema_
        if columns is not None:
            missing = [k for k in self.primary_key if k not in columns]
            if missing:
                raise ValueError(f"primary_key column(s) {missing} are not in the schema")
        for text in self.partition_by:
            try:
                parse_partition_field(text, columns)
            except TableSpecError as exc:
                raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _append_only_takes_no_update_rules(self) -> TableConfig:
        # These options say how updates and deletes are applied; an append-only mirror dead-letters
        # them, so a setting there would promise what never happens.
        if self.ingested and not self.primary_key:
            defaults = TableConfig.model_fields
            set_ = [
                name
                for name in ("before_image", "unknown_partition", "unavailable_values")
                if getattr(self, name) != defaults[name].default
            ]
            if set_:
                raise ValueError(
                    f"table {self.name} has no primary_key, so it is mirrored append-only and its updates and deletes go to "
                    f"the dead-letter topic: {', '.join(set_)} apply to updates and deletes only; remove them, or give "
                    "the table its primary_key"
                )
        return self

    @property
    def ingested(self) -> bool:
        """Whether icecdc's ingester writes the table (it has a topic)."""
        return self.topic is not None

    @property
    def source_topic(self) -> str:
        """The topic of an ingested table."""
        if self.topic is None:
            raise ValueError(f"table {self.name} has no topic: icecdc's ingester does not write it")
        return self.topic

    @property
    def partition_fields(self) -> tuple[PartitionField, ...]:
        return tuple(parse_partition_field(t, self.schema_) for t in self.partition_by)

    @property
    def source_rules(self) -> SourceRules:
        return SourceRules(
            self.before_image,
            self.unknown_partition,
            self.truncate,
            self.evolve_schema,
            self.infer_new_columns,
            self.unavailable_values,
        )

    @property
    def shape(self) -> TableShape | None:
        if self.schema_ is None:
            return None
        return TableShape(dict(self.schema_), tuple(self.primary_key), self.partition_fields, self.format_version)


class SparkConfig(_Strict):
    master: str = "local[2]"
    conf: dict[str, ScalarProperty] = Field(default_factory=dict)

    @field_validator("conf")
    @classmethod
    def _spark_keys(cls, value: dict[str, ScalarProperty]) -> dict[str, ScalarProperty]:
        bad = [k for k in value if not k.startswith("spark.")]
        if bad:
            raise ValueError(f"keys must start with 'spark.': {bad}")
        return value


class HttpConfig(_Strict):
    """Where a command serves /metrics, /healthz and /readyz; ``port: null`` turns it off."""

    host: str = "0.0.0.0"
    port: int | None = Field(default=None, ge=0, le=65535)
    # Liveness fails when the main loop has made no progress for this long.
    stall_seconds: float = Field(default=900.0, gt=0)


class IngestConfig(_Strict):
    # auto: Spark's Kafka source when its connector is on the classpath, else the direct reader.
    source: Literal["auto", "streaming", "direct"] = "auto"
    max_batch_records: int = Field(default=50_000, gt=0)
    # A direct batch of at most this many records runs in the driver, with no Spark job (0: always
    # on Spark). A Spark job has a fixed cost a batch, and the driver was faster at every batch size
    # measured (docs/BENCHMARKS.md, row "Batch size and tables per batch"). Larger batches go to
    # Spark, whose executors hold them instead of the driver. On a cluster of many executors, lower
    # it to where their parallelism pays for the job's fixed cost.
    driver_batch_records: int = Field(default=200_000, ge=0)
    # A batch spanning several tables commits to this many at once (1: one after the other).
    # Eight threads, because a commit waits on files and the catalog more than it computes
    # (docs/BENCHMARKS.md, row "Many tables in one batch"). More threads cost no catalog
    # connections: Iceberg's JDBC and Hive catalogs share a pool of ``clients`` (2 by default)
    # however many threads commit, and a source of one table commits on one thread.
    commit_threads: int = Field(default=8, ge=1, le=64)
    # The shortest time between the starts of two batches: it caps the commits a second per table,
    # and with them the files the sidecar must compact, so a higher floor trades freshness for
    # fewer files (docs/operations.md, "Freshness against files"). One second, for freshness;
    # three keep the sidecar's rewriting within its goal (docs/BENCHMARKS.md, row "Commit floor").
    min_commit_interval_seconds: float = Field(default=1.0, gt=0)
    # The longest a record waits in a batch that is still collecting (the direct reader only):
    # a batch is written once its records are all read and the floor has passed, or after this.
    max_commit_delay_seconds: float = Field(default=5.0, gt=0)
    consumer_group: str = "icecdc-ingest"
    http: HttpConfig = Field(default_factory=lambda: HttpConfig(port=9401))

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "trigger_seconds" in data:
            raise ValueError(
                "trigger_seconds is gone: set min_commit_interval_seconds (the floor between batches) "
                "and max_commit_delay_seconds (the longest a record waits), see docs/configuration.md"
            )
        return data

    @model_validator(mode="after")
    def _delay_above_floor(self) -> IngestConfig:
        if self.max_commit_delay_seconds < self.min_commit_interval_seconds:
            raise ValueError(
                f"max_commit_delay_seconds ({self.max_commit_delay_seconds:g}) is below "
                f"min_commit_interval_seconds ({self.min_commit_interval_seconds:g})"
            )
        return self


MIB = 1024 * 1024


class SettleConfig(_Strict):
    """When a partition counts as settled: no write for ``cadence_multiple`` times its usual gap
    between writes (the median of the recent gaps seen in the commit stream), clamped to
    [min_seconds, max_seconds]. A partition written every 5 s settles after 15 s of silence, one
    written every 10 min after 30 min. Until two writes give it a cadence: ``initial_seconds``."""

    cadence_multiple: float = Field(default=3.0, ge=1.0)
    min_seconds: float = Field(default=30.0, ge=0)
    max_seconds: float = Field(default=1800.0, gt=0)
    initial_seconds: float = Field(default=120.0, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> SettleConfig:
        if self.min_seconds > self.max_seconds:
            raise ValueError(f"min_seconds ({self.min_seconds}) is above max_seconds ({self.max_seconds})")
        return self


class RewriteEngine(enum.Enum):
    """What rewrites data files with their deletes applied (docs/compactor.md, "Rewrite engines")."""

    ARROW = "arrow"  # pyarrow on executors (format v2 tables; v3 ones always use Spark)
    SPARK = "spark"  # Iceberg's Spark reader and writer


class CompactorConfig(_Strict):
    consumer_group: str = "icecdc-compactor"
    http: HttpConfig = Field(default_factory=lambda: HttpConfig(port=9402))
    # Names this replica in snapshot summaries and compaction events; default: host-pid.
    replica_id: str | None = None
    # Amoro's defaults: 128 MB files; a "small" file is under target / small_file_ratio; files of
    # at least large_file_ratio * target are left whole (deletes on them become position deletes).
    target_file_size_bytes: int = Field(default=128 * MIB, gt=0)
    small_file_ratio: float = Field(default=8.0, gt=1.0)
    large_file_ratio: float = Field(default=0.75, gt=0, le=1.0)
    # arrow: a delete merge's rows are read, filtered and written with pyarrow on executors
    # (docs/BENCHMARKS.md, row "Rewrite throughput"); format v3 tables always use spark, whose
    # rewrite carries row lineage. spark: Iceberg's own Spark reader and writer.
    rewrite_engine: RewriteEngine = RewriteEngine.ARROW
    # Bin-packing is worth a commit from this many small files in a partition.
    min_small_files: int = Field(default=12, ge=2)
    # A settled partition nobody has written for this many settle windows gets one last pack of
    # its small files, even under ``min_small_files``: nobody will add the files
    # that would make the minor compaction worth it. Two windows, not one, so that a writer
    # that pauses once and comes back does not have its partition packed just before it writes
    # more small files (docs/compactor.md, "The last pack").
    last_pack_after_windows: float = Field(default=2.0, ge=1.0)
    # Small settled partitions of a table compacted by one Spark job and one commit, when they
    # fit in one target file together (``scheduler.job_partitions``): a job's fixed cost dominates
    # a small partition's compaction (docs/BENCHMARKS.md, row "Partitions per job"). 1: a job each.
    # A job's partitions share its outcome: one conflict retries them all.
    partitions_per_job: int = Field(default=16, ge=1)
    # A large file carrying position deletes for at least this share of its rows is rewritten.
    position_delete_rewrite_ratio: float = Field(default=0.1, gt=0, le=1.0)
    # A partition still being written is kept within this many times the read cost of its
    # compacted self (docs/compactor.md, "Hot partitions: the read budget"): past it, the
    # cheapest of converting its equality deletes, packing the writer's small files, or a full
    # delete merge that brings it back under. Three, because a higher budget lets reads slow
    # down more and a lower one rewrites far more (docs/BENCHMARKS.md, row "Hot read budget").
    hot_read_budget: float = Field(default=3.0, ge=1.0)
    # Hard ceilings besides the budget: past either, a hot partition gets a full delete merge.
    hot_max_delete_files: int = Field(default=64, ge=1)
    hot_max_small_files: int = Field(default=128, ge=2)
    # The key index (docs/compactor.md, "The key index"): each converted partition's key columns
    # kept in memory, so a batch's conversion reads the batch's files, not the partition's. Past
    # this many bytes the least recently converted partitions are evicted (read again on their
    # next conversion). 0: no index, every conversion reads its partition's keys in a Spark job.
    key_index_max_bytes: int = Field(default=256 * MIB, ge=0)
    # The portability target (docs/compactor.md, "Portability"): no live equality-delete file,
    # partitioned or global, older than this, in any partition, hot or settled, while the writer
    # writes. Readers that cannot apply equality deletes (Snowflake, Databricks, pyiceberg,
    # Polars; Dremio for global ones) read the table once none is live. A partition whose oldest
    # equality delete reaches half of it gets a conversion (or the table a resolution of its
    # global deletes), ranked ahead of every merge and pack (``policy.portability_work``).
    portable_within_seconds: float = Field(default=10.0, gt=0)
    # The sidecar's commits also merge the table's small manifests, data and delete ones, into
    # one of each (``IcebergTable.commit``, merge_manifests): a hot table read while it is written
    # holds a few manifests, not the dozen the writer's own merging lets pile up, and the writer
    # pays nothing for it (docs/compactor.md, "Manifests while writing").
    merge_manifests: bool = True
    # How often every table's metadata is re-read, to catch what commit events missed.
    reconcile_seconds: float = Field(default=60.0, gt=0)
    # How often each table kept for another writer (no topic, so no commit events) is loaded from
    # the catalog to find its writer's new commits (docs/compactor.md, "Beside other writers").
    # Five seconds: a sixth of the shortest settle window, so a partition the writer writes again is
    # known hot long before it could count as settled, at one metadata load per table per poll
    # (docs/BENCHMARKS.md, row "Commit watch at 100 tables").
    watch_interval_seconds: float = Field(default=5.0, gt=0)
    # A failed compaction is retried after retry_base_seconds * 2^(n-1) (jittered, capped),
    # and given up after max_attempts until the partition is written again.
    max_attempts: int = Field(default=5, ge=1)
    retry_base_seconds: float = Field(default=10.0, ge=0)
    retry_max_seconds: float = Field(default=600.0, ge=0)
    settle: SettleConfig = Field(default_factory=SettleConfig)

    @property
    def small_file_bytes(self) -> int:
        return int(self.target_file_size_bytes / self.small_file_ratio)

    @property
    def large_file_bytes(self) -> int:
        return int(self.target_file_size_bytes * self.large_file_ratio)


class MaintenanceConfig(_Strict):
    """Snapshot expiry, orphan-file removal and manifest rewrites, run per table by the replica
    that owns the table's maintenance slot, never while a compaction of the table is running."""

    enabled: bool = True
    interval_seconds: float = Field(default=900.0, gt=0)
    # Snapshots older than this are expired, except the newest ``retain_last``, the starting
    # snapshot of every running compaction and each writer's newest exactly-once marker (and
    # everything after it): the ingester, a Flink job or a Kafka Connect sink recovers from it.
    snapshot_retention_seconds: float = Field(default=6 * 3600.0, ge=0)
    retain_last: int = Field(default=10, ge=1)
    # Files under the table location that no snapshot references are removed once this old. It
    # must exceed the longest micro-batch and the longest compaction, whose files are
    # unreferenced until they commit: below an hour is refused.
    orphan_age_seconds: float = Field(default=3 * 24 * 3600.0, ge=3600.0)
    orphan_interval_seconds: float = Field(default=24 * 3600.0, gt=0)
    # Every query that cannot prune a manifest by partition opens it (a point lookup by key opens
    # them all), and each writer commit adds a data and a delete manifest, each compaction
    # another; Iceberg merges manifests on commit only from 100 on. So every
    # ``manifest_interval_seconds`` (a manifest-list read) the small manifests (under half the
    # table's commit.manifest.target-size-bytes) are counted, and past ``max_small_manifests``
    # the small data manifests, and only they, are merged (the delete manifests only when they
    # alone are past it: ``coordinator.maintenance.manifests_to_merge``). Eight, since every
    # small manifest slows a point lookup (docs/BENCHMARKS.md, row "Small manifests on a lookup").
    manifest_interval_seconds: float = Field(default=60.0, gt=0)
    max_small_manifests: int = Field(default=8, ge=1)


class CoordinatorConfig(_Strict):
    """How compactor replicas share partitions, and when a compaction may commit
    (docs/coordinator.md)."""

    # Partition ownership: every partition hashes to one of ``lease_slots`` slots, the
    # partitions of ``lease_topic``, which the compactor consumer group shares out. The slot count
    # caps how many replicas can do useful work; it is fixed when the topic is created.
    lease_topic: str = "icecdc.compactor-leases"
    lease_slots: int = Field(default=32, ge=1)
    # A replica that stops heartbeating loses its slots after this (Kafka's session timeout).
    session_timeout_seconds: float = Field(default=10.0, ge=1.0)
    # The longest compaction: a replica busy longer is dropped from the group (and its commit
    # then fails its lease check). Other replicas wait up to this long for a rebalance.
    max_compaction_seconds: float = Field(default=1800.0, ge=10.0)
    # Commit only in the writer's quiet windows, learned from its commit events.
    quiet_windows: bool = True
    # The longest wait for a quiet window; then the compaction commits anyway.
    max_quiet_wait_seconds: float = Field(default=30.0, ge=0)
    # A commit that loses the catalog's compare-and-set (after Iceberg's own retries) is tried
    # again this many times in all, with jittered exponential backoff, then given up: a
    # compaction yields rather than starving the writer.
    commit_attempts: int = Field(default=4, ge=1)
    commit_backoff_seconds: float = Field(default=0.5, ge=0)
    commit_backoff_max_seconds: float = Field(default=10.0, ge=0)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)


class Config(_Strict):
    # Local state: the embedded broker's pid/log, checkpoints, and (embedded default) catalog.
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    catalog: CatalogConfig
    tables: list[TableConfig] = Field(default_factory=list)
    commit_topic: str = "icecdc.commits"
    dead_letter_topic: str = "icecdc.dlq"
    compaction_topic: str = "icecdc.compactions"
    maintenance_topic: str = "icecdc.maintenance"
    spark: SparkConfig = Field(default_factory=SparkConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    compactor: CompactorConfig = Field(default_factory=CompactorConfig)
    coordinator: CoordinatorConfig = Field(default_factory=CoordinatorConfig)

    @model_validator(mode="after")
    def _unique(self) -> Config:
        for attr in ("name", "topic"):
            seen: set[str] = set()
            for table in self.tables:
                value = getattr(table, attr)
                if value is None:
                    continue
                if value in seen:
                    raise ValueError(f"two tables share the {attr} {value!r}")
                seen.add(value)
        return self

    @property
    def ingested_tables(self) -> list[TableConfig]:
        """The tables icecdc's ingester writes, in the configuration's order."""
        return [table for table in self.tables if table.ingested]

    def table(self, name: str) -> TableConfig:
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"table {name!r} is not in the configuration")

    def find_table(self, name: str) -> TableConfig | None:
        return next((table for table in self.tables if table.name == name), None)

    def table_ref(self, table: TableConfig | str) -> TableRef:
        """The configured table in this config's catalog, on its staging branch if it has one (a
        name that is not configured: on ``main``)."""
        if isinstance(table, str):
            found = self.find_table(table)
            if found is None:
                return TableRef.of(self.catalog.name, table)
            table = found
        return TableRef.of(self.catalog.name, table.name, table.staging_branch or MAIN_BRANCH)

    def secret_values(self) -> list[str]:
        """The values ``redacted`` masks, for masking them in logs too."""
        return _secrets(self.model_dump(mode="json", by_alias=True))

    def redacted(self) -> dict[str, Any]:
        """The configuration as plain data with secret-looking values masked, for display."""
        return _redact(self.model_dump(mode="json", by_alias=True))


def _secrets(value: Any, key: str = "") -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _secrets(v, k)]
    if isinstance(value, list):
        return [s for v in value for s in _secrets(v, key)]
    return [str(value)] if key and _SECRET_KEY.search(key) and value not in (None, "") else []


def _redact(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _redact(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, key) for v in value]
    if key and _SECRET_KEY.search(key) and value not in (None, ""):
        return "***"
    return value


def embedded_config(state_dir: Path, port: int = EMBEDDED_BROKER_PORT, **overrides: Any) -> Config:
    """The zero-setup default: embedded broker, SQLite JDBC catalog and a local warehouse,
    all under ``state_dir``."""
    state = state_dir.resolve()
    data: dict[str, Any] = {
        "state_dir": str(state),
        "kafka": {"bootstrap_servers": f"127.0.0.1:{port}"},
        "catalog": {
            "name": "lake",
            "properties": {
                "type": "jdbc",
                "uri": f"jdbc:sqlite:{state / 'catalog.db'}",
                "warehouse": str(state / "warehouse"),
                # The current JDBC catalog layout (with views); pyiceberg's sql catalog reads it too.
                "jdbc.schema-version": "V1",
                # Several processes share one SQLite file (ingester, compactor, status); a writer
                # waits for another's lock instead of failing with SQLITE_BUSY after 3 s.
                "jdbc.busy_timeout": "30000",
            },
        },
    }
    data.update(overrides)
    # No fixed HTTP ports on a laptop or in tests (they would collide between runs); a caller
    # that wants the endpoints sets a port (0: any free one).
    for section in ("ingest", "compactor"):
        data[section] = {"http": {"port": None}, **data.get(section, {})}
    return Config.model_validate(data)


def expand_env(value: Any, path: str = "", environ: Mapping[str, str] | None = None) -> Any:
    """Replace ``${NAME}`` / ``${NAME:-default}`` in every string of a loaded YAML document."""
    env = os.environ if environ is None else environ
    if isinstance(value, dict):
        return {k: expand_env(v, f"{path}.{k}" if path else str(k), env) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{path}[{i}]", env) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{path}: environment variable {name} is not set (write ${{{name}:-default}} to allow a default)")

    return _ENV_REF.sub(substitute, value)


def _format_location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def format_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for item in error.errors():
        # A union of scalar types reports one error per member; the first says enough.
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and p in {"str", "int", "float", "bool"}))
        where = _format_location(loc)
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        elif item["type"] == "missing":
            message = "required key is missing"
        else:
            message = item["msg"].removeprefix("Value error, ")
        line = f"  {where}: {message}"
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        config = Config.model_validate(expand_env(data))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None
    register_secrets(config.secret_values())
    return config


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, expand and validate a configuration file. Relative ``state_dir`` paths are taken
    relative to the file, so a config works from any working directory."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read configuration: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    config = parse_config(data if data is not None else {}, str(file))
    if not config.state_dir.is_absolute():
        config = config.model_copy(update={"state_dir": (file.parent / config.state_dir).resolve()})
    return config
