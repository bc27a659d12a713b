"""The compaction sidecar: follows the ingester's commit events, tells hot partitions from
settled ones, and compacts and merges deletes on settled partitions (docs/compactor.md).

``icecdc.compactor`` lives in the repository's top-level ``compactor/`` folder (the design card's
layout); it depends on the coordinator and the plumbing in ``icecdc/``, and nothing depends on it
but the commands."""
