"""Riding out a catalog that does not answer.

Every catalog call of the ingester, the compactor and maintenance goes through one
``CatalogRetry`` per command: a call that fails with ``CatalogUnavailable`` (a lock held past the
busy timeout, a refused connection, a 5xx, throttling: ``icecdc.domain.transient`` tells them, on the Java
side and on pyiceberg's alike) is tried again with jittered exponential backoff. The outage is visible while it lasts: a warning when it starts and a line when it ends,
``icecdc_catalog_available`` at 0, ``/readyz`` failing its ``catalog-calls`` check. Liveness keeps
beating: restarting a process does not bring a catalog back. Once the catalog has been unavailable
for ``catalog.retry.give_up_seconds`` without one call getting through, ``CatalogOutage`` ends the
command with a clear message (and exit code 75), rather than a traceback on the first blip.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import Counter, Gauge
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_random_exponential

from icecdc.domain.errors import CatalogOutage, CatalogUnavailable
from icecdc.domain.idle import CatalogWaits
from icecdc.runtime.config import CatalogRetryConfig
from icecdc.runtime.health import Health

log = logging.getLogger(__name__)
T = TypeVar("T")

AVAILABLE = Gauge("icecdc_catalog_available", "1 while the catalog answers, 0 during an outage", ["command"])
OUTAGES = Counter("icecdc_catalog_outages_total", "Catalog outages ridden out (or given up on)", ["command"])
RETRIES = Counter("icecdc_catalog_retries_total", "Catalog calls tried again after the catalog did not answer", ["command"])
HEALTH_CHECK = "catalog-calls"


class CatalogRetry:
    def __init__(
        self,
        settings: CatalogRetryConfig,
        command: str,
        health: Health | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._settings = settings
        self._command = command
        self._health = health
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._outage_since: float | None = None
        self._outages = 0
        AVAILABLE.labels(command).set(1)

    @property
    def outage_seconds(self) -> float:
        """How long the current outage has lasted; 0 when the catalog answers."""
        since = self._outage_since
        return 0.0 if since is None else self._clock() - since

    def waits(self) -> CatalogWaits:
        """The outages met so far and whether a call waits on one now (for ``--until-idle``)."""
        with self._lock:
            return CatalogWaits(self._outages, self._outage_since is not None)

    def call(self, what: str, function: Callable[[], T]) -> T:
        """``function()``, tried again while the catalog is unavailable. ``what`` says what the
        call does, for the log ("committing batch 7 to db.orders")."""
        retrying = Retrying(
            retry=retry_if_exception_type(CatalogUnavailable),
            wait=wait_random_exponential(multiplier=self._settings.backoff_seconds, max=self._settings.backoff_max_seconds),
            stop=self._given_up,
            sleep=self._sleep,
            before_sleep=lambda state: self._failed(what, state),
            reraise=True,
        )
        try:
            result = retrying(function)
        except CatalogUnavailable as exc:
            raise CatalogOutage(
                f"the catalog has not answered for {self.outage_seconds:.0f}s (catalog.retry.give_up_seconds is "
                f"{self._settings.give_up_seconds:g}); last error while {what}: {exc}"
            ) from exc
        self._answered()
        return result

    def _given_up(self, state: RetryCallState) -> bool:
        self._begin(state)
        return self.outage_seconds >= self._settings.give_up_seconds

    def _begin(self, state: RetryCallState) -> None:
        with self._lock:
            if self._outage_since is not None:
                return
            self._outage_since = self._clock()
            self._outages += 1
        error = state.outcome.exception() if state.outcome else None
        OUTAGES.labels(self._command).inc()
        AVAILABLE.labels(self._command).set(0)
        log.warning("the catalog does not answer (%s); retrying for up to %.0fs", error, self._settings.give_up_seconds)

    def _failed(self, what: str, state: RetryCallState) -> None:
        RETRIES.labels(self._command).inc()
        seconds = self.outage_seconds
        detail = f"catalog unavailable for {seconds:.0f}s while {what}: {state.outcome.exception() if state.outcome else ''}"
        if self._health is not None:
            self._health.mark(HEALTH_CHECK, False, detail)
            self._health.beat()  # waiting on purpose: a restart would not bring the catalog back
        log.info("%s; trying again (attempt %d)", detail, state.attempt_number + 1)

    def _answered(self) -> None:
        with self._lock:
            since, self._outage_since = self._outage_since, None
        if since is None:
            return
        AVAILABLE.labels(self._command).set(1)
        if self._health is not None:
            self._health.mark(HEALTH_CHECK, True, "the catalog answers")
        log.warning("the catalog answers again after %.0fs", self._clock() - since)
