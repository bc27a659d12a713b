"""Kafka records polled into the driver (the direct reader's batches), in the two forms a batch's
job reads them in: Arrow record batches for a run in the driver, or the DataFrame Spark's Kafka
source would give, for a run on Spark's executors (``job.BatchJob``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from icecdc.ingest.prefixes import CUT_PREFIX, SchemaPrefixes
from icecdc.ingest.stage_rows import KAFKA_SCHEMA, KAFKA_SCHEMA_WITH_HEADERS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# ``stage_rows.KAFKA_SCHEMA`` in Arrow: what a Spark Python worker hands the parse stage.
KAFKA_ARROW = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
KAFKA_ARROW_WITH_HEADERS = KAFKA_ARROW.append(
    pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
)

# Arrow's record batches as long as a Spark Python worker's (``spark.sql.execution.arrow.maxRecordsPerBatch``).
ARROW_BATCH_RECORDS = 10_000


def records_to_dataframe(spark: SparkSession, records: list[dict[str, Any]], prefixes: SchemaPrefixes | None = None) -> DataFrame:
    """The records as Spark's Kafka source yields them; with ``prefixes``, each topic's known
    wrapper prefix cut from the values here (in place), before they cross to the JVM and back."""
    if prefixes is not None:
        prefixes.cut_records(records)
    return _dataframe(spark, records)


def _dataframe(spark: SparkSession, records: list[dict[str, Any]]) -> DataFrame:
    import pandas as pd

    first = records[0] if records else {}
    schema = KAFKA_SCHEMA_WITH_HEADERS if "headers" in first else KAFKA_SCHEMA
    if CUT_PREFIX in first:
        schema = f"{schema}, {CUT_PREFIX} int"
    return spark.createDataFrame(pd.DataFrame.from_records(records, columns=[c.split()[0] for c in schema.split(", ")]), schema)


class PolledRecords:
    """A batch of records the driver holds, each a dict with the Kafka source's fields (and
    ``headers`` as (name, value) pairs when the source reads them).

    Either form has each topic's known wrapper prefix cut from its values first: on Spark that
    saves their trip to the Python workers; in the driver, copying them into Arrow, since the
    prefix is most of a connector record. The cut works on the records in place, so it is made
    once, and so is each form: a batch done again (a redo after a schema change or a truncate)
    reads the same one."""

    def __init__(self, spark: SparkSession, records: list[dict[str, Any]]) -> None:
        self.spark = spark
        self.records = records
        self._cut = False
        self._arrow: list[pa.RecordBatch] | None = None
        self._frame: DataFrame | None = None

    def __len__(self) -> int:
        return len(self.records)

    def _cut_once(self, prefixes: SchemaPrefixes) -> list[dict[str, Any]]:
        if not self._cut:
            prefixes.cut_records(self.records)
            self._cut = True
        return self.records

    def arrow(self, prefixes: SchemaPrefixes) -> list[pa.RecordBatch]:
        """As a Spark Python worker would read them."""
        if self._arrow is None:
            records = self._cut_once(prefixes)
            schema = KAFKA_ARROW_WITH_HEADERS if records and "headers" in records[0] else KAFKA_ARROW
            schema = schema.append(pa.field(CUT_PREFIX, pa.int32()))
            self._arrow = [
                pa.RecordBatch.from_pylist(records[start : start + ARROW_BATCH_RECORDS], schema=schema)
                for start in range(0, len(records), ARROW_BATCH_RECORDS)
            ]
        return self._arrow

    def frame(self, prefixes: SchemaPrefixes) -> DataFrame:
        """As Spark's Kafka source would give them."""
        if self._frame is None:
            self._frame = _dataframe(self.spark, self._cut_once(prefixes))
        return self._frame
