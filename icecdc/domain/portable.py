"""Which snapshot a reader that cannot apply equality deletes but can name its snapshot
(pyiceberg, Polars, DuckDB by snapshot id) reads exactly: the newest one in the current
snapshot's history that holds no equality delete, by Iceberg's own summary total
(``total-equality-deletes``; a snapshot without it is not taken for portable). On a staged table
``main`` is moved to the staging branch's newest portable snapshot (``decide_main``)
(docs/compactor.md, "Portability"). Pure: an adapter hands the snapshots' summaries here
(``icecdc.portable_snapshot``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

TOTAL_EQUALITY_DELETES: Final = "total-equality-deletes"


def holds_no_equality_delete(summary: Mapping[str, str]) -> bool:
    """Whether a snapshot's summary says no equality-delete row is live in it."""
    return summary.get(TOTAL_EQUALITY_DELETES) == "0"


@dataclass(frozen=True)
class SnapshotFacts:
    """What the choice needs of one snapshot."""

    snapshot_id: int
    timestamp_ms: int
    summary: Mapping[str, str]


@dataclass(frozen=True)
class PortableSnapshot:
    """The newest portable snapshot, and how far it is behind the current one: the commits after
    it, and the time between its commit and the current snapshot's (both 0 when it is current)."""

    snapshot_id: int
    current_snapshot_id: int
    commits_behind: int
    seconds_behind: float

    @property
    def is_current(self) -> bool:
        return self.commits_behind == 0


def newest_portable(history: Iterable[SnapshotFacts]) -> PortableSnapshot | None:
    """The first snapshot of ``history`` (the current snapshot, then its parent, and so on) that
    holds no equality delete; None when none does. Stops at the first it finds, so a lazy
    ``history`` is read no further than needed."""
    current: SnapshotFacts | None = None
    for behind, snapshot in enumerate(history):
        current = current or snapshot
        if holds_no_equality_delete(snapshot.summary):
            seconds = max(0, current.timestamp_ms - snapshot.timestamp_ms) / 1000
            return PortableSnapshot(snapshot.snapshot_id, current.snapshot_id, behind, seconds)
    return None


def main_behind(branch_history: Iterable[SnapshotFacts], main_snapshot_id: int | None) -> PortableSnapshot | None:
    """Where a staged table's ``main`` stands on its staging branch (its head, then its parent,
    and so on): main as the portable snapshot it is, with the branch's commits after it and the
    time between its commit and the head's. None when main has no snapshot yet or is not in the
    branch's history (``MainMove.DIVERGED``). Reads the history no further than main."""
    head: SnapshotFacts | None = None
    for behind, snapshot in enumerate(branch_history):
        head = head or snapshot
        if snapshot.snapshot_id == main_snapshot_id:
            seconds = max(0, head.timestamp_ms - snapshot.timestamp_ms) / 1000
            return PortableSnapshot(snapshot.snapshot_id, head.snapshot_id, behind, seconds)
    return None


class MainMove(enum.Enum):
    """What becomes of a staged table's ``main`` (``decide_main``)."""

    MOVE = "move"  # to the branch's newest portable snapshot, which descends from main
    CURRENT = "current"  # main is the branch's head already
    WAIT = "wait"  # nothing committed after main is portable yet: a conversion is due
    DIVERGED = "diverged"  # main is not in the branch's history: something else committed to main


@dataclass(frozen=True)
class MainDecision:
    move: MainMove
    target: int | None = None  # the snapshot main moves to (MOVE only)


def decide_main(branch_history: Iterable[SnapshotFacts], main_snapshot_id: int | None) -> MainDecision:
    """Where a staged table's ``main`` goes, from the staging branch's history (its head, then its
    parent, and so on) and main's current snapshot (None: it has none yet). Main only ever moves
    forward along the branch, to a snapshot that holds no equality delete: its readers go from one
    portable snapshot to a newer one, never back. Reads the history no further than main (than
    the newest portable snapshot while main has none)."""
    target: int | None = None
    for behind, snapshot in enumerate(branch_history):
        if snapshot.snapshot_id == main_snapshot_id:
            if target is not None:
                return MainDecision(MainMove.MOVE, target)
            return MainDecision(MainMove.CURRENT if behind == 0 else MainMove.WAIT)
        if target is None and holds_no_equality_delete(snapshot.summary):
            if main_snapshot_id is None:  # no main yet: every snapshot of the branch is ahead of it
                return MainDecision(MainMove.MOVE, snapshot.snapshot_id)
            target = snapshot.snapshot_id
    # Main never came up (off the branch), or there is no main and nothing portable yet.
    return MainDecision(MainMove.WAIT if main_snapshot_id is None else MainMove.DIVERGED)
