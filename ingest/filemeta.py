"""Describing a written Parquet file to Iceberg where it is written, on the executor: its
partition, record count and size as Iceberg's content-file JSON, and the file's footer as
pyarrow wrote it. The driver's JVM turns each description into a DataFile or DeleteFile in one
call for the whole commit (``java/IcecdcUpdates.java``), computing the column metrics (sizes,
value and null counts, lower and upper bounds) from the footer with Iceberg's own code and the
table's metrics configuration (``MetricsConfig.forTable``: its ``write.metadata.metrics.*``
properties, as they are at the commit): exactly what Iceberg's own writers register, without
opening the file again and without computing them in Python, either of which was a large share
of a small batch's cost (docs/BENCHMARKS.md, row "Many tables in one batch").
"""

from __future__ import annotations

import base64
import enum
from typing import Any

import orjson

from icecdc.domain.layout import PartitionKey, TableLayout

DATA_CONTENT, EQUALITY_DELETE_CONTENT = "DATA", "EQUALITY_DELETES"
# The description's field with the file's footer, base64 (not Iceberg's: read by IcecdcUpdates).
FOOTER_FIELD = "icecdc-parquet-footer"
_PARQUET_MAGIC = b"PAR1"


class FileKind(str, enum.Enum):
    """The kinds of file a batch writes (the values travel through the stages' Spark rows)."""

    DATA = "data"
    DELETE = "delete"  # equality deletes of keys in one partition
    GLOBAL_DELETE = "global-delete"  # the same under the table's unpartitioned spec: they apply to every partition


def parquet_footer(data: bytes) -> bytes:
    """The footer of a whole Parquet file's bytes (its Thrift-encoded FileMetaData): a Parquet
    file ends with the footer, the footer's length (4 bytes, little-endian) and ``PAR1``."""
    if len(data) < 12 or data[-4:] != _PARQUET_MAGIC:
        raise ValueError("not a whole Parquet file: it does not end with PAR1")
    length = int.from_bytes(data[-8:-4], "little")
    if length > len(data) - 12:
        raise ValueError(f"not a whole Parquet file: a footer of {length} bytes in {len(data)}")
    return data[-8 - length : -8]


def describe(
    layout: TableLayout, kind: FileKind, path: str, partition: PartitionKey, size: int, record_count: int, footer: bytes
) -> str:
    """The content-file JSON of one written file, its metrics left to the JVM (the footer in
    ``FOOTER_FIELD``): data, equality deletes on the primary key in the file's partition, or
    global ones (under the table's unpartitioned spec)."""
    deletes = kind != FileKind.DATA
    global_delete = kind == FileKind.GLOBAL_DELETE
    if global_delete and layout.global_spec_id is None:
        raise ValueError(f"table {layout.table} has no unpartitioned spec for its global deletes")
    document: dict[str, Any] = {
        "spec-id": layout.global_spec_id if global_delete else layout.spec_id,
        "content": EQUALITY_DELETE_CONTENT if deletes else DATA_CONTENT,
        "file-path": path,
        "file-format": "PARQUET",
        "file-size-in-bytes": size,
        "record-count": record_count,
        FOOTER_FIELD: base64.b64encode(footer).decode(),
    }
    if layout.partition and not global_delete:
        document["partition"] = layout.partition_json(partition)
    if deletes:
        document["equality-ids"] = layout.key_field_ids
    return orjson.dumps(document).decode()
