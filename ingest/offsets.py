"""Exactly-once bookkeeping: the source offsets a table has committed live in its snapshot
summaries (as the Iceberg Kafka Connect sink does), so the table itself says where to resume.

Each ingest commit records, under ``icecdc.offsets`` (``icecdc.domain.summary.OFFSETS``), the full map
topic -> partition -> next offset to read (merged with what earlier commits recorded), plus the
batch id. Commits of others (the compactor's rewrites) carry none, so the newest snapshot that
has the property wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import orjson

from icecdc.domain import summary

Offsets = dict[str, dict[int, int]]  # topic -> kafka partition -> next offset to read


def committed_offsets(summaries_newest_first: Iterable[Mapping[str, str]]) -> Offsets:
    """The offsets recorded by the newest summary that has any; empty when none does."""
    for properties in summaries_newest_first:
        text = properties.get(summary.OFFSETS)
        if text:
            return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in orjson.loads(text).items()}
    return {}


def advance(committed: Offsets, consumed: Mapping[tuple[str, int], int]) -> Offsets:
    """Merge a batch's highest consumed offset per (topic, partition) into the committed map."""
    merged = {topic: dict(parts) for topic, parts in committed.items()}
    for (topic, partition), last_offset in consumed.items():
        parts = merged.setdefault(topic, {})
        parts[partition] = max(parts.get(partition, 0), last_offset + 1)
    return merged


def encode(offsets: Offsets) -> str:
    return orjson.dumps({t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}).decode()


def batch_summary(offsets: Offsets, batch_id: str) -> dict[str, str]:
    """The summary properties of an ingest commit."""
    return {summary.OFFSETS: encode(offsets), summary.BATCH_ID: batch_id, summary.WRITER: summary.INGEST_WRITER}
