"""Partitions of older partition specs join the current spec, on the real stack, on format v2 and
v3: a table's spec gains ``bucket(4, id)`` mid-stream, its writer updates and deletes rows on both
sides of the change, and the sidecar then compacts. Written by a Spark SQL merge-on-read job
(position deletes on v2, deletion vectors on v3, against files of the old spec too) and by
icecdc's ingester (equality deletes under the old spec, global deletes under the unpartitioned
spec). Afterwards no live file, data or delete, of any spec but the current one is left, every
data file is sorted by the table's order, the table holds the model's rows, and every snapshot
the sidecar committed holds its parent's rows (docs/compactor.md, "Older partition specs")."""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
import pytest

from icecdc.compactor.sidecar import CompactorSidecar, create_sidecar
from icecdc.domain.errors import PartitionSpecChanged
from icecdc.domain.events import CompactionEvent, CompactionKind, CompactionOutcome
from icecdc.runtime.config import Config, TableConfig
from tests.cdc import REGIONS, table_rows
from tests.integration.test_compaction_jobs import orders_of_format
from tests.integration.test_compactor import Stream, assert_compactions_kept_rows, compactor_config, table_metadata
from tests.integration.test_ingest_writer import batch_writer, qualified

# Every partition settled at once: the sidecar compacts them all in a few turns.
SETTLED = {"min_seconds": 0, "initial_seconds": 0, "max_seconds": 0.001}
# A bound on the sidecar's turns: a job each partition, and the turns that find nothing left.
MAX_TURNS = 80


def compact_until_done(sidecar: CompactorSidecar) -> list[CompactionEvent]:
    """The sidecar's turns until one makes no compaction and none is due."""
    events: list[CompactionEvent] = []
    for _ in range(MAX_TURNS):
        turn = sidecar.run_once(poll_timeout=0.5)
        events += turn
        if not turn and not sidecar.candidates(sidecar._clock()):
            break
    sidecar.close()
    return events


def live_files_by_spec(spark: Any, name: str) -> dict[tuple[int, int], int]:
    """(spec id, content) -> live files: content 0 data, 1 position deletes or DVs, 2 equality deletes."""
    spark.sql(f"REFRESH TABLE {name}")
    rows = spark.sql(f"SELECT spec_id, content, count(*) AS n FROM {name}.files GROUP BY 1, 2").collect()
    return {(r.spec_id, r.content): r.n for r in rows}


def assert_sorted_by_id(spark: Any, name: str) -> None:
    for row in spark.sql(f"SELECT file_path FROM {name}.files WHERE content = 0").collect():
        ids = pq.read_table(row.file_path.removeprefix("file:"), columns=["id"]).column("id").to_pylist()
        assert ids == sorted(ids), row.file_path


def assert_only_the_current_spec(spark: Any, config: Config, before: dict[tuple[int, int], int]) -> None:
    name, current = qualified(config), table_metadata(config).layout.spec_id
    assert any(spec != current for spec, _ in before), f"the writer left no file of an older spec: {before}"
    after = live_files_by_spec(spark, name)
    assert after and {spec for spec, _ in after} == {current}, after


def assert_joined_the_current_spec(
    spark: Any, config: Config, before: dict[tuple[int, int], int], events: list[CompactionEvent]
) -> None:
    """The sidecar rewrote older-spec partitions, every job ended committed or with nothing to
    do, only the current spec's files are live, sorted by id, and every compaction kept its
    parent's rows."""
    name = qualified(config)
    assert older_spec_rewrites(events), events
    assert {e.outcome for e in events} <= {CompactionOutcome.COMMITTED, CompactionOutcome.SKIPPED}, events
    assert_only_the_current_spec(spark, config, before)
    assert_sorted_by_id(spark, name)
    assert_compactions_kept_rows(spark, name, events)


def older_spec_rewrites(events: list[CompactionEvent]) -> list[CompactionEvent]:
    return [e for e in events if e.kind is CompactionKind.REWRITE_OLDER_SPEC and e.outcome is CompactionOutcome.COMMITTED]


@pytest.mark.parametrize("format_version", [2, 3])
def test_a_spark_merge_on_read_writer_s_older_spec_partitions_join_the_current_spec(spark, stack_config, unique, format_version):
    base = compactor_config(stack_config, unique, settle=SETTLED)
    config = base.model_copy(update={"tables": [TableConfig(name=f"it.respec_{unique}")]})
    name = qualified(config)
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, region STRING, amount BIGINT) USING iceberg PARTITIONED BY (region) "
        f"TBLPROPERTIES ('format-version'='{format_version}', 'write.delete.mode'='merge-on-read', "
        "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')"
    )
    spark.sql(f"ALTER TABLE {name} WRITE ORDERED BY id")
    model: dict[int, tuple[str, int]] = {}

    def insert(ids: range) -> None:
        rows = {k: (REGIONS[k % 3], 10 * k) for k in reversed(ids)}  # in no order of id
        spark.sql(f"INSERT INTO {name} VALUES " + ", ".join(f"({k}, '{r}', {a})" for k, (r, a) in rows.items()))
        model.update(rows)

    def update(where: str, keys: list[int], amount: int, region: str | None = None) -> None:
        moved = f", region = '{region}'" if region else ""
        spark.sql(f"UPDATE {name} SET amount = {amount}{moved} WHERE {where}")
        model.update({k: (region or model[k][0], amount) for k in keys})

    def delete(where: str, keys: list[int]) -> None:
        spark.sql(f"DELETE FROM {name} WHERE {where}")
        for k in keys:
            model.pop(k, None)

    insert(range(40))
    insert(range(40, 80))
    update("id % 7 = 0", [k for k in model if k % 7 == 0], 1)
    delete("id % 11 = 0", [k for k in model if k % 11 == 0])
    spark.sql(f"ALTER TABLE {name} ADD PARTITION FIELD bucket(4, id)")
    insert(range(80, 120))
    # Rows of both specs: deletes against the old spec's files, new versions in the new spec.
    update("id % 5 = 0", [k for k in model if k % 5 == 0], 2)
    update("id % 17 = 1", [k for k in model if k % 17 == 1], 3, region="us")
    delete("id % 13 = 0", [k for k in model if k % 13 == 0])
    before = live_files_by_spec(spark, name)
    assert before.get((0, 1)), f"no delete of the old spec: {before}"

    events = compact_until_done(create_sidecar(config, spark))

    assert_joined_the_current_spec(spark, config, before, events)
    expected = sorted((k, r, a) for k, (r, a) in model.items())
    assert sorted(map(tuple, spark.sql(f"SELECT id, region, amount FROM {name}").collect())) == expected


@pytest.mark.parametrize(("format_version", "before_image"), [(2, "key"), (3, "key"), (2, "full"), (3, "full")])
def test_the_ingester_s_older_spec_partitions_and_global_deletes_join_the_current_spec(
    spark, stack_config, unique, format_version, before_image
):
    config = orders_of_format(compactor_config(stack_config, unique, settle=SETTLED), format_version)
    # Key-only before-images: updates and deletes are global deletes. Full ones: partitioned
    # deletes before the spec change; after it, while the old spec's files are live, the
    # restarted ingester writes global deletes, since a partitioned one reaches its own spec only.
    table = TableConfig.model_validate({**config.tables[0].model_dump(by_alias=True), "before_image": before_image})
    config = config.model_copy(update={"tables": [table]})
    name = qualified(config)
    with batch_writer(spark, config) as write:
        spark.sql(f"ALTER TABLE {name} WRITE ORDERED BY id")
        stream = Stream(spark, config, write)
        src = stream.source
        src.key_only_before = before_image == "key"
        for n in range(2):
            stream([src.upsert(k, REGIONS[k % 3], 100 * k + n, k % 2) for k in reversed(range(n, 60, 2))])
        stream([src.upsert(k, REGIONS[k % 3], 7 * k, k % 2) for k in range(0, 60, 5)] + [src.delete(k) for k in (3, 13, 23)])
    spark.sql(f"ALTER TABLE {name} ADD PARTITION FIELD bucket(4, id)")
    # The ingester restarted with the table's new partitioning in its config: it reads the new spec.
    partition_by = [*table.partition_by, "bucket(4, id)"]
    table = TableConfig.model_validate({**table.model_dump(by_alias=True), "partition_by": partition_by})
    config = config.model_copy(update={"tables": [table]})
    with batch_writer(spark, config) as write:
        assert write.layouts[table.name].older_spec_data, "it found the old spec's data files"
        stream.write = write
        stream([src.upsert(k, REGIONS[(k + 1) % 3], 9 * k, 1) for k in range(0, 60, 3)] + [src.delete(k) for k in (1, 5, 33)])
        stream([src.upsert(k, REGIONS[k % 3], 11 * k, 0) for k in range(60, 80)])
        before = live_files_by_spec(spark, name)
        assert before.get((0, 2)), f"no equality delete of the old spec: {before}"
        events = compact_until_done(create_sidecar(config, spark))

    assert_joined_the_current_spec(spark, config, before, events)
    assert table_rows(spark, name) == src.expected_rows()


def test_an_ingester_running_across_a_spec_change_stops_before_it_commits_the_old_spec(spark, stack_config, unique):
    # Its deletes would stay in the old spec, which the sidecar rewrites away: it stops instead,
    # and the batch, not committed, is written again in the new spec once it starts again.
    config = compactor_config(stack_config, unique, settle=SETTLED)
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        stream([src.upsert(k, REGIONS[k % 3], k, 0) for k in range(30)])
        spark.sql(f"ALTER TABLE {name} ADD PARTITION FIELD bucket(4, id)")
        snapshots = spark.sql(f"SELECT count(*) FROM {name}.snapshots").first()[0]
        pending = [src.upsert(k, REGIONS[(k + 1) % 3], 2 * k, 1) for k in range(0, 30, 2)]
        with pytest.raises(PartitionSpecChanged, match="partition spec changed from 0 to "):
            stream(pending)
        spark.sql(f"REFRESH TABLE {name}")
        assert spark.sql(f"SELECT count(*) FROM {name}.snapshots").first()[0] == snapshots, "nothing committed"
    # Started again with the table's new partitioning in its config.
    table = config.tables[0]
    table = TableConfig.model_validate(
        {**table.model_dump(by_alias=True), "partition_by": [*table.partition_by, "bucket(4, id)"]}
    )
    config = config.model_copy(update={"tables": [table]})
    with batch_writer(spark, config) as write:
        stream.write = write
        layout = write.layouts[config.tables[0].name]
        assert layout.older_spec_data
        stream(pending)  # at the same offsets: the failed call did not move them
    assert table_rows(spark, name) == src.expected_rows()
    deletes = live_files_by_spec(spark, name)
    assert deletes.get((layout.global_spec_id, 2)) and not deletes.get((layout.spec_id, 2)), "its deletes global"
