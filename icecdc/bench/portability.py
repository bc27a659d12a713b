"""Whether a live table is portable, from plain values: the age of its oldest live equality delete,
what a run's samples of it add up to, and whether a read was exact. Pure: no I/O here.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from icecdc.bench.report import percentile


class ReadOutcome(str, enum.Enum):
    EXACT = "exact"  # the rows the model implies, no more, no fewer
    WRONG = "wrong"  # rows read, not the model's: a delete ignored or misapplied
    REFUSED = "refused"  # the reader raised on what the table holds (pyiceberg on an equality delete)


def exactness(expected: Iterable[object], read: Iterable[object] | None) -> ReadOutcome:
    """A read against the model: the same multiset of rows is exact (a key read twice is a delete
    the reader did not apply, so multiplicity counts); ``None`` is a refusal."""
    if read is None:
        return ReadOutcome.REFUSED
    return ReadOutcome.EXACT if Counter(expected) == Counter(read) else ReadOutcome.WRONG


@dataclass(frozen=True)
class KeyDigest:
    """A read of a table too large to hold, by its keys: a delete not applied reads a key twice,
    a misapplied one loses a row."""

    rows: int
    distinct_keys: int
    key_sum: int

    @classmethod
    def of(cls, keys: Sequence[int]) -> KeyDigest:
        return cls(len(keys), len(set(keys)), sum(keys))


def digest_exactness(expected: KeyDigest, read: KeyDigest | None) -> ReadOutcome:
    if read is None:
        return ReadOutcome.REFUSED
    return ReadOutcome.EXACT if read == expected else ReadOutcome.WRONG


def oldest_equality_delete_age(
    live_equality_deletes_added_by: Iterable[int | None], committed_at_ms: Mapping[int, int], now_ms: int
) -> float | None:
    """Seconds from the commit that added the oldest live equality-delete file to ``now_ms`` (None:
    none live); a snapshot expiry removed counts as old as the oldest listed, a lower bound."""
    earliest = min(committed_at_ms.values(), default=now_ms)
    added = [committed_at_ms.get(s, earliest) if s is not None else earliest for s in live_equality_deletes_added_by]
    if not added:
        return None
    return max(0.0, (now_ms - min(added)) / 1000)


@dataclass(frozen=True)
class AgeSummary:
    """Samples of the oldest live equality delete's age over a phase of a run."""

    samples: int
    none_share: float | None  # the share of samples with no equality delete live at all
    p50_seconds: float | None  # over every sample, one with none live counting as 0 s
    p95_seconds: float | None
    max_seconds: float | None


def summarise_ages(ages: Sequence[float | None]) -> AgeSummary:
    if not ages:
        return AgeSummary(0, None, None, None, None)
    seconds = [a or 0.0 for a in ages]
    return AgeSummary(
        samples=len(ages),
        none_share=sum(a is None for a in ages) / len(ages),
        p50_seconds=percentile(seconds, 0.5),
        p95_seconds=percentile(seconds, 0.95),
        max_seconds=max(seconds),
    )


def exact_share(outcomes: Sequence[ReadOutcome]) -> float | None:
    """The share of probes a reader read exactly; None when there was no probe."""
    return sum(o is ReadOutcome.EXACT for o in outcomes) / len(outcomes) if outcomes else None


def write_amplification(writer_bytes: int, maintenance_bytes: int) -> float | None:
    """Bytes written over the writer's: (the sidecar's + the writer's) / the writer's."""
    return (writer_bytes + maintenance_bytes) / writer_bytes if writer_bytes else None
