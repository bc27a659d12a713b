"""What keeps the writer and the compactors from failing each other's commits, and keeps two
compactor replicas off the same partition (docs/coordinator.md):

- ``ownership``: which slot a partition belongs to, and the slots this replica holds (pure);
- ``leases``: the Kafka consumer group that shares the slots out, and the lease check before a
  commit;
- ``quiet``: when the writer of a table is quiet enough for a commit (pure);
- ``commits``: the commit gate (quiet window, backoff and jitter, give-up) and its accounting;
- ``activity``: which compactions and maintenance runs are in flight, across replicas (pure);
- ``errors``: what it refuses a compaction (pure);
- ``maintenance``: snapshot expiry, orphan removal, manifest rewrites, and what they must spare.

``icecdc.coordinator`` lives in the repository's top-level ``coordinator/`` folder (the design
card's layout); it depends on the plumbing in ``icecdc/`` only, and the compactor on it.
"""
