"""Staged commits (a table's ``staging_branch``) over random histories on the real stack: the
writer's batches and the compactor's conversions and merges commit to the staging branch, writer
batches landing while they run, and main is moved after some steps, a writer batch landing between
the decision and the move (``icecdc.domain.portable.decide_main``, ``IcebergTable.move_main``).

Checked against the model of the rows (tests/cdc.py): every snapshot main ever pointed at is read
by pyiceberg, which refuses a live equality delete, and holds exactly the model's rows as of the
batch it holds; a stale move (another replica's, decided before main moved) changes nothing; at
the end, once every partition is converted, main is the branch's head and holds every row."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from icecdc.bench.engine_readers import read_pyiceberg
from icecdc.bench.portability import ReadOutcome, exactness
from icecdc.compactor import status
from icecdc.compactor.rewrite import Committer, CompactionResult
from icecdc.domain.portable import MainMove, SnapshotFacts, decide_main
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config
from tests.histories import History, run_history
from tests.integration.test_compactor import compactor_config
from tests.integration.test_hot_partitions import REGIONS, batch, maintain, region_table
from tests.integration.test_readers import COLUMNS, batch_snapshot

KB = 1024
BRANCH = "icecdc-staged"

step = st.tuples(
    st.tuples(st.sampled_from(["convert", "convert", "hot", "merge", "main", "main"]), st.sampled_from(REGIONS)),
    st.one_of(st.none(), batch),  # a writer batch that commits while the step runs
)
history = st.lists(st.tuples(batch, st.one_of(st.none(), step)), min_size=3, max_size=6)


class Mains:
    """Main's moves in one history, made as the sidecar makes them (``compactor.staging``)."""

    def __init__(self) -> None:
        self.snapshots: list[int] = []  # every snapshot main was moved to, in order

    def maintain(self, history: History, chosen: tuple[str, str], commit: Committer) -> list[CompactionResult]:
        kind, _ = chosen
        if kind != "main":
            return maintain(history, chosen, commit)
        self.move(history, commit)
        return []

    def move(self, history: History, commit: Committer) -> None:
        table = history.table
        table.refresh()
        main = table.main_snapshot_id()
        facts = (SnapshotFacts(s.snapshot_id, s.timestamp_ms, s.summary) for s in table.history())
        decision = decide_main(facts, main)
        assert decision.move is not MainMove.DIVERGED, decision
        if decision.move is not MainMove.MOVE or decision.target is None:
            commit(lambda: None)  # the writer's batch, if the step has one, lands all the same
            return
        target = decision.target
        assert commit(lambda: table.move_main(main, target)), "main had not moved: the move must land"
        if self.snapshots:  # a replica that decided before this move cannot take main back
            assert not table.move_main(main, self.snapshots[-1])
        table.refresh()
        assert table.main_snapshot_id() == target
        self.snapshots.append(target)


def assert_every_main_was_exact(config: Config, history: History, mains: list[int]) -> None:
    table = pyiceberg_catalog(config).load_table(config.table_ref(config.tables[0]).identifier)
    model_at = {snapshot: sorted(rows) for snapshot, rows in history.writer_snapshots.items()}
    for snapshot_id in mains:
        read = read_pyiceberg(table, COLUMNS, snapshot_id)
        rows = None if read.rows is None else [tuple(r.values()) for r in read.rows.to_pylist()]
        holds = batch_snapshot(table, snapshot_id)
        assert holds in model_at, f"main at {snapshot_id} holds no batch of this history"
        assert exactness(model_at[holds], rows) is ReadOutcome.EXACT, (snapshot_id, read.refused)


def assert_status_places_main(config: Config, history: History) -> None:
    """``icecdc status`` (from metadata, through pyiceberg) puts main where Iceberg's Java API
    has it on the branch: the branch's commits after it."""
    table = history.table
    branch = [s.snapshot_id for s in table.history()]
    main = table.main_snapshot_id()
    [staged] = status.from_metadata(config, time.time()).staged
    assert (staged.branch, staged.main_snapshot_id) == (BRANCH, main)
    if main is None:
        assert staged.behind is None
    else:
        assert staged.behind is not None and staged.behind.current_snapshot_id == branch[0]
        assert staged.behind.commits_behind == branch.index(main)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=history, format_version=st.sampled_from([2, 3]))
# Main moved past a conversion while the writer's next batch lands, then again after another.
@example(
    steps=[
        ([(2, "eu", 0, 1)], (("convert", "eu"), None)),
        ([(4, "us", 0, 2)], (("main", "eu"), [(2, "us", 0, 3)])),
        ([(6, "eu", 0, 4)], (("convert", "us"), None)),
        ([(4, None, 0, 5)], (("main", "eu"), None)),
    ],
    format_version=2,
)
def test_random_histories_on_a_staging_branch_keep_main_exact_and_portable(spark, stack_config, steps, format_version):
    unique = f"staged{time.monotonic_ns()}"
    base = region_table(compactor_config(stack_config, unique, target_file_size_bytes=64 * KB, hot_read_budget=2), format_version)
    config = base.model_copy(update={"tables": [base.tables[0].model_copy(update={"staging_branch": BRANCH})]})
    mains = Mains()
    history = run_history(spark, config, [(k, REGIONS[k % 2], 0, k) for k in range(1, 31)], steps, mains.maintain)
    for region in REGIONS:  # the sidecar converts what is left once the writer stops
        maintain(history, ("convert", region), history.committer(None))
    history.table.refresh()
    assert_status_places_main(config, history)
    mains.move(history, history.committer(None))
    history.table.refresh()
    assert_status_places_main(config, history)
    assert history.table.main_snapshot_id() == history.table.current_snapshot().snapshot_id, "main is the branch's head"
    assert_every_main_was_exact(config, history, mains.snapshots)
