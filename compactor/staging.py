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

from icecdc.compactor import metrics
from icecdc.domain.portable import MainMove, SnapshotFacts, decide_main
from icecdc.jvm.tables import IcebergTable

log = logging.getLogger(__name__)

# A metadata refresh and a walk of the branch's newest snapshots: a few ms. Once a second keeps
# main within a second of a portable head without a catalog read every turn.
CHECK_SECONDS = 1.0


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
        times = {f.snapshot_id: f.timestamp_ms for f in read}
        behind = (times[read[0].snapshot_id] - times[main]) / 1000 if read and main in times else 0.0
        metrics.MAIN_BEHIND.labels(name).set(behind)


def _facts(table: IcebergTable, read: list[SnapshotFacts]) -> Iterator[SnapshotFacts]:
    """The staging branch's history, lazily (read no further than main), each snapshot kept in
    ``read`` as it goes."""
    for snapshot in table.history():
        facts = SnapshotFacts(snapshot.snapshot_id, snapshot.timestamp_ms, snapshot.summary)
        read.append(facts)
        yield facts
