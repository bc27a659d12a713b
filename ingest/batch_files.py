"""The Parquet files a micro-batch writes: one file of rows (data) or keys (equality deletes) of
one partition, with Iceberg field ids, under a name unique per attempt, and its facts as a row of
the write stage's result. It writes files only: it commits nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson
import pyarrow as pa

from icecdc.domain.layout import PartitionKey, TableLayout
from icecdc.ingest.filemeta import FileKind, describe, parquet_footer
from icecdc.runtime.fileio import write_new_parquet

# At most this many rows, a batch's file is compressed with Snappy: zstd sets up a compressor per
# column chunk, which costs more than it saves on a few rows. Larger files keep zstd, Iceberg's
# default codec (docs/BENCHMARKS.md, row "Many tables in one batch").
SNAPPY_MAX_ROWS = 64


def batch_file_codec(rows: int) -> str:
    """The Parquet codec of a batch's file of ``rows`` rows."""
    return "snappy" if rows <= SNAPPY_MAX_ROWS else "zstd"


def write_file(
    layout: TableLayout,
    kind: FileKind,
    partition: PartitionKey,
    arrow: pa.Table,
    io_properties: Mapping[str, str],
    batch_tag: str,
) -> dict[str, Any]:
    """One Parquet file of rows (data) or keys (deletes) of one partition, with Iceberg field ids
    (``layout.to_arrow``), under a name unique per attempt; its facts as a result row."""
    partition_path = "" if kind == FileKind.GLOBAL_DELETE else layout.partition_path(partition)
    name = f"{batch_tag}-{uuid.uuid4().hex}-{kind.value}.parquet"
    path = "/".join(p for p in (layout.data_location, partition_path, name) if p)
    # No dictionary pages and no Arrow schema: the file lives only until the compactor rewrites it
    # with the table's own writer settings, plain columns write faster and smaller, and every type
    # of ``layout.to_arrow`` reads back from the Parquet schema alone (tests/unit/test_fileio.py;
    # docs/BENCHMARKS.md, row "Many tables in one batch").
    data = write_new_parquet(
        arrow, path, io_properties, compression=batch_file_codec(arrow.num_rows), use_dictionary=False, store_schema=False
    )
    return {
        "table": layout.table,
        "op": kind,
        "path": path,
        "partition": orjson.dumps(partition).decode(),
        "record_count": arrow.num_rows,
        "file_size": len(data),
        "description": describe(layout, kind, path, partition, len(data), arrow.num_rows, parquet_footer(data)),
    }
