"""What a table's snapshot log says after an e2e run: the bytes the writer and maintenance added,
when each partition was last written and when maintenance touched it."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from icecdc.bench.portability import write_amplification
from icecdc.domain.files import DataFileContent
from icecdc.domain.summary import COMPACTOR


@dataclass(frozen=True)
class SettleToCompacted:
    settled_partitions: int
    compacted: int
    median_seconds: float | None
    seconds: list[float]


@dataclass(frozen=True)
class SnapshotLog:
    ingested_bytes: int  # every writer commit's added files
    rewritten_bytes: int  # every maintenance (replace) commit's added files
    compaction_commits: int
    # partition -> (commit time, whether it left an equality delete), per writer commit
    writes: dict[tuple[Any, ...], list[tuple[float, bool]]]
    maintained: dict[tuple[Any, ...], list[float]]  # partition -> maintenance commit times
    live_equality_deletes: set[tuple[Any, ...]]  # partitions with live equality deletes now
    # (commit time, bytes added, whether by maintenance), per snapshot
    added: list[tuple[float, int, bool]] = field(default_factory=list)
    # (commit time, whether by maintenance, content, file size), per file added
    added_files: list[tuple[float, bool, DataFileContent, int]] = field(default_factory=list)


def snapshot_log(table: Any) -> SnapshotLog:
    """What the manifests each snapshot added say: partitions' writes and maintenance, and bytes."""
    io = table.io
    ingested = rewritten = commits = 0
    writes: dict[tuple[Any, ...], list[tuple[float, bool]]] = defaultdict(list)
    maintained: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    added_bytes: list[tuple[float, int, bool]] = []
    added_files: list[tuple[float, bool, DataFileContent, int]] = []
    for snapshot in table.snapshots():
        summary = snapshot.summary
        added = int(summary.get("added-files-size", 0) or 0)
        # Rewrites replace; icecdc's conversions are row deltas that it tags.
        maintenance = summary.operation.value == "replace" or summary.get(COMPACTOR) is not None
        if maintenance:
            rewritten += added
            commits += bool(added or int(summary.get("removed-files-size", 0) or 0))
        else:
            ingested += added
        when = snapshot.timestamp_ms / 1000
        added_bytes.append((when, added, maintenance))
        touched: dict[tuple[Any, ...], bool] = {}
        for manifest in snapshot.manifests(io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                if entry.snapshot_id != snapshot.snapshot_id or entry.status.value == 0:  # EXISTING
                    continue
                key = _partition_key(entry)
                equality = entry.data_file.content is DataFileContent.EQUALITY_DELETES and entry.status.value == 1
                if entry.status.value == 1:  # ADDED
                    added_files.append((when, maintenance, entry.data_file.content, entry.data_file.file_size_in_bytes))
                touched[key] = touched.get(key, False) or equality
        for key, equality in touched.items():
            if maintenance:
                maintained[key].append(when)
            else:
                writes[key].append((when, equality))
    current = table.current_snapshot()
    live_equality = {
        _partition_key(entry)
        for manifest in (current.manifests(io) if current is not None else [])
        for entry in manifest.fetch_manifest_entry(io)
        if entry.data_file.content is DataFileContent.EQUALITY_DELETES
    }
    return SnapshotLog(ingested, rewritten, commits, writes, maintained, live_equality, added_bytes, added_files)


def amplification_between(log: SnapshotLog, start: float, end: float) -> float | None:
    """``portability.write_amplification`` of the commits from ``start`` to ``end`` (epoch seconds)."""
    return amplification_across([log], start, end)


def amplification_across(logs: Iterable[SnapshotLog], start: float, end: float) -> float | None:
    """``amplification_between`` over several tables' commits, their bytes taken together."""
    series = _amplification_series([added for log in logs for added in log.added], start, end)
    return series[-1][1] if series else None


def amplification_so_far(log: SnapshotLog, start: float, end: float) -> list[tuple[float, float]]:
    """``amplification_between`` from ``start`` to each commit up to ``end``: (seconds since
    ``start``, the amplification so far), once the writer has committed."""
    return _amplification_series(log.added, start, end)


def _amplification_series(added: list[tuple[float, int, bool]], start: float, end: float) -> list[tuple[float, float]]:
    writer = maintenance = 0
    series: list[tuple[float, float]] = []
    for when, size, by_maintenance in sorted(added):
        if not start <= when <= end:
            continue
        if by_maintenance:
            maintenance += size
        else:
            writer += size
        if (amplification := write_amplification(writer, maintenance)) is not None:
            series.append((round(when - start, 1), amplification))
    return series


def bytes_added_between(log: SnapshotLog, start: float, end: float) -> dict[str, int]:
    """The bytes of the files added from ``start`` to ``end`` (epoch seconds), by who added them
    and what they hold: ``writer data``, ``sidecar position deletes`` and so on."""
    added: dict[str, int] = defaultdict(int)
    for when, by_maintenance, content, size in log.added_files:
        if start <= when <= end:
            added[f"{'sidecar' if by_maintenance else 'writer'} {content.name.lower().replace('_', ' ')}"] += size
    return dict(sorted(added.items()))


def _partition_key(entry: Any) -> tuple[Any, ...]:
    return tuple(entry.data_file.partition)


def settle_to_compacted(log: SnapshotLog, writes_ended: float, settle_seconds: float) -> SettleToCompacted:
    """For every partition whose last write left equality deletes and came ``settle_seconds``
    before the writes ended (it settled during the run): seconds from that write to the first
    maintenance commit that touched it, or None if none did."""
    delays: list[float | None] = []
    for key, history in log.writes.items():
        last, equality = max(history)
        if not equality or last > writes_ended - settle_seconds:
            continue
        after = [t for t in log.maintained.get(key, []) if t >= last]
        delays.append(min(after) - last if after else None)
    done = [d for d in delays if d is not None]
    return SettleToCompacted(len(delays), len(done), statistics.median(done) if done else None, done)
