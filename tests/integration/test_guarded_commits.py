"""A compaction beside a writer that deletes in place validates from the newest snapshot the
writer guard checked (``watcher.guard``), on the real stack, over random histories.

A plain Spark SQL writer runs ``DELETE`` and ``UPDATE`` in merge-on-read mode (position deletes
on v2, deletion vectors on v3) while a compaction of one partition is under way. The test plays
the guard itself, from what it told the writer to do: a job whose partition the writer touched
is not committed; any other commits, validating from the snapshot after the writer's commits.
One more writer commit may land after that check, which Iceberg's own validation must then
catch when it touched the job's partition. The rows are checked against the test's model of the
writer's statements, and every compaction snapshot must read its parent's rows.

On v3 Iceberg 1.10.2's validation fails when the writer replaced one file's deletion vector twice
in the validated stretch, in any partition ("Can't index multiple DVs", apache/iceberg#17764):
the first example is that history, and commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, example, given, settings

from icecdc.compactor.plans import plan_rewrite
from icecdc.compactor.policy import Work
from icecdc.compactor.rewrite import CompactionJob
from icecdc.coordinator.commits import Attempt
from icecdc.coordinator.errors import WriterWroteThere
from icecdc.domain import summary
from icecdc.domain.errors import CommitConflict
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import CommittedSnapshot, IcebergTable
from icecdc.runtime.config import Config, TableConfig
from tests.integration.test_compactor import compactor_config, table_metadata

REGIONS = ("eu", "us", "ap")
ROWS_PER_FILE = 8
FILES_PER_REGION = 4


@dataclass(frozen=True)
class Statement:
    """One writer commit: delete some rows of a region, or update their amounts."""

    region: str
    ranks: tuple[int, ...]  # which of the region's live rows, by rank (modulo their number)
    update: bool


statement = st.builds(
    Statement,
    st.sampled_from(REGIONS),
    st.lists(st.integers(0, 31), min_size=1, max_size=3, unique=True).map(tuple),
    st.booleans(),
)
# A compaction of one region: the writer's commits during the job (before the guard's check),
# and maybe one that lands after the check, before the commit.
compaction = st.tuples(st.sampled_from(REGIONS), st.lists(statement, max_size=3), st.one_of(st.none(), statement))
steps = st.lists(st.one_of(statement, compaction), min_size=2, max_size=5)


class Writer:
    """The plain Spark SQL writer and the model of its rows (id -> (region, amount))."""

    def __init__(self, spark, name: str) -> None:
        self.spark, self.name = spark, name
        self.rows: dict[int, tuple[str, int]] = {}

    def insert(self, region: str, ids: range) -> None:
        values = ", ".join(f"({i}, '{region}', {i})" for i in ids)
        self.spark.sql(f"INSERT INTO {self.name} VALUES {values}")
        self.rows.update({i: (region, i) for i in ids})

    def run(self, statement: Statement) -> bool:
        """Commits the statement; False when the region had no row left (nothing committed)."""
        live = sorted(i for i, (region, _) in self.rows.items() if region == statement.region)
        if not live:
            return False
        ids = sorted({live[r % len(live)] for r in statement.ranks})
        listed = ", ".join(map(str, ids))
        if statement.update:
            self.spark.sql(f"UPDATE {self.name} SET amount = amount + 1 WHERE id IN ({listed})")
            self.rows.update({i: (self.rows[i][0], self.rows[i][1] + 1) for i in ids})
        else:
            self.spark.sql(f"DELETE FROM {self.name} WHERE id IN ({listed})")
            for i in ids:
                del self.rows[i]
        return True

    def table_rows(self, snapshot_id: int | None = None) -> dict[int, tuple[str, int]]:
        at = "" if snapshot_id is None else f" VERSION AS OF {snapshot_id}"
        self.spark.sql(f"REFRESH TABLE {self.name}")
        return {r.id: (r.region, r.amount) for r in self.spark.sql(f"SELECT id, region, amount FROM {self.name}{at}").collect()}


def create(spark, name: str, format_version: int) -> Writer:
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, region STRING, amount BIGINT) USING iceberg PARTITIONED BY (region) "
        f"TBLPROPERTIES ('format-version' = '{format_version}', 'write.delete.mode' = 'merge-on-read', "
        "'write.update.mode' = 'merge-on-read', 'write.merge.mode' = 'merge-on-read')"
    )
    writer = Writer(spark, name)
    for n, region in enumerate(REGIONS):
        for f in range(FILES_PER_REGION):
            first = (n * FILES_PER_REGION + f) * ROWS_PER_FILE
            writer.insert(region, range(first, first + ROWS_PER_FILE))
    return writer


def compact(spark, config: Config, writer: Writer, region: str, during: list[Statement], late: Statement | None) -> int | None:
    """One compaction of ``region`` with the writer's commits in between; returns the snapshot it
    committed (None: nothing to do, or the guard or Iceberg's validation stopped it, as the
    model expects)."""
    loaded = table_metadata(config)
    table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
    job = CompactionJob(
        spark, table, loaded.layout, [(region,)], config.catalog.properties, config.compactor.target_file_size_bytes
    )
    listed = job.files()
    assert listed is not None
    plans = [plan_rewrite(files, Work.DELETE_MERGE, config.compactor) for files in listed]
    touched = {s.region for s in during if writer.run(s)}
    table.refresh()
    checked = table.current_snapshot()  # what the guard's poll read before the commit
    assert checked is not None
    late_touched = late is not None and writer.run(late) and late.region == region
    if plans[0].empty:
        event("nothing to compact")
        return None

    def commit(attempt: Attempt) -> CommittedSnapshot:
        if region in touched:  # what the guard says when the writer committed to the job's partition
            raise WriterWroteThere(f"the writer committed to {region}")
        return attempt(checked.snapshot_id)

    tags = {summary.COMPACTOR: "guard-test"}
    if region in touched:
        with pytest.raises(WriterWroteThere):
            job.run(plans, tags, commit)
        event("the guard stopped the job")
        return None
    if late_touched:  # the only commit that may fail the job: one to its partition after the check
        with pytest.raises(CommitConflict, match=r"replaced data file|missing"):
            job.run(plans, tags, commit)
        event("Iceberg's validation caught the late commit")
        return None
    results = job.run(plans, tags, commit)
    event(f"committed past the writer's commits to {len(touched)} other partitions")
    committed = results[0].committed
    assert committed is not None
    return committed.snapshot_id


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(history=steps, format_version=st.sampled_from([2, 3]))
# The writer replaces one us file's deletion vector twice, then deletes in ap after the check.
@example(
    history=[("eu", [Statement("us", (0,), False), Statement("us", (1,), True)], Statement("ap", (0,), False))],
    format_version=3,
)
# A delete in the job's partition after the check: Iceberg refuses the compaction, from there.
@example(history=[("eu", [Statement("us", (0,), True)], Statement("eu", (2,), False))], format_version=2)
# An update in the job's partition during the job: the guard stops it.
@example(history=[Statement("eu", (0,), False), ("eu", [Statement("eu", (1,), True)], None)], format_version=3)
def test_a_compaction_validated_from_the_guards_snapshot_keeps_every_row(spark, stack_config, history, format_version):
    unique = f"guard{time.monotonic_ns()}"
    name = f"it.guarded_{unique}"
    config = compactor_config(stack_config, unique).model_copy(update={"tables": [TableConfig(name=name)]})
    qualified = config.table_ref(config.tables[0]).qualified
    writer = create(spark, qualified, format_version)
    committed = []
    for step in history:
        if isinstance(step, Statement):
            writer.run(step)
        else:
            region, during, late = step
            snapshot = compact(spark, config, writer, region, during, late)
            if snapshot is not None:
                committed.append(snapshot)
    assert writer.table_rows() == writer.rows
    parents = {
        r.snapshot_id: r.parent_id for r in spark.sql(f"SELECT snapshot_id, parent_id FROM {qualified}.snapshots").collect()
    }
    for snapshot_id in committed:
        assert writer.table_rows(snapshot_id) == writer.table_rows(parents[snapshot_id]), snapshot_id
    spark.sql(f"DROP TABLE {qualified}")
