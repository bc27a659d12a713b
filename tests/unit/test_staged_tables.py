"""The sidecar's keeping of staged tables' mains (``compactor.staging.StagedTables``), over a
table double that holds a branch's history and main: which tables it checks, when, and what a
failed move or a lost table leaves behind. The decision itself is ``tests/unit/test_main_moves.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from icecdc.compactor.staging import CHECK_SECONDS, StagedMain, StagedTables
from icecdc.domain.portable import TOTAL_EQUALITY_DELETES, PortableSnapshot
from icecdc.domain.tableref import TableRef
from icecdc.jvm.tables import Snapshot

BRANCH = "icecdc-staged"
REF = TableRef.of("lake", "db.a", BRANCH)


@dataclass
class StagedTable:
    """A staging branch (oldest first: snapshot id, equality deletes live) and main."""

    branch: list[tuple[int, int]]
    main: int | None = None
    refuse_moves: bool = False
    refreshes: int = 0
    moves: list[int] = field(default_factory=list)
    ref: TableRef = REF

    def refresh(self) -> None:
        self.refreshes += 1

    def main_snapshot_id(self) -> int | None:
        return self.main

    def history(self):
        for snapshot_id, deletes in reversed(self.branch):
            yield Snapshot(
                snapshot_id, None, snapshot_id, snapshot_id * 1000, "overwrite", {TOTAL_EQUALITY_DELETES: str(deletes)}
            )

    def move_main(self, expected: int | None, target: int) -> bool:
        if self.refuse_moves or expected != self.main:
            return False
        self.main = target
        self.moves.append(target)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_main_follows_the_branch_on_each_check_and_after_each_commit_at_once():
    table, clock = StagedTable([(1, 0), (2, 4)]), Clock()
    staged = StagedTables(["db.a"], lambda name: table, lambda name: True, clock)
    staged.follow()
    assert table.main == 1
    table.branch += [(3, 0)]
    staged.follow()  # not due yet: checked less than CHECK_SECONDS ago
    assert table.main == 1
    staged.follow(committed_to="db.a")  # the replica's own commit: checked at once
    assert table.main == 3
    table.branch += [(4, 2), (5, 0)]
    clock.now += CHECK_SECONDS
    staged.follow()
    assert table.moves == [1, 3, 5]


def test_a_refused_move_is_pending_until_it_lands_or_another_replica_keeps_the_table():
    table, keeps = StagedTable([(1, 0)], refuse_moves=True), {"db.a": True}
    staged = StagedTables(["db.a"], lambda name: table, keeps.__getitem__, Clock())
    staged.follow()
    assert staged.pending and table.main is None  # a stop waits for it
    table.refuse_moves = False
    staged.follow()  # pending: checked again at once
    assert not staged.pending and table.main == 1
    table.branch += [(2, 0)]
    table.refuse_moves = True
    staged.follow(committed_to="db.a")
    assert staged.pending
    keeps["db.a"] = False  # the table's maintenance went to another replica, main with it
    staged.follow()
    assert not staged.pending and table.main == 1


def test_tables_another_replica_keeps_are_not_read_and_errors_do_not_stop_the_loop(caplog):
    mine, theirs = StagedTable([(1, 0)]), StagedTable([(1, 0)])
    broken = StagedTable([(1, 0)])
    broken.history = None  # reading its history fails
    tables = {"db.mine": mine, "db.theirs": theirs, "db.broken": broken}
    staged = StagedTables(list(tables), tables.__getitem__, lambda name: name != "db.theirs", Clock())
    staged.follow()
    assert mine.main == 1 and theirs.refreshes == 0 and broken.main is None
    assert "db.broken: main not moved this turn" in caplog.text


def test_where_each_kept_main_stands_on_its_branch_is_kept_for_the_status():
    # Snapshot i commits at i seconds; 4's equality deletes wait for their conversion.
    table, keeps = StagedTable([(1, 0), (2, 4), (3, 0), (4, 5)]), {"db.a": True}
    staged = StagedTables(["db.a"], lambda name: table, keeps.__getitem__, Clock())
    assert staged.mains == []  # nothing checked yet
    staged.follow()
    assert table.main == 3
    assert staged.mains == [StagedMain("db.a", BRANCH, 3, PortableSnapshot(3, 4, 1, 1.0))]
    assert "main is 1 commit(s) and 1.0s behind the branch's head" in staged.mains[0].describe()
    keeps["db.a"] = False  # another replica keeps it, and reports it
    staged.follow()
    assert staged.mains == []


def test_a_main_off_the_branch_or_without_a_snapshot_says_so():
    off = StagedMain("db.a", BRANCH, 9, None)
    assert "NOT on the branch" in off.describe()
    assert "no snapshot yet" in StagedMain("db.a", BRANCH, None, None).describe()
    assert "main is the branch's head" in StagedMain("db.a", BRANCH, 4, PortableSnapshot(4, 4, 0, 0.0)).describe()
