"""The newest snapshot a reader that cannot apply equality deletes reads exactly
(``icecdc.domain.portable``), from snapshot summaries alone."""

from __future__ import annotations

from collections.abc import Iterator

from icecdc.domain.portable import TOTAL_EQUALITY_DELETES, PortableSnapshot, SnapshotFacts, newest_portable
from icecdc.portable_snapshot import describe, to_dict


def snapshot(snapshot_id: int, equality_deletes: int | None, seconds: float) -> SnapshotFacts:
    summary = {} if equality_deletes is None else {TOTAL_EQUALITY_DELETES: str(equality_deletes)}
    return SnapshotFacts(snapshot_id, int(seconds * 1000), {"operation": "overwrite", **summary})


def test_the_current_snapshot_when_it_holds_no_equality_delete():
    found = newest_portable([snapshot(3, 0, 30.0), snapshot(2, 5, 20.0)])
    assert found == PortableSnapshot(3, 3, 0, 0.0)
    assert found.is_current


def test_else_the_newest_ancestor_that_holds_none_and_how_far_behind_it_is():
    # A batch's equality deletes (5), the sidecar's conversion (0), the next batch's (3, 8).
    history = [snapshot(4, 8, 41.5), snapshot(3, 3, 40.0), snapshot(2, 0, 37.0), snapshot(1, 5, 35.0)]
    assert newest_portable(history) == PortableSnapshot(2, 4, 2, 4.5)


def test_a_summary_without_the_total_is_not_taken_for_portable():
    # A writer that keeps no totals says nothing about its snapshot, nor about any after it.
    assert newest_portable([snapshot(2, None, 20.0), snapshot(1, 0, 10.0)]) == PortableSnapshot(1, 2, 1, 10.0)
    assert newest_portable([snapshot(1, None, 10.0)]) is None


def test_none_when_every_snapshot_or_no_snapshot_holds_one():
    assert newest_portable([snapshot(2, 1, 2.0), snapshot(1, 4, 1.0)]) is None
    assert newest_portable([]) is None


def test_the_history_is_read_no_further_than_the_first_portable_snapshot():
    read: list[int] = []

    def history() -> Iterator[SnapshotFacts]:
        for s in (snapshot(3, 2, 3.0), snapshot(2, 0, 2.0), snapshot(1, 0, 1.0)):
            read.append(s.snapshot_id)
            yield s

    assert newest_portable(history()).snapshot_id == 2
    assert read == [3, 2]


def test_what_the_command_prints():
    assert describe("orders", None).startswith("orders: no portable snapshot")
    assert describe("orders", PortableSnapshot(7, 7, 0, 0.0)) == "orders: 7 (the current snapshot)"
    behind = PortableSnapshot(7, 9, 2, 4.5)
    assert describe("orders", behind) == "orders: 7, 2 commit(s) and 4.5s behind the current snapshot 9"
    assert to_dict(behind) == {"snapshot_id": 7, "current_snapshot_id": 9, "commits_behind": 2, "seconds_behind": 4.5}
    assert to_dict(None) is None
