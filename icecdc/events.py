"""The commit event: what the ingester publishes after every Iceberg commit and the compactor
consumes (schemas/commit-event.schema.json is its contract)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from icecdc.schemas import COMMIT_EVENT, validator

EVENT_VERSION = 1


@dataclass(frozen=True)
class PartitionDelta:
    partition: dict[str, Any]
    partition_path: str
    spec_id: int
    data_files: int = 0
    data_bytes: int = 0
    data_records: int = 0
    equality_delete_files: int = 0
    equality_delete_records: int = 0


@dataclass(frozen=True)
class CommitEvent:
    table: str
    snapshot_id: int
    parent_snapshot_id: int | None
    sequence_number: int
    commit_time_ms: int
    operation: str
    writer: str
    batch_id: str | None
    source_offsets: dict[str, dict[str, int]]
    partitions: list[PartitionDelta] = field(default_factory=list)
    version: int = EVENT_VERSION

    def to_json(self) -> bytes:
        document = asdict(self)
        validator(COMMIT_EVENT)(document)
        return orjson.dumps(document)

    @classmethod
    def from_json(cls, data: bytes) -> CommitEvent:
        document = orjson.loads(data)
        validator(COMMIT_EVENT)(document)
        partitions = [PartitionDelta(**p) for p in document.pop("partitions")]
        return cls(**document, partitions=partitions)
