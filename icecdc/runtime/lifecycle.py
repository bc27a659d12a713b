"""Stopping long-running commands cleanly: on a signal, and with ``--until-idle``.

A stop signal (SIGTERM, SIGINT) lets the command finish its current unit of work (a batch, a
compaction), stop its Spark session and exit with code 0: a stop that was asked for and done is
a success (systemd, Kubernetes and ``docker stop`` then report a clean stop, a restart policy of
``on-failure`` does not restart it). This holds when the signal reaches the whole process group
or cgroup, as with systemd's default ``KillMode=control-group`` or ``tini -g``: the Spark JVM,
a child of the command, leaves SIGTERM to the command that owns it (``icecdc.runtime.spark``), so it is
still there to finish the work and be stopped. Until the command has started (its Spark session
up, its signal handlers installed) a stop signal ends it at once, by the signal: nothing is in
flight yet. The ingester's offsets are exact either way, since the table is their source of truth.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from icecdc.domain.idle import CatalogWaits, IdleClock


class StopRequest(threading.Event):
    """Set when the command is asked to stop; ``signal_name`` says by which signal, if any."""

    signal_name: str | None = None


def stop_on_signals() -> StopRequest:
    """An event set by SIGTERM or SIGINT, so that a command finishes its current unit of work
    (a batch, a compaction) before it stops. Signals can only be handled on the main thread;
    elsewhere (the demo's threads) the caller stops the work itself."""
    stop = StopRequest()

    def requested(number: int, _frame: object) -> None:
        stop.signal_name = signal.Signals(number).name
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, requested)
    return stop


def stop_reason(stop: threading.Event) -> str:
    """How a command's loop ended, for its last log line."""
    name = getattr(stop, "signal_name", None)
    return f"stopped by {name}" if name else "stopped" if stop.is_set() else "idle"


class UntilIdle:
    """``--until-idle SECONDS`` in a command's loop (``None``: run until stopped): an ``IdleClock``
    on the monotonic clock, told of the command's catalog waits whenever it is asked."""

    def __init__(
        self,
        seconds: float | None,
        waits: Callable[[], CatalogWaits] = CatalogWaits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self._waits = waits
        self._clock = clock
        self._idle = IdleClock(clock(), waits())

    def active(self) -> None:
        self._idle.activity(self._clock())

    def reached(self) -> bool:
        if self.seconds is None:
            return False
        now = self._clock()
        self._idle.catalog(self._waits(), now)
        return self._idle.idle(now, self.seconds)
