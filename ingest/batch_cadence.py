"""When the direct reader's batch stops collecting records and is written (pure).

A batch ends as soon as one of these holds, checked in this order:

- ``FULL``: it holds ``max_batch_records`` records;
- ``CAUGHT_UP``: it holds a record, the floor (``min_commit_interval_seconds``) has passed since
  the previous batch started, and the last consume returned fewer records than it asked for, so
  the consumer's local queue was empty: every record that had arrived has been read;
- ``DELAY_REACHED``: it holds a record and ``max_commit_delay_seconds`` have passed since its
  first record was read.

A batch with no record never ends: the reader keeps polling. The reader's start counts as the
previous batch's start, so a restart's backlog fills its first batch for a floor's time. Times
are plain seconds on one clock (the reader's monotonic one).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class BatchEnd(enum.Enum):
    """Why a batch stopped collecting (the ``reason`` of ``icecdc_ingest_batch_ends_total``)."""

    FULL = "full"
    CAUGHT_UP = "caught-up"
    DELAY_REACHED = "delay-reached"


@dataclass(frozen=True)
class Cadence:
    """The settings of ``ingest`` that end a batch."""

    max_batch_records: int
    min_commit_interval_seconds: float
    max_commit_delay_seconds: float


@dataclass(frozen=True)
class Collecting:
    """A batch still collecting, as seen right after a consume."""

    records: int  # records held
    previous_start: float  # when the previous batch started (the reader's start before the first)
    first_record_at: float | None  # when its first record was read; None while it holds none
    drained: bool  # the last consume returned fewer records than it asked for


def batch_end(batch: Collecting, now: float, cadence: Cadence) -> BatchEnd | None:
    """Why ``batch`` ends at ``now``, or None while it keeps collecting."""
    if batch.records <= 0 or batch.first_record_at is None:
        return None
    if batch.records >= cadence.max_batch_records:
        return BatchEnd.FULL
    if batch.drained and now - batch.previous_start >= cadence.min_commit_interval_seconds:
        return BatchEnd.CAUGHT_UP
    if now - batch.first_record_at >= cadence.max_commit_delay_seconds:
        return BatchEnd.DELAY_REACHED
    return None


def next_check(batch: Collecting, now: float, cadence: Cadence) -> float:
    """Seconds from ``now`` until ``batch_end`` can next change its answer without a new record:
    the floor's end or the delay's, whichever comes first (0 when one has passed)."""
    floor = batch.previous_start + cadence.min_commit_interval_seconds
    due = [floor] if batch.first_record_at is None else [floor, batch.first_record_at + cadence.max_commit_delay_seconds]
    return max(0.0, min(due) - now)
