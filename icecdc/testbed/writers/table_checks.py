"""What the tests and ``icecdc bench writers`` check on a writer's table (``model.DDL_COLUMNS``,
partitioned by ``region``): its live files by partition, whether it is compacted, and whether
each snapshot the sidecar committed reads its parent's rows."""

from __future__ import annotations

from typing import Any

from icecdc.domain import summary
from icecdc.testbed.writers.model import COLUMNS


def live_files(spark: Any, table: str) -> dict[tuple[str, int], int]:
    """(region, content) -> live files: content 0 data, 1 position deletes, 2 equality deletes."""
    spark.sql(f"REFRESH TABLE {table}")
    rows = spark.sql(f"SELECT partition.region AS region, content, count(*) AS n FROM {table}.files GROUP BY 1, 2").collect()
    return {(r["region"], r["content"]): r["n"] for r in rows}


def compacted(files: dict[tuple[str, int], int]) -> bool:
    regions = {region for region, _ in files}
    return bool(regions) and all(files.get((r, 0), 0) <= 2 and not files.get((r, 1)) and not files.get((r, 2)) for r in regions)


def sidecar_snapshots_changing_rows(spark: Any, table: str) -> list[int]:
    """The sidecar's snapshots whose rows differ from their parent's (none, if every one of them
    only rewrote files)."""
    selected = ", ".join(COLUMNS)
    history = spark.sql(f"SELECT snapshot_id, parent_id, summary FROM {table}.snapshots").collect()
    changed = []
    for snapshot in history:
        if summary.COMPACTOR in snapshot["summary"] and snapshot["parent_id"] is not None:
            ours, parent = (
                spark.sql(f"SELECT {selected} FROM {table} VERSION AS OF {snapshot_id}").exceptAll(
                    spark.sql(f"SELECT {selected} FROM {table} VERSION AS OF {other}")
                )
                for snapshot_id, other in (
                    (snapshot["snapshot_id"], snapshot["parent_id"]),
                    (snapshot["parent_id"], snapshot["snapshot_id"]),
                )
            )
            if ours.count() or parent.count():
                changed.append(snapshot["snapshot_id"])
    return changed


def most_deletes_on_a_data_file(spark: Any, table: str) -> int:
    """The most delete files that apply to one live data file: a delete file naming its data file
    (a DV, a file-scoped position delete) applies to that file, any other to every data file of
    its partition, as Iceberg's ``DeleteFileIndex`` matches them. Sequence numbers are not compared, so an equality delete counts on every file."""
    # A v2 position-delete file names its data file by equal bounds on ``file_path`` (field 2147483546).
    lower, upper = (f"cast(element_at({b}, 2147483546) AS STRING)" for b in ("lower_bounds", "upper_bounds"))
    rows = spark.sql(
        f"SELECT content, file_path, partition.region AS region, "
        f"coalesce(referenced_data_file, CASE WHEN {lower} = {upper} THEN {lower} END) AS referenced_data_file "
        f"FROM {table}.files"
    ).collect()
    data = {r["file_path"]: r["region"] for r in rows if r["content"] == 0}
    named: dict[str, int] = {}
    unnamed: dict[str, int] = {}
    for r in rows:
        if r["content"] == 0:
            continue
        if r["referenced_data_file"] is not None:
            named[r["referenced_data_file"]] = named.get(r["referenced_data_file"], 0) + 1
        else:
            unnamed[r["region"]] = unnamed.get(r["region"], 0) + 1
    return max((named.get(path, 0) + unnamed.get(region, 0) for path, region in data.items()), default=0)
