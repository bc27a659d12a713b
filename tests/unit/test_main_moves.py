"""Where a staged table's ``main`` goes (``icecdc.domain.portable.decide_main``): forward along the
staging branch, to its newest snapshot without equality deletes, never back, never off the branch."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from icecdc.domain.portable import (
    TOTAL_EQUALITY_DELETES,
    MainDecision,
    MainMove,
    PortableSnapshot,
    SnapshotFacts,
    decide_main,
    main_behind,
)


def branch(*snapshots: tuple[int, int]) -> list[SnapshotFacts]:
    """The branch's history, head first, from (snapshot id, equality-delete rows live in it)."""
    return [SnapshotFacts(i, i * 1000, {TOTAL_EQUALITY_DELETES: str(deletes)}) for i, deletes in snapshots]


def test_main_moves_to_the_newest_portable_snapshot_after_it():
    # Batch 4's equality deletes are waiting for their conversion; 3 converted batch 2's.
    history = branch((4, 7), (3, 0), (2, 5), (1, 0))
    assert decide_main(history, 1) == MainDecision(MainMove.MOVE, 3)


def test_main_stays_when_it_is_the_head_or_nothing_after_it_is_portable():
    assert decide_main(branch((3, 0), (2, 5)), 3) == MainDecision(MainMove.CURRENT)
    assert decide_main(branch((3, 4), (2, 5), (1, 0)), 1) == MainDecision(MainMove.WAIT)


def test_main_never_moves_back():
    # Another replica moved main to 3 already; 1 is portable and older: main stays.
    assert decide_main(branch((4, 7), (3, 0), (2, 5), (1, 0)), 3) == MainDecision(MainMove.WAIT)


def test_a_table_without_a_main_snapshot_gets_the_first_portable_one():
    assert decide_main(branch((2, 3), (1, 0)), None) == MainDecision(MainMove.MOVE, 1)
    assert decide_main(branch((1, 3)), None) == MainDecision(MainMove.WAIT)
    assert decide_main([], None) == MainDecision(MainMove.WAIT)


def test_main_off_the_branch_is_reported_not_moved():
    # Something other than icecdc committed to main: moving it would drop that commit.
    assert decide_main(branch((3, 0), (2, 0)), 9) == MainDecision(MainMove.DIVERGED)


def test_a_summary_without_totals_is_not_portable():
    history = [SnapshotFacts(2, 2000, {}), *branch((1, 0))]
    assert decide_main(history, None) == MainDecision(MainMove.MOVE, 1)


def test_how_far_main_is_behind_the_branch_head():
    # Snapshot i commits at i seconds: main at 2 is two commits and 2 s behind the head.
    history = branch((4, 7), (3, 5), (2, 0), (1, 0))
    assert main_behind(history, 2) == PortableSnapshot(2, 4, 2, 2.0)
    assert main_behind(history, 4) == PortableSnapshot(4, 4, 0, 0.0)
    assert main_behind(history, 9) is None  # off the branch
    assert main_behind(history, None) is None  # no main yet
    assert main_behind([], 1) is None


def test_the_history_is_read_no_further_than_main():
    read: list[int] = []

    def history() -> Iterator[SnapshotFacts]:
        for s in branch((4, 7), (3, 0), (2, 5), (1, 0)):
            read.append(s.snapshot_id)
            yield s

    assert decide_main(history(), 2) == MainDecision(MainMove.MOVE, 3)
    assert read == [4, 3, 2]
    read.clear()
    assert decide_main(history(), None) == MainDecision(MainMove.MOVE, 3)  # no main yet
    assert read == [4, 3]
    read.clear()
    assert main_behind(history(), 3) == PortableSnapshot(3, 4, 1, 1.0)
    assert read == [4, 3]


# Random histories of a staging branch with two replicas moving main, each deciding on its own
# (possibly stale) view and moving by compare-and-set, as ``compactor.staging`` and
# ``IcebergTable.move_main`` do: writer batches add equality deletes, conversions remove some or
# all of them, and a replica's move may come long after its decision.
operation = st.one_of(
    st.tuples(st.just("write"), st.integers(1, 5)),
    st.tuples(st.just("convert"), st.integers(0, 5)),  # how many deletes stay live (0: all converted)
    st.tuples(st.just("decide"), st.integers(0, 1)),
    st.tuples(st.just("move"), st.integers(0, 1)),
)


@settings(max_examples=300)
@given(st.lists(operation, max_size=40))
def test_main_only_moves_forward_to_portable_snapshots_whatever_the_interleaving(operations):
    deletes: dict[int, int] = {}  # snapshot id -> equality-delete rows live in it
    branch_ids: list[int] = []  # oldest first
    main: int | None = None
    decided: dict[int, tuple[int | None, int]] = {}  # replica -> (main as it saw it, target)

    def history() -> list[SnapshotFacts]:
        return [SnapshotFacts(i, i * 1000, {TOTAL_EQUALITY_DELETES: str(deletes[i])}) for i in reversed(branch_ids)]

    def commit(live: int) -> None:
        branch_ids.append(len(branch_ids) + 1)
        deletes[branch_ids[-1]] = live

    def decide_and_move() -> None:
        nonlocal main
        decision = decide_main(history(), main)
        if decision.move is MainMove.MOVE and decision.target is not None:
            main = decision.target

    for kind, value in operations:
        live = deletes[branch_ids[-1]] if branch_ids else 0
        if kind == "write":
            commit(live + value)
        elif kind == "convert":
            commit(min(live, value))
        elif kind == "decide":
            decision = decide_main(history(), main)
            assert decision.move is not MainMove.DIVERGED
            if decision.move is MainMove.MOVE and decision.target is not None:
                decided[value] = (main, decision.target)
        elif value in decided:  # the move: a compare-and-set on main
            expected, target = decided.pop(value)
            before = main
            if main == expected:
                main = target
            assert main is None or deletes[main] == 0, "main holds equality deletes"
            if before is not None:
                assert main is not None and branch_ids.index(main) >= branch_ids.index(before), "main moved back"
    commit(0)  # the writer stopped and every delete was converted
    decide_and_move()
    assert main == branch_ids[-1], "main is the branch's head once nothing is left to convert"
