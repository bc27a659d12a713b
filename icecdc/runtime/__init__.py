"""The runtime adapters every command shares: configuration, logging, health and metrics, the
Kafka clients and the embedded broker, the Spark session, the pyiceberg catalog, catalog-outage
retries, Parquet and Puffin files, failpoints and signals."""
