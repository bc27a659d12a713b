"""The errors icecdc's parts tell apart.

``UserError``: something a user fixes from the message alone (a bad key, a missing package, a
table that disagrees with its config); the CLI prints it without a traceback.

``IcebergError`` and its kinds: what Iceberg said, translated once where Iceberg is reached (the
Java adapter, ``icecdc.jvm``, and the pyiceberg catalog, ``icecdc.runtime.catalog``), the way pyiceberg maps
its backends' errors at its boundary. Callers decide on the kind, never on a Java class name or a
message text.
"""

from __future__ import annotations


class UserError(Exception):
    pass


class IcebergError(Exception):
    """An error from Iceberg, with the Java exception's class when it came from the JVM."""

    def __init__(self, message: str, java_class: str | None = None) -> None:
        super().__init__(message)
        self.java_class = java_class


class CommitConflict(IcebergError):
    """The commit's validation failed: files it replaces or relies on changed since its starting
    snapshot (``ValidationException``). Nothing was committed and the plan is stale: make it
    again from the current snapshot rather than retry it."""


class CompareAndSetLost(IcebergError):
    """Another commit won the catalog's compare-and-set every time Iceberg retried
    (``CommitFailedException``). Nothing was committed; the same update may be tried again."""


class CommitStateUnknown(IcebergError):
    """The catalog failed while a commit was in flight: it may or may not have landed
    (``CommitStateUnknownException``). Look for the commit's id before trying again, and never
    delete its files."""


class NoSuchTable(IcebergError):
    pass


class MissingPartitionSpec(IcebergError):
    """A file names a partition spec the table no longer has (snapshot expiry with metadata
    clean-up removes specs no live file uses): the spec must be added again before committing."""

    def __init__(self, spec_id: int, table: str) -> None:
        super().__init__(f"table {table} has no partition spec {spec_id}")
        self.spec_id = spec_id


class PartitionSpecChanged(UserError):
    """The table's partition spec changed since the ingester read its layout. A batch written in
    the old spec would commit, but once the sidecar rewrites the old spec's files into the current
    one, that ingester's later deletes, in the old spec, no longer reach them: so it stops, and
    reads the new spec when it starts again."""

    def __init__(self, table: str, written: int, current: int) -> None:
        super().__init__(
            f"table {table}'s partition spec changed from {written} to {current} while the ingester ran: restart it "
            "to write the new spec (this batch is not committed; it is read again from the offsets in the table)"
        )
        self.written, self.current = written, current


class CatalogUnavailable(IcebergError):
    """The catalog or the table's storage did not answer for now: a lock held past the busy
    timeout, a refused or dropped connection, a 5xx, throttling. Worth retrying after a pause."""


class CatalogOutage(Exception):
    """The catalog stayed unavailable longer than ``catalog.retry.give_up_seconds``: the command
    stops (exit code 75, "try again later") rather than run on without it."""
