"""``icecdc status``: each table's portability (its oldest live equality delete against
``compactor.portable_within_seconds``), every partition's state, files, deletes and read cost, and
each table's unresolved global deletes (a "(global deletes)" row: its "last write" is when the
oldest was committed), and for a staged table how far main, what readers read, is behind its
staging branch's head. A running sidecar
writes its own view (hot, settling, settled, compacting as it sees them) to a status file and
refreshes its partition gauges; ``icecdc status`` shows that view while it is fresh, and
otherwise one computed from table metadata alone (no Spark, no Kafka)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from icecdc.compactor import metrics
from icecdc.compactor.metadata import branch_history, table_partitions
from icecdc.compactor.staging import StagedMain
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH, PartitionStatus, PartitionTracker, TablePortability, status_portability
from icecdc.domain.portable import main_behind
from icecdc.runtime.catalog import load_metadata_table, pyiceberg_catalog
from icecdc.runtime.config import Config

STATUS_FILE = "compactor-status.json"
# The status file is rewritten at most this often, and around each compaction.
WRITE_INTERVAL = 1.0
# A running sidecar rewrites its status at least this often, except during a compaction.
FRESH_SECONDS = 120.0
STATES = ("hot", "settling", "settled", "compacting")


def status_path(config: Config) -> Path:
    return config.state_dir / "compactor" / STATUS_FILE


@dataclass(frozen=True)
class StatusReport:
    source: str  # which view this is: a running compactor's, or table metadata's
    updated: float
    partitions: list[PartitionStatus]
    portable_within_seconds: float | None = None  # the portability target (None: a report older than it)
    staged: list[StagedMain] = dataclasses.field(default_factory=list)  # staged tables' mains

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> StatusReport:
        return cls(
            document["source"],
            document["updated"],
            [PartitionStatus(**p) for p in document["partitions"]],
            document.get("portable_within_seconds"),
            [StagedMain.from_dict(m) for m in document.get("staged", [])],
        )


class StatusWriter:
    """The running sidecar's view, in its status file and its partition gauges."""

    def __init__(
        self,
        config: Config,
        replica: str,
        tracker: PartitionTracker,
        owned: Callable[[str, str], bool],
        clock: Callable[[], float] = time.time,
        staged_mains: Callable[[], list[StagedMain]] = list,
    ) -> None:
        self._config = config
        self._staged_mains = staged_mains
        self._replica = replica
        self._tracker = tracker
        self._owned = owned
        self._clock = clock
        self._last = float("-inf")

    def write(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last < WRITE_INTERVAL:
            return
        self._last = now
        rows = self._tracker.report(now, owned=self._owned)
        portability = status_portability(rows)
        for table in self._config.tables:
            counts = dict.fromkeys(STATES, 0)
            global_files, oldest = 0, None
            for row in rows:
                if row.table != table.name:
                    continue
                if row.partition == GLOBAL_DELETES_PATH:
                    global_files, oldest = row.equality_delete_files, row.oldest_write
                else:
                    counts[row.state] += 1
            for state, count in counts.items():
                metrics.PARTITIONS.labels(table.name, state).set(count)
            metrics.GLOBAL_DELETE_FILES.labels(table.name).set(global_files)
            metrics.GLOBAL_DELETE_AGE.labels(table.name).set(max(0.0, now - oldest) if global_files and oldest else 0.0)
            if (known := portability.get(table.name)) is not None:
                metrics.OLDEST_EQUALITY_DELETE_AGE.labels(table.name).set(known.oldest_age(now))
                metrics.PORTABLE.labels(table.name).set(1 if known.portable else 0)
        path = status_path(self._config)
        path.parent.mkdir(parents=True, exist_ok=True)
        report = StatusReport(
            f"compactor {self._replica}", now, rows, self._config.compactor.portable_within_seconds, self._staged_mains()
        )
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
        temporary.replace(path)


def collect(config: Config, now: float | None = None) -> StatusReport:
    now = time.time() if now is None else now
    path = status_path(config)
    if path.exists():
        report = StatusReport.from_dict(orjson.loads(path.read_bytes()))
        if now - report.updated <= FRESH_SECONDS:
            return report
    return from_metadata(config, now)


def from_metadata(config: Config, now: float) -> StatusReport:
    """The status computed from table metadata alone, through pyiceberg."""
    tracker = PartitionTracker(config.compactor)
    catalog = pyiceberg_catalog(config)
    staged: list[StagedMain] = []
    for table in config.tables:
        ref = config.table_ref(table)
        iceberg = load_metadata_table(catalog, ref)
        if iceberg is None:
            continue  # the ingester has not created it yet
        loaded = table_partitions(iceberg, ref, table, config.compactor)
        tracker.on_metadata(table.name, loaded.sequence_number, loaded.partitions)
        if table.staging_branch:
            main = iceberg.metadata.current_snapshot_id
            staged.append(StagedMain(table.name, ref.branch, main, main_behind(branch_history(iceberg, ref.branch), main)))
    return StatusReport(
        "table metadata (no running compactor)", now, tracker.report(now), config.compactor.portable_within_seconds, staged
    )


def _age(then: float | None, now: float) -> str:
    if then is None:
        return "-"
    seconds = max(0.0, now - then)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


def render(report: StatusReport, now: float | None = None) -> str:
    now = time.time() if now is None else now
    header = (
        "table",
        "partition",
        "state",
        "data files",
        "small",
        "eq-del files",
        "eq-del rows",
        "pos-del files",
        "pos-del rows",
        "last write",
        "oldest eq-del",
        "last compaction",
        "read cost",
        "hot budget",
        "next work",
    )
    rows = [header]
    for p in report.partitions:
        rows.append(
            (
                p.table,
                p.partition,
                p.state,
                str(p.data_files),
                str(p.small_files),
                str(p.equality_delete_files),
                str(p.equality_delete_records),
                str(p.position_delete_files),
                str(p.position_delete_records),
                _age(p.last_write if p.partition != GLOBAL_DELETES_PATH else p.oldest_write, now),
                _age(p.oldest_write if p.equality_delete_files else None, now),
                _age(p.last_compaction, now),
                f"{p.read_cost:.1f} (ideal {p.ideal_read_cost:.1f})",
                f"{p.read_budget:.1f}" + (" OVER" if p.state == "hot" and p.read_cost > p.read_budget else ""),
                p.pending or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"source: {report.source}"]
    lines += [portability_line(t, report.portable_within_seconds, now) for t in status_portability(report.partitions).values()]
    lines += [main.describe() for main in report.staged]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no partitions with live files)")
    return "\n".join(lines)


def portability_line(table: TablePortability, target: float | None, now: float) -> str:
    """One table's portability: whether readers that cannot apply equality deletes can read it
    now, and its oldest live equality delete against the target."""
    if table.portable:
        return f"{table.table}: portable (no live equality delete)"
    age = "of unknown age" if table.oldest_write is None else f"{table.oldest_age(now):.1f}s old"
    within = (
        ""
        if target is None or table.oldest_write is None
        else f", {'within' if table.oldest_age(now) <= target else 'PAST'} the {target:g}s target"
    )
    return f"{table.table}: not portable: {table.equality_delete_files} live equality-delete files, the oldest {age}{within}"
