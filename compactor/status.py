"""``icecdc status``: every partition's state, files, deletes and read cost. It shows the running
sidecar's own view (its status file, with hot/settling/compacting as it sees them) while that is
fresh, and otherwise one computed from table metadata alone (no Spark, no Kafka)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from icecdc.catalog import pyiceberg_catalog
from icecdc.compactor.metadata import load_table_partitions
from icecdc.compactor.sidecar import status_path
from icecdc.compactor.tracker import PartitionTracker
from icecdc.config import Config

# A running sidecar rewrites its status at least this often, except during a compaction.
FRESH_SECONDS = 120.0


def collect(config: Config, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    path = status_path(config)
    if path.exists():
        document = orjson.loads(path.read_bytes())
        if now - document.get("updated", 0) <= FRESH_SECONDS:
            return {"source": f"compactor {document['replica']}", "updated": document["updated"], "partitions": document["partitions"]}
    tracker = PartitionTracker(config.compactor)
    catalog = pyiceberg_catalog(config)
    for table in config.tables:
        loaded = load_table_partitions(catalog, table, config.compactor)
        if loaded is not None:
            tracker.on_metadata(table.name, loaded.sequence_number, loaded.partitions)
    return {"source": "table metadata (no running compactor)", "updated": now, "partitions": tracker.report(now)}


def _age(then: float | None, now: float) -> str:
    if then is None:
        return "-"
    seconds = max(0.0, now - then)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


def render(status: dict[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    header = ("table", "partition", "state", "data files", "small", "eq-del files", "eq-del rows",
              "pos-del files", "pos-del rows", "last write", "last compaction", "read cost")
    rows = [header]
    for p in status["partitions"]:
        rows.append((
            p["table"], p["partition"], p["state"], str(p["data_files"]), str(p["small_files"]),
            str(p["equality_delete_files"]), str(p["equality_delete_records"]),
            str(p["position_delete_files"]), str(p["position_delete_records"]),
            _age(p["last_write"], now), _age(p["last_compaction"], now), f"{p['read_cost']} (ideal {p['ideal_read_cost']})",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"source: {status['source']}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no partitions with live files)")
    return "\n".join(lines)
