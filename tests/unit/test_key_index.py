"""The compactor's key index (``compactor/key_index.py``) and the conversions made through it
(``compactor/key_index_loader.py``): its answers by the sequence-number rules in milliseconds,
then random histories on the in-memory Iceberg model (tests/model) with writer commits, global
deletes, concurrent rewrites, key moves between partitions, restarts and evictions, where every
position the index yields is checked against the model's own reading of the table."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import hypothesis.strategies as st
import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from pydantic import ValidationError

from icecdc.compactor.key_index import DeleteKeys, KeyIndex
from icecdc.compactor.key_index_loader import convert_with_index
from icecdc.compactor.plans import (
    PartitionFiles,
    keep_deletes_of_unchanged,
    plan_conversion,
    plan_hot,
    plan_resolution,
    plan_rewrite,
)
from icecdc.compactor.policy import Work
from icecdc.compactor.positions import Conversion, ConvertedFile, FileDeletes, PositionDeletes
from icecdc.domain.files import LiveDataFile
from icecdc.runtime.config import CompactorConfig
from tests.cdc import REGIONS, SourceDatabase, changes, image
from tests.model.compaction import global_delete_files, live_data_file, partition_files, prepare
from tests.model.iceberg import CommitConflict, EqualityDelete, Snapshot, Table
from tests.model.writer import FULL_BEFORE_IMAGES, KEY_ONLY_BEFORE_IMAGES, commit_batch, orders_layout


def keys(*values: int | None) -> pa.Table:
    return pa.table({"1": pa.array(values, pa.int64())})


def positions(array: pa.Array | None) -> list[int]:
    return [] if array is None else sorted(array.to_pylist())


def index_of(files: dict[str, tuple[int, pa.Table]], partition: str = "p", max_bytes: int = 1 << 30) -> KeyIndex:
    index = KeyIndex(max_bytes)
    index.reconcile(partition, [LiveDataFile(path, 0, t.num_rows, seq) for path, (seq, t) in files.items()])
    for path, (seq, t) in files.items():
        index.add(partition, path, seq, t)
    return index


# --- the index alone ---


def test_an_equality_delete_removes_its_keys_from_older_files_only():
    index = index_of({"old": (1, keys(1, 2, 3)), "same": (2, keys(2)), "newer": (3, keys(2))})
    removed = index.removed([("old", 1, ()), ("same", 2, ()), ("newer", 3, ())], [DeleteKeys(2, keys(2, 9))])
    assert [(r.data_file, positions(r.new)) for r in removed] == [("old", [1])]


def test_a_key_in_several_files_of_its_history_is_removed_from_each():
    index = index_of({"a": (1, keys(7, 8)), "b": (2, keys(9, 7)), "c": (3, keys(7))})
    removed = index.removed([("a", 1, ()), ("b", 2, ()), ("c", 3, ())], [DeleteKeys(3, keys(7)), DeleteKeys(4, keys(7))])
    assert sorted((r.data_file, positions(r.new)) for r in removed) == [("a", [0]), ("b", [1]), ("c", [0])]


def test_rows_its_position_deletes_removed_are_not_new_and_are_known_while_those_deletes_are_live():
    index = index_of({"a": (1, keys(1, 2, 3))})
    index.record_deleted("a", ["dv-1"], pa.array([0], pa.int64()))
    # Key 1 again (already deleted) and key 2: only 2 is new; the earlier position is known.
    (removed,) = index.removed([("a", 1, ("dv-1",))], [DeleteKeys(5, keys(1, 2))])
    assert positions(removed.new) == [1] and positions(removed.earlier) == [0]
    # Only key 1: nothing new, no file to write.
    assert index.removed([("a", 1, ("dv-1",))], [DeleteKeys(5, keys(1))]) == []
    # Someone else's position deletes replaced ours: the earlier positions must be read again.
    (removed,) = index.removed([("a", 1, ("theirs",))], [DeleteKeys(5, keys(1))])
    assert positions(removed.new) == [0] and removed.earlier is None


def test_keys_with_several_columns_match_nulls_as_equal():
    data = pa.table({"1": pa.array([1, 1, None], pa.int64()), "2": pa.array(["x", None, None])})
    index = index_of({"a": (1, data)})
    deleted = pa.table({"1": pa.array([1, None], pa.int64()), "2": pa.array([None, None], pa.string())})
    (removed,) = index.removed([("a", 1, ())], [DeleteKeys(2, deleted)])
    assert positions(removed.new) == [1, 2]


def test_a_reconcile_forgets_files_a_rewrite_removed_and_names_the_new_ones():
    index = index_of({"a": (1, keys(1)), "b": (2, keys(2))})
    missing = index.reconcile("p", [LiveDataFile("b", 0, 1, 2), LiveDataFile("packed", 0, 1, 1)])
    assert [f.path for f in missing] == ["packed"]
    assert "a" not in index and "b" in index


def test_past_its_bound_the_least_recently_converted_partitions_go_first():
    index = KeyIndex(max_bytes=2 * keys(1, 2).nbytes)
    for partition in ("eu", "us", "apac"):
        index.reconcile(partition, [LiveDataFile(partition, 0, 2, 1)])
        index.add(partition, partition, 1, keys(1, 2))
    index.reconcile("eu", [LiveDataFile("eu", 0, 2, 1)])  # converted again: most recent
    assert index.evict(keep="apac") == ["us"]
    assert index.partitions == ["apac", "eu"] and index.evictions == 1
    # A partition larger than the whole bound is not kept either, once converted.
    index.max_bytes = 1
    assert index.evict(keep="apac") == ["eu", "apac"]


def test_the_key_to_partition_view_finds_a_global_deletes_keys_in_memory():
    index = KeyIndex(1 << 20)
    for partition, values in (("eu", (1, 2)), ("us", (3,)), ("apac", (4, 1))):
        index.add(partition, f"{partition}-file", 1, keys(*values))
    assert index.partitions_holding(keys(1, 9)) == {"eu", "apac"}


def test_bytes_per_key_of_a_long_key_is_its_width():
    index = index_of({"a": (1, keys(*range(10_000)))})
    assert index.keys == 10_000 and 8 <= index.bytes_per_key() < 8.1
    assert index.usage(lambda p: "orders") == {"orders": (index.nbytes, 10_000)}


# --- conversions through the index, on the model ---


class ModelFiles:
    """A conversion's reads and writes (``key_index_loader.ConversionFiles``) on the model's
    snapshot: keys from the files' rows, positions from its delete files."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.read: list[str] = []  # data files whose keys were read
        self.written: dict[str, frozenset[int]] = {}  # data file -> every position written for it

    def data_keys(self, path: str, field_ids: Sequence[int]) -> pa.Table:
        self.read.append(path)
        return keys(*(row["id"] for row in self.snapshot.data[path].rows))

    def delete_keys(self, path: str, field_ids: Sequence[int]) -> pa.Table:
        delete = self.snapshot.deletes[path]
        assert isinstance(delete, EqualityDelete)
        return keys(*sorted(k[0] for k in delete.keys))

    def earlier_positions(self, data_file: str, position_deletes: Sequence[PositionDeletes]) -> pa.Array:
        found = {p for d in position_deletes for p in self.snapshot.deletes[d.path].positions}
        return pa.array(sorted(found), pa.int64())

    def deleted_positions_of(self, files: Sequence[FileDeletes]) -> list[tuple[pa.Array, pa.Array]]:
        out = []
        for file in files:
            self.read.append(file.data_file)
            earlier = self.earlier_positions(file.data_file, file.position_deletes)
            named = {k for d in file.equality_deletes for k in self.snapshot.deletes[d.path].keys}
            rows = self.snapshot.data[file.data_file].rows
            new = sorted({i for i, row in enumerate(rows) if (row["id"],) in named} - set(earlier.to_pylist()))
            out.append((earlier, pa.array(new, pa.int64())))
        return out

    def write(self, task: Conversion, deleted: tuple[pa.Array, pa.Array]) -> ConvertedFile:
        earlier, new = deleted
        every = frozenset(earlier.to_pylist()) | frozenset(new.to_pylist())
        if not len(new):
            return ConvertedFile(task.data_file, None, len(earlier), 0, 0)
        self.written[task.data_file] = every
        return ConvertedFile(task.data_file, task.output, len(every), len(new), 8 * len(every))


def expected_positions(snapshot: Snapshot, files: PartitionFiles, path: str) -> frozenset[int]:
    """The model's own answer: every position of the file that the listing's equality deletes
    (by the sequence-number rules) and its position deletes remove at the snapshot."""
    data = snapshot.data[path]
    listed = {d.path for d in files.deletes}
    named = {k for d in snapshot.equality_deletes_of(data) if d.path in listed for k in d.keys}
    earlier = {p for d in snapshot.position_deletes_of(data) for p in d.positions}
    return frozenset(earlier | {i for i, row in enumerate(data.rows) if snapshot.key_of(row) in named})


class IndexedHistory:
    """One history under way: the model table, the source, the sidecar's key index."""

    def __init__(self, key_only: bool, format_version: int, max_bytes: int) -> None:
        self.source = SourceDatabase(key_only_before=key_only)
        self.rules = KEY_ONLY_BEFORE_IMAGES if key_only else FULL_BEFORE_IMAGES
        self.layout = orders_layout(["region"], format_version)
        self.table = Table(self.layout.primary_key, format_version, 1024)
        self.max_bytes = max_bytes
        self.index = KeyIndex(max_bytes)
        self.outputs = (f"out-{n}" for n in itertools.count())
        self.conversions = 0

    def write(self, batch) -> None:
        if pairs := self.source.apply(batch):
            commit_batch(self.table, self.layout, self.rules, pairs)

    def restart(self) -> None:
        self.index = KeyIndex(self.max_bytes)

    def prepare_conversion(self, partition: tuple | None):
        """An indexed conversion listed and computed now, committed when the caller says."""
        start = self.table.current
        files = partition_files(start, partition) if partition is not None else global_delete_files(start)
        if files is None:
            return None
        plan = plan_conversion(files) if partition is not None else plan_resolution(files)
        if plan.empty:
            return None
        model = ModelFiles(start)
        live = (
            []
            if partition is None
            else [(partition, [live_data_file(f) for f in start.data.values() if f.partition == partition])]
        )
        facts = {f.path: f for f in files.data}
        deletes = {d.path: d for d in files.deletes}
        done = convert_with_index(
            self.index, live, [facts[p] for p in plan.convert], deletes, (1,), model, lambda _: next(self.outputs), False
        )
        assert done is not None
        unchanged = {c.data_file for c in done.converted if c.path is None}
        for c in done.converted:
            expected = expected_positions(start, files, c.data_file)
            if c.path is None:
                earlier = {p for d in start.position_deletes_of(start.data[c.data_file]) for p in d.positions}
                assert expected <= earlier, f"{c.data_file}: rows left undeleted"
            else:
                assert model.written[c.data_file] == expected, c.data_file
        if partition is not None and len(live[0][1]) > 1 and len(model.read) < len(live[0][1]):
            event("a conversion read fewer data files than its partition holds")
        plan = keep_deletes_of_unchanged(plan, files, unchanged)
        paths = {c.data_file: c.path for c in done.converted if c.path}
        added = [(path, model.written[path]) for path in paths]
        examined = tuple(dict.fromkeys((*plan.convert, *plan.examined)))
        return lambda: self.table.row_delta(start, added, plan.remove_deletes, examined, paths)


def model_rows(snapshot: Snapshot) -> list[tuple]:
    return sorted(image(row) for row in snapshot.rows())


SETTINGS = CompactorConfig(target_file_size_bytes=16 * 1024, min_small_files=2, hot_read_budget=2, large_file_ratio=0.25)
step = st.one_of(
    st.tuples(st.just("write"), st.none(), changes(keys=30, days=1, max_size=10)),
    st.tuples(st.just("convert"), st.sampled_from(REGIONS[:2]), st.lists(changes(keys=30, max_size=5), max_size=2)),
    st.tuples(st.just("resolve"), st.none(), st.lists(changes(keys=30, max_size=5), max_size=1)),
    # A rewrite by another compaction from the same snapshot as a conversion, committed first.
    st.tuples(st.just("rewrite beside"), st.sampled_from(REGIONS[:2]), st.sampled_from(["merge", "minor", "hot"])),
    st.tuples(st.just("restart"), st.none(), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(step, min_size=1, max_size=12),
    key_only=st.booleans(),
    format_version=st.sampled_from([2, 3]),
    max_bytes=st.sampled_from([0, 200, 1 << 30]),
)
def test_random_histories_converted_through_the_index_keep_the_models_rows(steps, key_only, format_version, max_bytes):
    history = IndexedHistory(key_only, format_version, max_bytes)
    history.write([(k, REGIONS[k % 2], 0, k) for k in range(1, 31)])
    for kind, partition, extra in steps:
        if kind == "write":
            history.write(extra)
        elif kind == "restart":
            history.restart()
        elif kind in ("convert", "resolve"):
            commit = history.prepare_conversion(None if partition is None else (partition,))
            for batch in extra:  # writer batches committed while it runs
                history.write(batch)
            if commit is not None:
                before = model_rows(history.table.current)
                assert model_rows(commit()) == before
                event(f"{kind} committed")
        else:
            start = history.table.current
            files = partition_files(start, (partition,))
            plan = (
                plan_hot(files, SETTINGS)
                if extra == "hot"
                else plan_rewrite(files, Work.DELETE_MERGE if extra == "merge" else Work.MINOR, SETTINGS)
            )
            convert = history.prepare_conversion((partition,))
            rewrite = prepare(history.table, start, [plan], [files], SETTINGS)
            for attempt in (rewrite, convert):
                if attempt is None:
                    continue
                try:
                    before = model_rows(history.table.current)
                    assert model_rows(attempt()) == before
                except CommitConflict:
                    event("a rewrite and a conversion of one partition: one refused")
    assert model_rows(history.table.current) == history.source.expected_images()


def test_after_the_first_conversion_only_new_files_are_read():
    history = IndexedHistory(key_only=False, format_version=2, max_bytes=1 << 30)
    history.write([(k, "eu", 0, k) for k in range(1, 31)])
    history.write([(1, "eu", 0, 5)])
    history.write([(2, "eu", 0, 5)])
    start = history.table.current
    commit = history.prepare_conversion(("eu",))
    assert commit is not None
    commit()
    history.write([(3, "eu", 0, 5)])
    files = partition_files(history.table.current, ("eu",))
    plan = plan_conversion(files)
    model = ModelFiles(history.table.current)
    live = [live_data_file(f) for f in history.table.current.data.values()]
    facts = {f.path: f for f in files.data}
    done = convert_with_index(
        history.index,
        [(("eu",), live)],
        [facts[p] for p in plan.convert],
        {d.path: d for d in files.deletes},
        (1,),
        model,
        lambda _: "out",
        False,
    )
    assert done is not None
    newest = max(history.table.current.data.values(), key=lambda f: f.sequence_number)
    assert model.read == [newest.path] and done.reads.key_files == 1
    first = min(start.data.values(), key=lambda f: f.sequence_number)  # where key 3 was written
    assert [c.data_file for c in done.converted if c.path] == [first.path]


def test_a_restart_rebuilds_the_index_from_the_partitions_files():
    history = IndexedHistory(key_only=False, format_version=3, max_bytes=1 << 30)
    history.write([(k, "eu", 0, k) for k in range(1, 11)])
    history.write([(1, "eu", 0, 5)])
    history.restart()
    commit = history.prepare_conversion(("eu",))
    assert commit is not None
    assert model_rows(commit()) == history.source.expected_images()
    assert history.index.keys == 11


def test_the_bound_is_configured_in_bytes_and_zero_turns_the_index_off():
    assert CompactorConfig().key_index_max_bytes == 256 * 1024 * 1024
    assert CompactorConfig(key_index_max_bytes=0).key_index_max_bytes == 0
    with pytest.raises(ValidationError):
        CompactorConfig(key_index_max_bytes=-1)
