"""The compaction sidecar: follows the ingester's commit events, tells hot partitions from
settled ones, and compacts and merges deletes on settled partitions."""
