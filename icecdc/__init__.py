"""icecdc: streaming-integrated compaction sidecar for Kafka-to-Iceberg CDC pipelines.

This folder holds the commands (``cli``, ``demo``, ``bench``) and the plumbing every part shares;
the parts are installed beside it from the repository's top-level folders: ``icecdc.ingest`` from
``ingest/``, ``icecdc.compactor`` from ``compactor/``, ``icecdc.coordinator`` from
``coordinator/``, ``icecdc.schemas`` from ``schemas/``. Dependencies go one way
(docs/ARCHITECTURE.md, "Layers"; enforced by tests/unit/test_static_checks.py)."""

__version__ = "0.1.0"
