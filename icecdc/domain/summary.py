"""The snapshot-summary properties icecdc writes, in one place: the ingester records where it has
read to, the compactor tags what it committed, and every commit carries a unique id. Readers
(exactly-once recovery, the sidecar telling its own commits from writes, snapshot expiry, anyone
auditing a table) find them here rather than in the module of whoever writes them.
"""

from __future__ import annotations

from typing import Final

# Every icecdc commit carries a unique id, so that it can find its own snapshot even when another
# writer committed right after it, and so that a commit whose outcome was unknown (the catalog
# failed mid-commit) can be recognised instead of being made twice.
COMMIT_ID: Final = "icecdc.commit-id"

# The ingester: the full map topic -> Kafka partition -> next offset to read (JSON), merged with
# what earlier commits recorded, so the newest snapshot carrying it says where to resume.
OFFSETS: Final = "icecdc.offsets"
# Other writers' exactly-once markers: when such a writer restarts, it walks back from the current
# snapshot to its newest one carrying the marker to learn what it already committed (Flink's
# ``IcebergFilesCommitter``; Iceberg Kafka Connect's ``Coordinator``, one key per control topic
# and group). Without it, it commits again what it had.
FLINK_CHECKPOINT: Final = "flink.max-committed-checkpoint-id"
KAFKA_CONNECT_OFFSETS_PREFIX: Final = "kafka.connect.offsets."
BATCH_ID: Final = "icecdc.batch-id"
WRITER: Final = "icecdc.writer"
INGEST_WRITER: Final = "icecdc-ingest"

# The compactor: which replica committed (maintenance commits carry it too), what kind of
# compaction, which partition (or partitions), and from which snapshot it started.
COMPACTOR: Final = "icecdc.compactor"
COMPACTION: Final = "icecdc.compaction"
PARTITION: Final = "icecdc.partition"
# A job that compacted several partitions of the table in one commit: their paths, a JSON array.
PARTITIONS: Final = "icecdc.partitions"
STARTING_SNAPSHOT: Final = "icecdc.starting-snapshot-id"


def recovery_marker(key: str) -> str | None:
    """The writer whose exactly-once recovery reads this summary key (``OFFSETS``,
    ``FLINK_CHECKPOINT``, a ``KAFKA_CONNECT_OFFSETS_PREFIX`` key), or None."""
    if key == OFFSETS:
        return "icecdc"
    if key == FLINK_CHECKPOINT:
        return "flink"
    if key.startswith(KAFKA_CONNECT_OFFSETS_PREFIX):
        return "kafka-connect"
    return None
