"""Re-reading every configured table's metadata: at start, every ``reconcile_seconds``, after
each of the sidecar's own compactions, after a rebalance and after a commit event that did not list
its partitions. Only manifests not read before are opened (``ManifestCache``). This replaces the
tracker's statistics, so a late start, a restart, a lost event or another replica's compaction only delays
work. Catalog calls ride out outages (``outages``); any other error skips the table until the
next reconcile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from icecdc.compactor import metrics
from icecdc.compactor.metadata import ManifestCache, load_table_partitions, table_partitions
from icecdc.compactor.tracker import PartitionTracker
from icecdc.domain.errors import CatalogOutage
from icecdc.domain.layout import TableLayout
from icecdc.runtime.catalog import metadata_call, pyiceberg_catalog
from icecdc.runtime.config import Config
from icecdc.runtime.outages import CatalogRetry

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self, config: Config, tracker: PartitionTracker, retry: CatalogRetry | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._config = config
        self._tracker = tracker
        self._retry = retry
        self._clock = clock
        self._catalog: Any = None
        self._last = float("-inf")
        # Each configured table's layout as last read from its metadata.
        self.layouts: dict[str, TableLayout] = {}
        # Each table's manifests already read: a reconcile opens only the ones written since.
        self._manifests: dict[str, ManifestCache] = {}

    def due(self, now: float) -> bool:
        return now - self._last >= self._config.compactor.reconcile_seconds

    def force(self) -> None:
        """Re-read at the next turn (another replica may have compacted what this one now holds)."""
        self._last = float("-inf")

    def catalog(self) -> Any:
        """The pyiceberg catalog the reads go through, opened at the first call."""
        if self._catalog is None:
            self._catalog = metadata_call(self._retry, "opening the catalog", lambda: pyiceberg_catalog(self._config))
        return self._catalog

    def reconcile(self, table_name: str, loaded_table: Any = None) -> None:
        """Replace the tracker's view of one table with its metadata now; ``loaded_table``: the
        pyiceberg table just loaded by the caller (read instead of loading it again)."""
        table = self._config.find_table(table_name)
        if table is None:
            return
        ref = self._config.table_ref(table)
        try:
            catalog = self.catalog()
            cache = self._manifests.setdefault(table_name, ManifestCache())
            settings = self._config.compactor
            loaded = metadata_call(
                self._retry,
                f"reading the metadata of {ref}",
                lambda: (
                    load_table_partitions(catalog, ref, table, settings, cache)
                    if loaded_table is None
                    else table_partitions(loaded_table, ref, table, settings, cache)
                ),
            )
        except CatalogOutage:
            raise
        except Exception as exc:  # noqa: BLE001 - retried at the next reconcile
            log.warning(
                "could not read the metadata of %s (retried at the next reconcile): %s",
                table_name,
                exc,
                extra={"table": table_name},
            )
            return
        if loaded is None:
            creator = "the ingester" if table.ingested else "its writer"
            log.info("table %s does not exist yet; %s creates it", table_name, creator)
            return
        self.layouts[table_name] = loaded.layout
        metrics.MANIFESTS_READ.labels(table_name, "opened").inc(cache.opened)
        metrics.MANIFESTS_READ.labels(table_name, "cached").inc(cache.cached)
        self._tracker.on_metadata(table_name, loaded.sequence_number, loaded.partitions)

    def reconcile_all(self) -> None:
        for table in self._config.tables:
            self.reconcile(table.name)
        self._last = self._clock()
