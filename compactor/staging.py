"""Staged tables (``staging_branch``): keeps each one's ``main`` on its staging branch's newest
snapshot that holds no equality delete, so that every engine reading ``main`` reads it exactly at
any moment (docs/compactor.md, "Staged commits").

The decision is pure (``icecdc.domain.portable.decide_main``); moving main is one compare-and-set
metadata commit (``IcebergTable.move_main``), so two replicas never move it backwards. The
replica that keeps a table's maintenance keeps its main; main is checked after each of the
replica's commits to the table and at most once a ``CHECK_SECONDS`` otherwise: a writer batch
whose deletes need no conversion makes the branch's head portable by itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from icecdc.compactor import metrics
from icecdc.domain.portable import MainMove, PortableSnapshot, SnapshotFacts, decide_main, main_behind
from icecdc.jvm.tables import IcebergTable

log = logging.getLogger(__name__)

# A metadata refresh and a walk of the branch's newest snapshots: a few ms. Once a second keeps
# main within a second of a portable head without a catalog read every turn.
CHECK_SECONDS = 1.0


@dataclass(frozen=True)
class StagedMain:
    """A staged table's main, what every engine reads, and where it stands on the staging branch
    (``main_behind``): None when main has no snapshot yet or is off the branch."""

    table: str
    branch: str
    main_snapshot_id: int | None
    behind: PortableSnapshot | None

    def describe(self) -> str:
        """One line for a person (``icecdc status``)."""
        where = f"{self.table}: readers read main, on staging branch {self.branch}"
        if self.behind is not None:
            if self.behind.is_current:
                return f"{where}: main is the branch's head"
            return f"{where}: main is {self.behind.commits_behind} commit(s) and {self.behind.seconds_behind:.1f}s behind the branch's head"
        if self.main_snapshot_id is None:
            return f"{where}: main has no snapshot yet (the first conversion or portable batch moves it)"
        return f"{where}: main is NOT on the branch (something else committed to main; icecdc no longer moves it)"

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> StagedMain:
        behind = document["behind"]
        return cls(
            document["table"],
            document["branch"],
            document["main_snapshot_id"],
            None if behind is None else PortableSnapshot(**behind),
        )


class StagedTables:
    def __init__(
        self,
        staged: Sequence[str],
        table: Callable[[str], IcebergTable],
        keeps: Callable[[str], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._staged = list(staged)
        self._table = table
        self._keeps = keeps  # whether this replica keeps the table's maintenance, main included
        self._clock = clock
        self._checked: dict[str, float] = {}
        self._pending: set[str] = set()  # tables whose main was left behind a portable snapshot
        self._diverged: set[str] = set()  # logged once each
        self._mains: dict[str, StagedMain] = {}  # as of each kept table's last check

    @property
    def mains(self) -> list[StagedMain]:
        """Where the main of each staged table this replica keeps stood at its last check."""
        return list(self._mains.values())

    @property
    def pending(self) -> bool:
        """Whether a main this replica keeps was left behind a portable snapshot (a stop waits)."""
        return bool(self._pending)

    def follow(self, committed_to: str | None = None) -> None:
        """Check the main of each staged table this replica keeps that is due, and of
        ``committed_to`` (a table the replica just committed to) at once, and move it forward."""
        now = self._clock()
        for name in self._staged:
            if not self._keeps(name):  # another replica keeps it now
                self._pending.discard(name)
                self._mains.pop(name, None)
                continue
            if name == committed_to or name in self._pending or now - self._checked.get(name, 0.0) >= CHECK_SECONDS:
                self._checked[name] = now
                try:
                    self._follow(name)
                except Exception as error:  # noqa: BLE001 - main waits for the next check, the loop goes on
                    log.warning("%s: main not moved this turn: %s: %s", name, type(error).__name__, error)

    def _follow(self, name: str) -> None:
        table = self._table(name)
        table.refresh()
        main = table.main_snapshot_id()
        read: list[SnapshotFacts] = []  # the branch's history as far as the decision read it
        decision = decide_main(_facts(table, read), main)
        self._pending.discard(name)
        if decision.move is MainMove.MOVE and decision.target is not None:
            if table.move_main(main, decision.target):
                metrics.MAIN_MOVES.labels(name).inc()
                main = decision.target
                log.debug("%s: main moved to snapshot %d", table.ref, decision.target)
            else:  # main moved meanwhile, or commits kept landing: decided again next turn
                self._pending.add(name)
        if decision.move is MainMove.DIVERGED:
            if name not in self._diverged:
                log.error(
                    "%s: main (snapshot %s) is not in the history of staging branch %s: something else committed "
                    "to main, and icecdc no longer moves it (point main back at a snapshot of the branch to resume)",
                    table.ref,
                    main,
                    table.ref.branch,
                )
            self._diverged.add(name)
        else:
            self._diverged.discard(name)
        # ``read`` reaches main: the decision reads the branch's history as far as main.
        lag = main_behind(read, main)
        self._mains[name] = StagedMain(name, table.ref.branch, main, lag)
        metrics.MAIN_BEHIND.labels(name).set(lag.seconds_behind if lag is not None else 0.0)


def _facts(table: IcebergTable, read: list[SnapshotFacts]) -> Iterator[SnapshotFacts]:
    """The staging branch's history, lazily (read no further than main), each snapshot kept in
    ``read`` as it goes."""
    for snapshot in table.history():
        facts = SnapshotFacts(snapshot.snapshot_id, snapshot.timestamp_ms, snapshot.summary)
        read.append(facts)
        yield facts
