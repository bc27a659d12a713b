"""Describing a written Parquet file to Iceberg where it is written, on the executor: its
partition, record count and column metrics (sizes, value and null counts, lower and upper
bounds) as Iceberg's content-file JSON. The driver turns each description into a DataFile or
DeleteFile with ``ContentFileParser`` in one JVM call, instead of opening every file again to
read its footer (about 15 ms a file, the largest cost of a small batch's commit).

The metrics are pyiceberg's, computed from the footer pyarrow just wrote with the table's
metrics configuration (its ``write.metadata.metrics.*`` properties, as the layout was loaded):
the same code pyiceberg uses to register the files it writes. One difference from Iceberg's
Java writers: pyiceberg has no ``write.metadata.metrics.max-inferred-column-defaults``, so a
table of more than 100 columns gets bounds for all of them unless its default mode says less.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import orjson
import pyarrow.parquet as pq

from icecdc.domain.layout import PartitionKey, TableLayout

DATA_CONTENT, EQUALITY_DELETE_CONTENT = "DATA", "EQUALITY_DELETES"


class FileKind(str, enum.Enum):
    """The kinds of file a batch writes (the values travel through the stages' Spark rows)."""

    DATA = "data"
    DELETE = "delete"  # equality deletes of keys in one partition
    GLOBAL_DELETE = "global-delete"  # the same under the table's unpartitioned spec: they apply to every partition


# Two entries a table (data files, key-only delete files): a batch of a connector's 50 tables
# cycled 100 plans through 32 entries and rebuilt one for every file it wrote.
@functools.lru_cache(maxsize=1024)
def _statistics_plan(
    schema_json: str, key_only: tuple[str, ...] | None, metrics_properties: tuple[tuple[str, str], ...]
) -> tuple[Any, Any]:
    from pyiceberg.io.pyarrow import compute_statistics_plan, parquet_path_to_id_mapping
    from pyiceberg.schema import Schema

    schema = Schema.model_validate_json(schema_json)
    if key_only is not None:
        schema = schema.select(*key_only)
    return compute_statistics_plan(schema, dict(metrics_properties)), parquet_path_to_id_mapping(schema)


def _map(values: dict[int, Any], encode: Any = None) -> dict[str, list[Any]]:
    keys = sorted(values)
    return {"keys": keys, "values": [encode(values[k]) if encode else values[k] for k in keys]}


def describe(
    layout: TableLayout, kind: FileKind, path: str, partition: PartitionKey, size: int, metadata: pq.FileMetaData
) -> str:
    """The content-file JSON of one written file: data, equality deletes on the primary key in the
    file's partition, or global ones (under the table's unpartitioned spec)."""
    from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata

    deletes = kind != FileKind.DATA
    global_delete = kind == FileKind.GLOBAL_DELETE
    if global_delete and layout.global_spec_id is None:
        raise ValueError(f"table {layout.table} has no unpartitioned spec for its global deletes")
    plan, mapping = _statistics_plan(layout.schema_json, layout.primary_key if deletes else None, layout.metrics_properties)
    stats = data_file_statistics_from_parquet_metadata(metadata, plan, mapping).to_serialized_dict()
    document: dict[str, Any] = {
        "spec-id": layout.global_spec_id if global_delete else layout.spec_id,
        "content": EQUALITY_DELETE_CONTENT if deletes else DATA_CONTENT,
        "file-path": path,
        "file-format": "PARQUET",
        "file-size-in-bytes": size,
        "record-count": stats["record_count"],
        "column-sizes": _map(stats["column_sizes"]),
        "value-counts": _map(stats["value_counts"]),
        "null-value-counts": _map(stats["null_value_counts"]),
        "lower-bounds": _map(stats["lower_bounds"], bytes.hex),
        "upper-bounds": _map(stats["upper_bounds"], bytes.hex),
    }
    if stats["nan_value_counts"]:
        document["nan-value-counts"] = _map(stats["nan_value_counts"])
    if stats["split_offsets"]:
        document["split-offsets"] = stats["split_offsets"]
    if layout.partition and not global_delete:
        document["partition"] = layout.partition_json(partition)
    if deletes:
        document["equality-ids"] = layout.key_field_ids
    return orjson.dumps(document).decode()
