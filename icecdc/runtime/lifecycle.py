"""Stopping long-running commands cleanly."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, so that a command finishes its current unit of work
    (a batch, a compaction) before it stops. Signals can only be handled on the main thread;
    elsewhere (the demo's threads) the caller stops the work itself."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return stop
