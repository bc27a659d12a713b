"""The vocabulary every part speaks: the table model, column types and widenings, what a source's
changes carry, snapshot-summary keys, events, errors. Plain data and pure functions: no Spark,
Kafka, Java or catalog."""
