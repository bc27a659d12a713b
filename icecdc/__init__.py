"""icecdc: streaming-integrated compaction sidecar for Kafka-to-Iceberg CDC pipelines."""

__version__ = "0.1.0"
