"""When the direct reader's batch ends (``ingest/batch_cadence.py``): full, caught up after the
floor, or after the longest delay; never while it holds nothing."""

from __future__ import annotations

import itertools

import pytest

from icecdc.ingest.batch_cadence import BatchEnd, Cadence, Collecting, batch_end, next_check

CADENCE = Cadence(max_batch_records=100, min_commit_interval_seconds=1.0, max_commit_delay_seconds=5.0)


def collecting(records: int = 10, previous_start: float = 0.0, first_record_at: float | None = 0.5, drained: bool = True):
    return Collecting(records, previous_start, first_record_at if records else None, drained)


def test_no_record_no_batch_whatever_the_time():
    assert batch_end(collecting(records=0), now=1_000.0, cadence=CADENCE) is None
    assert batch_end(collecting(records=0, drained=False), now=1_000.0, cadence=CADENCE) is None


def test_a_full_batch_ends_at_once_before_the_floor():
    assert batch_end(collecting(records=100, first_record_at=0.1, drained=False), now=0.2, cadence=CADENCE) is BatchEnd.FULL
    assert batch_end(collecting(records=100, first_record_at=0.1), now=0.2, cadence=CADENCE) is BatchEnd.FULL


def test_caught_up_ends_the_batch_once_the_floor_has_passed_since_the_previous_start():
    batch = collecting(previous_start=10.0, first_record_at=10.2)
    assert batch_end(batch, now=10.9, cadence=CADENCE) is None, "within the floor"
    assert batch_end(batch, now=11.0, cadence=CADENCE) is BatchEnd.CAUGHT_UP
    # A quiet stream: the previous batch started long ago, so the first record commits at once.
    assert batch_end(collecting(previous_start=0.0, first_record_at=60.0), now=60.0, cadence=CADENCE) is BatchEnd.CAUGHT_UP


def test_records_still_waiting_hold_the_batch_until_the_delay():
    batch = collecting(previous_start=0.0, first_record_at=1.0, drained=False)
    assert batch_end(batch, now=3.0, cadence=CADENCE) is None, "more records are there to read"
    assert batch_end(batch, now=5.99, cadence=CADENCE) is None
    assert batch_end(batch, now=6.0, cadence=CADENCE) is BatchEnd.DELAY_REACHED


def test_caught_up_wins_over_the_delay_when_both_hold():
    batch = collecting(previous_start=0.0, first_record_at=1.0)
    assert batch_end(batch, now=7.0, cadence=CADENCE) is BatchEnd.CAUGHT_UP


@pytest.mark.parametrize(
    ("batch", "now", "expected"),
    [
        pytest.param(collecting(previous_start=10.0, first_record_at=10.2), 10.4, 0.6, id="until-the-floor"),
        pytest.param(collecting(previous_start=0.0, first_record_at=3.0), 7.5, 0.0, id="floor-passed"),
        pytest.param(collecting(records=0, previous_start=10.0), 10.25, 0.75, id="nothing-held"),
    ],
)
def test_next_check_is_the_nearer_of_the_floor_and_the_delay(batch, now, expected):
    assert next_check(batch, now, CADENCE) == pytest.approx(expected)


def test_a_steady_stream_commits_once_a_floor_and_a_quiet_one_within_it():
    """A simulated reader: a record every 0.1 s, each batch written in 0.3 s. Batches start a
    floor apart; then a lone record after a pause is committed as soon as it is read."""
    now, previous_start, starts = 0.0, 0.0, []
    arrivals = [round(0.1 * i, 1) for i in range(1, 51)] + [20.0]
    read = 0
    records, first = 0, None
    while read < len(arrivals) or records:
        while read < len(arrivals) and arrivals[read] <= now:
            read, records = read + 1, records + 1
            first = first if first is not None else now
        drained = read == len(arrivals) or arrivals[read] > now
        end = batch_end(Collecting(records, previous_start, first, drained), now, CADENCE)
        if end is not None:
            assert end is BatchEnd.CAUGHT_UP
            starts.append(now)
            previous_start, records, first = now, 0, None
            now = round(now + 0.3, 2)  # the batch's write and commit
            continue
        now = round(now + 0.05, 2)
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(starts)]
    assert gaps[:-1] == [CADENCE.min_commit_interval_seconds] * (len(gaps) - 1), "one batch a floor while records flow"
    assert starts[-1] == 20.0, "the lone record after the pause waits for nothing"
