"""The in-memory Iceberg model (tests/model/iceberg.py) itself, on the spec's cases: the property
tests are only as good as its read rule and its commits."""

import pytest

from tests.model.iceberg import CommitConflict, SpecViolation, Table

EU, US = ("eu",), ("us",)
NEW_SPEC = 2  # a spec the table changed to (0 is its first, 1 the global deletes')


def row(key: int, version: int = 0) -> dict:
    return {"id": key, "version": version}


def ids(table: Table, snapshot=None) -> list[tuple[int, int]]:
    return sorted((r["id"], r["version"]) for r in (snapshot or table.current).rows())


def test_an_equality_delete_hits_older_files_of_its_partition_only():
    table = Table(("id",))
    table.append({EU: [row(1), row(2)], US: [row(1)]}, {})
    table.append({EU: [row(2, 1)]}, {EU: [(2,), (1,)]})  # the batch's own row 2 is not deleted
    assert ids(table) == [(1, 0), (2, 1)]


def test_a_global_delete_hits_older_files_of_every_partition():
    table = Table(("id",))
    table.append({EU: [row(1)], US: [row(2)]}, {})
    table.append({US: [row(1, 1)]}, {}, global_keys=[(1,), (2,)])
    assert ids(table) == [(1, 1)]


def test_a_partitioned_equality_delete_hits_files_of_its_own_spec_only_and_a_global_one_those_of_every_spec():
    table = Table(("id",))
    table.append({EU: [row(1)]}, {})  # spec 0
    table.append({}, {EU: [(1,)]}, spec_id=NEW_SPEC)  # the same partition values, under another spec
    assert ids(table) == [(1, 0)]
    table.append({}, {}, global_keys=[(1,)], spec_id=NEW_SPEC)
    assert ids(table) == []


def test_a_rewrite_into_the_current_spec_takes_the_starting_sequence_number():
    table = Table(("id",))
    start = table.append({EU: [row(1), row(2)]}, {})
    assert start.holds_data_of_other_specs(NEW_SPEC)
    table.append({}, {}, global_keys=[(2,)], spec_id=NEW_SPEC)  # the writer, while the compaction runs
    rewritten = table.rewrite(start, list(start.data), [(EU, [row(1), row(2)])], [], [], spec_id=NEW_SPEC)
    [new] = rewritten.data.values()
    assert (new.spec_id, new.sequence_number) == (NEW_SPEC, start.sequence_number)
    assert not rewritten.holds_data_of_other_specs(NEW_SPEC)
    assert ids(table) == [(1, 0)]
    table.append({}, {EU: [(1,)]})  # the old spec's delete reaches it no more
    assert ids(table) == [(1, 0)]
    table.append({}, {EU: [(1,)]}, spec_id=NEW_SPEC)
    assert ids(table) == []


def test_a_position_delete_hits_the_file_it_names_up_to_its_own_sequence_number():
    table = Table(("id",))
    start = table.append({EU: [row(1), row(2)]}, {})
    [data] = start.data.values()
    table.row_delta(start, [(data.path, [0])], [], [data.path])
    assert ids(table) == [(2, 0)]


def test_a_rewrite_takes_the_starting_sequence_number_so_deletes_committed_meanwhile_still_apply():
    table = Table(("id",))
    table.append({EU: [row(1)]}, {})
    start = table.append({EU: [row(2)]}, {})
    table.append({}, {EU: [(1,)]})  # the writer, while the compaction runs
    rewritten = table.rewrite(start, list(start.data), [(EU, [row(1), row(2)])], [], [])
    assert ids(table, rewritten) == [(2, 0)]
    [new] = rewritten.data.values()
    assert new.sequence_number == start.sequence_number < rewritten.sequence_number


def test_a_rewrite_conflicts_with_a_position_delete_committed_meanwhile_for_a_file_it_replaces():
    table = Table(("id",))
    start = table.append({EU: [row(1)]}, {})
    [data] = start.data.values()
    table.row_delta(start, [(data.path, [0])], [], [data.path])
    with pytest.raises(CommitConflict):
        table.rewrite(start, [data.path], [(EU, [row(1)])], [], [])


def test_a_conversion_conflicts_when_a_file_it_examined_was_rewritten_meanwhile():
    table = Table(("id",))
    start = table.append({EU: [row(1)]}, {})
    table.rewrite(start, list(start.data), [(EU, [row(1)])], [], [])
    with pytest.raises(CommitConflict):
        table.row_delta(start, [], [], list(start.data))


def test_format_v3_refuses_a_conversion_whose_file_got_a_deletion_vector_meanwhile():
    table = Table(("id",), format_version=3)
    start = table.append({EU: [row(1), row(2)]}, {})
    [data] = start.data.values()
    table.row_delta(start, [(data.path, [0])], [], [data.path])
    with pytest.raises(CommitConflict):
        table.row_delta(start, [(data.path, [0, 1])], [], [data.path])


def test_two_deletion_vectors_for_one_data_file_break_a_v3_table():
    table = Table(("id",), format_version=3)
    start = table.append({EU: [row(1), row(2)], US: [row(3)]}, {})
    eu = next(f for f in start.data.values() if f.partition == EU)
    table.row_delta(start, [(eu.path, [0])], [], [eu.path])
    # A rewrite of another file that also converts this one: RewriteFiles does not validate DVs.
    other = [p for p in start.data if p != eu.path]
    with pytest.raises(SpecViolation):
        table.rewrite(start, other, [(US, [row(3)])], [(eu.path, [1])], [])


def test_a_rewrite_without_the_starting_sequence_number_conflicts_with_an_equality_delete_committed_meanwhile():
    table = Table(("id",))
    start = table.append({EU: [row(1), row(2)]}, {})
    table.append({}, {EU: [(1,)]})
    with pytest.raises(CommitConflict):
        table.rewrite(start, list(start.data), [], [], [], starting_sequence_number=False)
    assert table.rewrite(start, list(start.data), [], [], []).operation == "replace"
