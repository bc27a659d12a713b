"""The wrapper prefixes cut from records before they reach the Python workers.

The real connector's values carry their Connect schema: ``{"schema":...,"payload":`` is most of
a record, the same bytes on every record of a table version, and handing it to the parse stage
costs more than parsing the payloads. The fast path reports each topic's prefix (``Tag.PREFIX``)
and the next batches cut it: on the JVM for Spark's Kafka source (``cut_frame``), in the driver
for the direct reader (``cut_records``). Ids are never reused and prefixes never dropped, so a
redo of a batch still reads the ids it was cut with (docs/ingest.md, "The fast parse path").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# The column naming the prefix cut from a record's value (null: the value is whole).
CUT_PREFIX = "cut_prefix"


class SchemaPrefixes:
    """Every prefix learned, by id, and the one each topic's records are cut with."""

    def __init__(self) -> None:
        self.learning = True  # off: records stay whole (the ingest-shape bench's ``--prefix-cut off``)
        self._ids: dict[bytes, int] = {}
        self.known: list[bytes] = []  # by id
        self._current: dict[str, int] = {}  # topic -> the id of its newest prefix

    def learn(self, learned: Mapping[str, bytes]) -> None:
        """Topic -> the prefix its last whole records carried: cut it from its next records."""
        if not self.learning:
            return
        for topic, prefix in learned.items():
            if prefix not in self._ids:
                self._ids[prefix] = len(self.known)
                self.known.append(prefix)
            self._current[topic] = self._ids[prefix]

    def cutting(self, topics: Sequence[str] | None = None) -> dict[str, tuple[int, bytes]]:
        """Topic -> (id, prefix) to cut, for ``topics`` (None: all)."""
        return {t: (i, self.known[i]) for t, i in self._current.items() if topics is None or t in topics}

    def cut_records(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The direct reader's records with their topic's prefix cut from the values that start
        with it, in place; each gets ``CUT_PREFIX``."""
        cutting = self.cutting()
        for record in records:
            value, cut = record["value"], None
            found = cutting.get(record["topic"])
            if found is not None and value is not None and value.startswith(found[1]):
                cut, record["value"] = found[0], value[len(found[1]) :]
            record[CUT_PREFIX] = cut
        return records

    def cut_frame(self, df: DataFrame, topics: Sequence[str]) -> DataFrame:
        """``df`` (Spark's Kafka source) with ``topics``' prefixes cut on the JVM, unless its
        source cut them already."""
        from pyspark.sql import functions as F

        if CUT_PREFIX in df.columns:
            return df
        id_of = None
        for topic, (id_, prefix) in self.cutting(topics).items():
            starts = (F.col("topic") == topic) & (F.substring("value", 1, len(prefix)) == F.lit(bytearray(prefix)))
            id_of = F.when(starts, id_) if id_of is None else id_of.when(starts, id_)
        if id_of is None:
            return df
        length = F.element_at(F.array(*(F.lit(len(p)) for p in self.known)), F.col(CUT_PREFIX) + 1)
        return (
            df.withColumn(CUT_PREFIX, id_of)
            .withColumn("_length", length)
            .withColumn(
                "value", F.when(F.col(CUT_PREFIX).isNull(), F.col("value")).otherwise(F.expr("substring(value, _length + 1)"))
            )
            .drop("_length")
        )
