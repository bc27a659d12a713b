"""The CDC ingester: Debezium change streams from Kafka into Iceberg tables as equality deletes
plus data files, one atomic commit per micro-batch, exactly once."""
