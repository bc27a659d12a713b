"""Sources without full before-images on the real stack: PostgreSQL's REPLICA IDENTITY DEFAULT
(updates without a before-image, deletes whose before-image has the key and fallback values),
on tables partitioned by what the key does not determine. Updates and deletes then delete their
key in every partition (global equality deletes), and the compactor resolves those into
partition-scoped position deletes. Checked against the independent model of the rows
(tests/cdc.py), at every writer snapshot and across every resolution (time travel)."""

from __future__ import annotations

import time

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, example, given, settings

from icecdc.compactor.plans import plan_hot, plan_resolution
from icecdc.compactor.rewrite import Committer, CompactionResult
from icecdc.compactor.sidecar import create_sidecar
from icecdc.compactor.tracker import GLOBAL_DELETES_PATH
from icecdc.domain.events import CompactionOutcome
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import IcebergTable
from icecdc.runtime.config import Config, TableConfig
from tests.cdc import REGIONS, SourceDatabase, changes, orders_table, table_rows
from tests.histories import History, rows_at, run_history
from tests.integration.test_compactor import (
    EQUALITY_DELETES,
    Stream,
    compaction_of,
    compactor_config,
    running,
    table_metadata,
    until_answered,
)
from tests.integration.test_ingest_writer import batch_writer, qualified

KB = 1024


def key_only_table(config: Config, partition_by: list[str], **options: str) -> Config:
    """The test's orders table with the source's default before-images (the key only)."""
    table = config.tables[0]
    spec = {**orders_table(table.name, table.topic), "partition_by": partition_by, **options}
    del spec["before_image"]  # the default: never silently wrong
    return config.model_copy(update={"tables": [TableConfig.model_validate(spec)]})


def global_delete_files(spark, config: Config) -> int:
    """Live equality-delete files under the table's unpartitioned spec."""
    spec = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0])).unpartitioned_spec_id()
    if spec is None:
        return 0
    name = qualified(config)
    spark.sql(f"REFRESH TABLE {name}")
    query = f"SELECT count(*) FROM {name}.delete_files WHERE content = {EQUALITY_DELETES} AND spec_id = {spec}"
    return int(spark.sql(query).first()[0])


def moving_changes(source: SourceDatabase, n: int) -> list:
    """Updates that move rows to another region and day, deletes, and inserts."""
    changes = [source.upsert(k, REGIONS[(k + n) % 3], 100 * n + k, (k + n) % 3) for k in range(n % 4, 60, 4) if k in source.rows]
    changes += [source.delete(k) for k in range(n % 7, 60, 11) if k in source.rows]
    changes += [source.upsert(k, REGIONS[k % 3], k, n % 3) for k in range(60 + 3 * n, 63 + 3 * n)]
    return changes


@pytest.mark.slow
@pytest.mark.parametrize("partition_by", [["region"], ["days(updated_at)"]], ids=["region", "days"])
def test_key_only_before_images_stay_exact_and_the_compactor_resolves_their_global_deletes(
    spark, stack_config, unique, partition_by
):
    settle = {"cadence_multiple": 3, "min_seconds": 1, "initial_seconds": 2, "max_seconds": 4}
    config = key_only_table(compactor_config(stack_config, unique, target_file_size_bytes=256 * KB, settle=settle), partition_by)
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        stream.source = source = SourceDatabase(key_only_before=True)
        stream([source.upsert(k, REGIONS[k % 3], k, k % 3) for k in range(60)])
        with running(create_sidecar(config, spark), 120) as sidecar:
            for n in range(1, 13):
                stream(moving_changes(source, n))  # a writer failure raises here
                assert table_rows(spark, name) == source.expected_rows(), f"after batch {n}"
            assert write.stats.dead_letters == 0

            def resolved_and_settled() -> None:
                until_answered(sidecar, write, 180, lambda: global_delete_files(spark, config) == 0)

            # The sidecar resolves the last batches' global deletes and settles the partitions.
            resolved_and_settled()
            # Then key-only deletes alone: a global delete, and no write to any partition, all of
            # them settled and merged. Its resolution's position deletes must not stay.
            stream([source.delete(k) for k in sorted(source.rows)[:6]])
            resolved_and_settled()
    events = sidecar.stats.results
    resolutions = [e for e in events if e.kind == "resolve-global-deletes" and e.outcome is CompactionOutcome.COMMITTED]
    assert resolutions, events
    assert all(e.partition_path == GLOBAL_DELETES_PATH for e in resolutions)
    assert not [e for e in events if e.outcome is CompactionOutcome.FAILED], events
    spark.sql(f"REFRESH TABLE {name}")
    assert global_delete_files(spark, config) == 0
    assert table_rows(spark, name) == source.expected_rows()
    # A resolution counts as a write of the partitions it gave position deletes, so those that had
    # settled and been merged were merged again once settled: every partition (all small) ends
    # with no delete file at all.
    assert int(spark.sql(f"SELECT count(*) FROM {name}.delete_files").first()[0]) == 0
    for resolution in resolutions:  # each one kept exactly its parent's rows
        parent = spark.sql(f"SELECT parent_id FROM {name}.snapshots WHERE snapshot_id = {resolution.snapshot_id}").first()
        assert rows_at(spark, name, resolution.snapshot_id) == rows_at(spark, name, parent.parent_id), resolution


def test_global_deletes_can_be_dead_lettered_or_taken_in_place_instead(spark, stack_config, unique):
    config = key_only_table(compactor_config(stack_config, unique), ["region"], unknown_partition="dead-letter")
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        stream.source = source = SourceDatabase(key_only_before=True)
        stream([source.upsert(k, REGIONS[k % 3], k, 0) for k in range(10)])
        kept = dict(source.rows)
        stream([source.upsert(1, "us", 5, 0), source.delete(2)])
    assert write.stats.dead_letters_by_reason == {"missing-partition-value": 2}
    assert global_delete_files(spark, config) == 0
    # Both changes were set aside, nothing already committed was touched.
    expected = SourceDatabase(rows=kept).expected_rows()
    assert table_rows(spark, name) == expected


# One micro-batch of a key-only source.
batch = changes(keys=24, days=3, max_size=16)
# After a batch: maybe a resolution of the global deletes or a hot conversion of a partition, with
# maybe a writer batch committing while it runs.
maintenance = st.tuples(
    st.tuples(st.sampled_from(["resolve", "resolve", "convert"]), st.sampled_from(REGIONS)), st.one_of(st.none(), batch)
)
history = st.lists(st.tuples(batch, st.one_of(st.none(), maintenance)), min_size=3, max_size=6)


def maintain(history: History, chosen: tuple[str, str], commit: Committer) -> list[CompactionResult]:
    """A resolution of the table's global deletes, or a hot partition's plan for a partition of
    the region, from the files at the current snapshot."""
    kind, region = chosen
    config = history.config
    spark, target = history.stream.spark, config.compactor.target_file_size_bytes
    loaded = table_metadata(config)
    if kind == "resolve":
        compaction = compaction_of(spark, config, loaded.layout, None, target, history.key_index)
    else:
        key = next((p.partition for p in loaded.partitions.values() if p.partition.get("region") == region), None)
        if key is None:
            return []
        partition = tuple(key[t.name] for t in loaded.layout.partition)
        compaction = compaction_of(spark, config, loaded.layout, partition, target, history.key_index)
    files = compaction.files()
    if files is None:
        return []
    chosen_plan = plan_resolution(files) if kind == "resolve" else plan_hot(files, config.compactor)
    return [compaction.run(chosen_plan, {"icecdc.compactor": "property-test"}, commit=commit)]


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=history, format_version=st.sampled_from([2, 3]))
# A resolution while a writer batch adds global deletes for keys it is converting.
@example(
    steps=[([(2, "us", 0, 1)], (("resolve", "eu"), [(2, "eu", 1, 2), (3, None, 0, 0)])), ([(2, None, 0, 0)], None)],
    format_version=2,
)
@example(
    steps=[([(5, "us", 1, 1)], (("convert", "us"), None)), ([(5, "eu", 0, 3)], (("resolve", "eu"), [(5, "apac", 2, 4)]))],
    format_version=3,
)
def test_random_histories_with_resolutions_between_and_during_commits_keep_every_row(spark, stack_config, steps, format_version):
    unique = f"glob{time.monotonic_ns()}"
    base = compactor_config(stack_config, unique, target_file_size_bytes=64 * KB, hot_read_budget=2)
    config = key_only_table(base, ["region", "days(updated_at)"], format_version=format_version)  # type: ignore[arg-type]
    initial = [(k, REGIONS[k % 3], k % 3, k) for k in range(1, 25)]
    run_history(spark, config, initial, steps, maintain, SourceDatabase(key_only_before=True))


def test_icebergs_remove_dangling_deletes_drops_a_live_global_delete_so_resolve_first(spark, stack_config, unique):
    """Iceberg 1.10's ``RemoveDanglingDeletes`` (``rewrite_data_files`` with
    ``remove-dangling-deletes=true``) groups delete files by spec and partition, and a global delete
    lives in the unpartitioned spec, where no data file lives: after a rewrite of one partition it
    takes the global delete for dangling and drops it, and the rows it deleted in the other
    partitions come back. This is why icecdc never runs that action on a table with live global
    deletes (docs/compactor.md), and why they are resolved first: after icecdc's resolution the
    same call is harmless."""
    config = key_only_table(compactor_config(stack_config, unique), ["region"])
    name = qualified(config)
    rewrite_one_partition = (
        f"CALL {config.catalog.name}.system.rewrite_data_files(table => '{config.tables[0].name}', "
        "where => \"region = 'eu'\", options => map('remove-dangling-deletes', 'true', 'rewrite-all', 'true'))"
    )
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        stream.source = source = SourceDatabase(key_only_before=True)
        stream([source.upsert(k, REGIONS[k % 3], k, 0) for k in range(12)])
        snapshot = dict(source.rows)
        stream([source.delete(1), source.delete(2)])  # key-only deletes: a global delete (keys in us, apac)
    assert global_delete_files(spark, config) == 1
    expected = source.expected_rows()
    table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
    before_rewrite = table.current_snapshot().snapshot_id

    spark.sql(rewrite_one_partition)
    spark.sql(f"REFRESH TABLE {name}")
    assert global_delete_files(spark, config) == 0  # dropped while it still applied to us and apac
    assert table_rows(spark, name) == SourceDatabase(rows=snapshot).expected_rows()  # rows 1 and 2 are back

    spark.sql(f"CALL {config.catalog.name}.system.rollback_to_snapshot('{config.tables[0].name}', {before_rewrite})")
    loaded = table_metadata(config)
    resolution = compaction_of(spark, config, loaded.layout, None, config.compactor.target_file_size_bytes)
    files = resolution.files()
    assert files is not None
    committed = resolution.run(plan_resolution(files), {"icecdc.compactor": "test"}).committed
    assert committed is not None
    # To the tracker, the resolution wrote the partitions it deleted rows in, as the writer's
    # deletes would: they are hot again, and judged once they settle.
    resolved_at = committed.timestamp_ms / 1000
    written = {path for path, p in table_metadata(config).partitions.items() if p.last_write == resolved_at}
    assert written == {"region=us", "region=apac"}, written
    spark.sql(rewrite_one_partition)
    spark.sql(f"REFRESH TABLE {name}")
    assert global_delete_files(spark, config) == 0 and table_rows(spark, name) == expected


def test_an_unpartitioned_spec_removed_by_expiry_is_added_again(spark, stack_config, unique):
    """Snapshot expiry with metadata clean-up removes partition specs no live file uses: once the
    global deletes are resolved and their snapshots expired, the writer's next global delete
    finds its spec gone, adds it again and commits."""
    config = key_only_table(compactor_config(stack_config, unique), ["region"])
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        stream.source = source = SourceDatabase(key_only_before=True)
        stream([source.upsert(k, REGIONS[k % 3], k, 0) for k in range(9)])
        stream([source.delete(1)])
        loaded = table_metadata(config)
        resolution = compaction_of(spark, config, loaded.layout, None, config.compactor.target_file_size_bytes)
        files = resolution.files()
        assert files is not None and resolution.run(plan_resolution(files), {"icecdc.compactor": "test"}).committed
        stream([source.upsert(20, "eu", 1, 0)])  # an insert: its manifests no longer list the resolved delete
        table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
        removed = table.unpartitioned_spec_id()
        spark.sql(
            f"CALL {config.catalog.name}.system.expire_snapshots(table => '{config.tables[0].name}', "
            f"older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1, clean_expired_metadata => true)"
        )
        table.refresh()
        assert removed is not None and table.unpartitioned_spec_id() is None
        stream([source.delete(2), source.upsert(3, "us", 7, 1)])  # the writer still names the removed spec
    assert write.stats.dead_letters == 0
    assert IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0])).unpartitioned_spec_id() is not None
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == source.expected_rows()
