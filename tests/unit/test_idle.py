"""``--until-idle`` and stopping, without a process: the idle clock over plain times, fed by a
catalog retry riding out an outage; the stop request a signal sets; a session stopped whether or
not its JVM is still there."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from icecdc.domain.errors import CatalogUnavailable
from icecdc.domain.idle import CatalogWaits, IdleClock
from icecdc.jvm.process import jvm_exited, stop_session
from icecdc.runtime.config import CatalogRetryConfig
from icecdc.runtime.lifecycle import UntilIdle, stop_on_signals, stop_reason
from icecdc.runtime.outages import CatalogRetry
from tests.unit.test_boundaries import Clock

UNTIL_IDLE = 60.0
ANSWERING = CatalogWaits()


def test_quiet_counts_from_the_last_activity():
    clock = IdleClock(now=0.0)
    assert not clock.idle(UNTIL_IDLE - 1, UNTIL_IDLE)
    assert clock.idle(UNTIL_IDLE, UNTIL_IDLE)
    clock.activity(50.0)
    assert clock.quiet_seconds(70.0) == 20.0
    assert not clock.idle(50.0 + UNTIL_IDLE - 1, UNTIL_IDLE)
    clock.activity(10.0)  # older news (an event's time, read late) moves nothing back
    assert clock.idle(50.0 + UNTIL_IDLE, UNTIL_IDLE)


def test_time_blocked_on_the_catalog_is_never_quiet_and_the_window_starts_afresh_after_it():
    # The case found by hand: the last commit event at 0, the sidecar retrying one commit from 3 s
    # to 60 s while the catalog was locked; the writer, blocked too, commits its backlog later.
    clock = IdleClock(now=0.0)
    clock.catalog(CatalogWaits(outages=1, waiting=True), 3.0)
    clock.catalog(CatalogWaits(outages=1, waiting=True), 59.0)
    assert clock.quiet_seconds(200.0) == 0.0  # however long it lasts
    clock.catalog(CatalogWaits(outages=1, waiting=False), 60.0)  # it answers again
    assert not clock.idle(60.0, UNTIL_IDLE)
    assert not clock.idle(60.0 + UNTIL_IDLE - 1, UNTIL_IDLE)
    clock.catalog(CatalogWaits(outages=1, waiting=False), 60.0 + UNTIL_IDLE)  # the same outage: no news
    assert clock.idle(60.0 + UNTIL_IDLE, UNTIL_IDLE)


def test_an_outage_met_and_over_between_two_looks_still_restarts_the_window():
    clock = IdleClock(now=0.0, waits=CatalogWaits(outages=2))
    clock.catalog(CatalogWaits(outages=2), 30.0)
    assert clock.quiet_seconds(30.0) == 30.0
    clock.catalog(CatalogWaits(outages=3), 70.0)  # one more outage since the last look, already over
    assert clock.quiet_seconds(70.0) == 0.0
    assert clock.idle(70.0 + UNTIL_IDLE, UNTIL_IDLE)


def test_activity_during_an_outage_does_not_end_the_hold():
    clock = IdleClock(now=0.0)
    clock.catalog(CatalogWaits(outages=1, waiting=True), 10.0)
    clock.activity(20.0)
    assert clock.quiet_seconds(100.0) == 0.0
    clock.catalog(CatalogWaits(outages=1), 100.0)
    assert clock.quiet_seconds(100.0 + UNTIL_IDLE) == UNTIL_IDLE


def test_until_idle_holds_while_the_command_rides_out_an_outage_and_for_its_window_after():
    clock = Clock()
    settings = CatalogRetryConfig(give_up_seconds=600, backoff_seconds=1, backoff_max_seconds=5)
    retry = CatalogRetry(settings, "test", clock=clock, sleep=clock.sleep)
    until = UntilIdle(UNTIL_IDLE, retry.waits, clock)
    outage_ends = 1.5 * UNTIL_IDLE  # longer than the window
    seen_during: list[bool] = []

    def commit() -> str:
        seen_during.append(until.reached())  # asked meanwhile, as the streaming loop does
        if clock.now < outage_ends:
            raise CatalogUnavailable("SQLITE_BUSY")
        return "committed"

    clock.now = 5.0
    assert retry.call("committing batch 3", commit) == "committed"
    answered = clock.now
    assert answered >= outage_ends and len(seen_during) > 3 and not any(seen_during)
    assert not until.reached()
    clock.now = answered + UNTIL_IDLE - 1
    assert not until.reached()
    clock.now = answered + UNTIL_IDLE + 1  # not on the boundary: ``answered`` is a sum of jittered waits
    assert until.reached()


def test_until_idle_restarts_on_activity_and_never_stops_a_command_without_it():
    clock = Clock()
    until = UntilIdle(10.0, clock=clock)
    clock.now = 9.0
    until.active()
    clock.now = 18.0
    assert not until.reached()
    clock.now = 19.0
    assert until.reached()
    forever = UntilIdle(None, clock=clock)
    clock.now = 1e9
    assert not forever.reached()


@pytest.fixture
def restored_signal_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("restored_signal_handlers")
def test_a_stop_signal_sets_the_stop_request_and_names_itself():
    stop = stop_on_signals()
    assert stop_reason(stop) == "idle"
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    handler(signal.SIGTERM, None)
    assert stop.is_set()
    assert stop_reason(stop) == "stopped by SIGTERM"


# ---- stopping a session whose JVM may be gone ----


class Jvm:
    """The JVM's process as PySpark keeps it: ``poll()`` is None while it runs."""

    def __init__(self, exit_codes: list[int | None]) -> None:
        self._codes = exit_codes

    def poll(self) -> int | None:
        return self._codes.pop(0) if len(self._codes) > 1 else self._codes[0]


class Session:
    def __init__(self, jvm: Jvm | None, stop_error: Exception | None = None) -> None:
        self.sparkContext = SimpleNamespace(_gateway=SimpleNamespace(proc=jvm) if jvm else SimpleNamespace())
        self.stopped = 0
        self._stop_error = stop_error

    def stop(self) -> None:
        self.stopped += 1
        if self._stop_error is not None:
            raise self._stop_error


GONE = RuntimeError("org.apache.spark.sql.SparkSession does not exist in the JVM")


def test_a_session_whose_jvm_exited_is_not_stopped_again():
    session = Session(Jvm([143]), stop_error=GONE)
    assert jvm_exited(session)
    stop_session(session)
    assert session.stopped == 0


def test_a_jvm_that_exits_while_its_session_stops_is_no_error_but_a_live_one_failing_is():
    exiting = Session(Jvm([None, 143]), stop_error=GONE)
    stop_session(exiting)
    assert exiting.stopped == 1
    with pytest.raises(RuntimeError, match="does not exist"):
        stop_session(Session(Jvm([None]), stop_error=GONE))


def test_a_jvm_this_process_did_not_start_counts_as_running():
    session = Session(None)
    assert not jvm_exited(session)
    stop_session(session)
    assert session.stopped == 1
