"""The maintenance strategies ``icecdc bench e2e`` compares, each beside the writer on its own
table of the same stream: ``none``; ``cron-<K>s``, Iceberg's ``rewrite_data_files`` every K
seconds; ``threshold``, a trigger in the manner of Amoro's defaults (``minor.trigger.file-count``
12) with icecdc's rewrite; ``icecdc``, the sidecar in its own process as deployed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icecdc.bench.harness import CompactorCounts, CompactorProcess
from icecdc.domain import summary
from icecdc.domain.errors import CommitConflict, CompareAndSetLost
from icecdc.domain.sourcespec import BeforeImage
from icecdc.jvm.bridge import translate
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import CompactorConfig, Config

log = logging.getLogger(__name__)

NONE, THRESHOLD, ICECDC = "none", "threshold", "icecdc"
CRON_PREFIX = "cron-"
AMORO_MINOR_FILE_COUNT = 12
THRESHOLD_EVALUATE_SECONDS = 10.0
# What most users schedule: every file a delete applies to is rewritten (delete-file-threshold=1),
# and the deletes that then apply to nothing are dropped.
CRON_OPTIONS = {"delete-file-threshold": "1", "remove-dangling-deletes": "true"}
# remove-dangling-deletes drops live global deletes (no data file lives in the unpartitioned
# spec), so rows come back: with key-only before-images the cron leaves it off, as a user must.
CRON_OPTIONS_KEY_ONLY = {"delete-file-threshold": "1"}


def cron_options(before_image: BeforeImage) -> dict[str, str]:
    """The cron's ``rewrite_data_files`` options for a table whose source sends ``before_image``."""
    return CRON_OPTIONS if before_image is BeforeImage.FULL else CRON_OPTIONS_KEY_ONLY


@dataclass
class StrategyCounts:
    """What a strategy's maintenance did over a run."""

    runs: int = 0
    commits: int = 0
    conflicts: int = 0
    failures: list[str] = field(default_factory=list)
    compactor: CompactorCounts | None = None  # the sidecar's own counts, from its metrics


def strategy_names(cron_seconds: Sequence[float]) -> tuple[str, ...]:
    """The strategies of a run, in the order they are reported."""
    return (NONE, *(f"{CRON_PREFIX}{period:g}s" for period in cron_seconds), THRESHOLD, ICECDC)


def cron_period(strategy: str) -> float | None:
    """The period of a ``cron-<K>s`` strategy; None for the others."""
    if not strategy.startswith(CRON_PREFIX):
        return None
    return float(strategy.removeprefix(CRON_PREFIX).removesuffix("s"))


def is_conflict(error: BaseException) -> bool:
    """A maintenance commit that lost to a concurrent one (counted, not a failure)."""
    return isinstance(translate(error), CommitConflict | CompareAndSetLost)


class Strategy:
    """No maintenance; the others override ``start`` and ``stop``."""

    def __init__(self) -> None:
        self.counts = StrategyCounts()

    def start(self) -> None:
        pass

    def stop(self) -> StrategyCounts:
        return self.counts


class _Periodic(Strategy):
    """A maintenance loop on a thread of the benchmark's own Spark session (a scheduled job)."""

    every_seconds: float

    def __init__(self) -> None:
        super().__init__()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> StrategyCounts:
        self._stop.set()
        self._thread.join()
        return super().stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_seconds):
            try:
                self.run_once()
            except Exception as exc:
                log.exception("%s maintenance run failed", type(self).__name__)
                self.counts.failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    def run_once(self) -> None:
        raise NotImplementedError


class CronRewrite(_Periodic):
    def __init__(self, spark: Any, config: Config, table: str, every_seconds: float) -> None:
        super().__init__()
        self._spark, self._ref, self.every_seconds = spark, config.table_ref(table), every_seconds
        self._options = ", ".join(f"'{k}', '{v}'" for k, v in cron_options(config.table(table).before_image).items())

    def run_once(self) -> None:
        self.counts.runs += 1
        try:
            result = self._spark.sql(
                f"CALL {self._ref.catalog}.system.rewrite_data_files("
                f"table => '{self._ref.identifier}', options => map({self._options}))"
            ).collect()
        except Exception as exc:
            if not is_conflict(exc):
                raise
            self.counts.conflicts += 1
            return
        if result and (result[0]["rewritten_data_files_count"] or result[0]["removed_delete_files_count"]):
            self.counts.commits += 1


def amoro_minor_due(small_files: int, equality_delete_files: int) -> bool:
    return small_files + equality_delete_files >= AMORO_MINOR_FILE_COUNT


class ThresholdCompaction(_Periodic):
    def __init__(self, spark: Any, config: Config, table: str, settings: CompactorConfig) -> None:
        from icecdc.jvm.bridge import JavaBridge
        from icecdc.jvm.tables import IcebergTable

        super().__init__()
        self._spark, self._config, self._settings = spark, config, settings
        self._table_config, self._ref = config.table(table), config.table_ref(table)
        self._catalog = pyiceberg_catalog(config)
        self._table = IcebergTable(JavaBridge(spark), self._ref)
        self.every_seconds = THRESHOLD_EVALUATE_SECONDS

    def run_once(self) -> None:
        from icecdc.compactor.metadata import load_table_partitions
        from icecdc.compactor.plans import plan_rewrite
        from icecdc.compactor.policy import Work
        from icecdc.compactor.rewrite import PartitionCompaction

        metadata = load_table_partitions(self._catalog, self._ref, self._table_config, self._settings)
        if metadata is None:
            return
        for partition in metadata.partitions.values():
            stats = partition.stats
            if not amoro_minor_due(stats.small_files, stats.equality_delete_files) or self._stop.is_set():
                continue
            key = tuple(partition.partition.get(term.name) for term in metadata.layout.partition)
            compaction = PartitionCompaction(
                self._spark,
                self._table,
                metadata.layout,
                key,
                self._config.catalog.properties,
                self._settings.target_file_size_bytes,
            )
            files = compaction.files()
            work = Work.DELETE_MERGE if stats.delete_files else Work.MINOR
            plan = plan_rewrite(files, work, self._settings) if files is not None else None
            if plan is None or plan.empty:
                continue
            self.counts.runs += 1
            try:
                compaction.run(plan, {summary.COMPACTOR: "bench-threshold"})
                self.counts.commits += 1
            except (CommitConflict, CompareAndSetLost):
                self.counts.conflicts += 1


class Sidecar(Strategy):
    """The sidecar as its own process, as deployed; ``converged`` says when it has answered every
    partition (all settled, none with deletes left on files a merge would pack), from its status."""

    def __init__(self, config: Config, out: Path) -> None:
        super().__init__()
        self._config, self._out = config, out
        self._process: CompactorProcess | None = None

    def start(self) -> None:
        self._process = CompactorProcess(self._config, "e2e-icecdc", self._out)

    def converged(self) -> bool:
        from icecdc.compactor.status import collect

        partitions = collect(self._config).partitions
        # The policy's fixed point: a partition of large files may keep position deletes and a small file.
        return bool(partitions) and all(
            p.state == "settled" and not p.equality_delete_files and p.pending is None for p in partitions
        )

    def stop(self) -> StrategyCounts:
        if self._process is None:
            raise RuntimeError("the sidecar strategy was stopped before it started")
        counts = self._process.counts(self._config.tables[0].name)
        self._process.stop()
        return StrategyCounts(
            runs=counts.compactions + counts.compactions_not_committed,
            commits=counts.compactions,
            conflicts=counts.commit_conflicts,
            compactor=counts,
        )
