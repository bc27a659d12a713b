"""The CDC ingester: Debezium change streams from Kafka into Iceberg tables as equality deletes
plus data files, one atomic commit per micro-batch, exactly once (docs/ingest.md).

``icecdc.ingest`` lives in the repository's top-level ``ingest/`` folder (the design card's
layout); it depends on the plumbing in ``icecdc/`` only, never on the compactor or the
coordinator."""
