"""The coordinator against the real stack: compactor replicas as separate processes sharing one
consumer group on the embedded broker, a writer committing to the same table from this process,
and the table checked against the independent CDC model (tests/cdc.py)."""

from __future__ import annotations

import calendar
import itertools
import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import TopicPartition

from icecdc.compactor.metadata import load_table_partitions
from icecdc.compactor.plans import plan_rewrite
from icecdc.compactor.policy import Work
from icecdc.coordinator.maintenance import TableMaintenance
from icecdc.domain import summary as summary_keys
from icecdc.domain.errors import CommitConflict
from icecdc.domain.events import CompactionEvent, CompactionOutcome, MaintenanceEvent, MaintenanceKind, MaintenanceOutcome
from icecdc.ingest.offsets import committed_offsets
from icecdc.ingest.records import records_to_dataframe
from icecdc.jvm import actions
from icecdc.jvm.actions import ManifestFacts
from icecdc.jvm.bridge import JavaBridge
from icecdc.jvm.tables import IcebergTable
from icecdc.runtime import kafka
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config, MaintenanceConfig
from tests.cdc import REGIONS, SourceDatabase, kafka_records, table_rows
from tests.integration.test_compactor import (
    EQUALITY_DELETES,
    Stream,
    assert_compactions_kept_rows,
    compaction_of,
    compactor_config,
    partition_files,
)
from tests.integration.test_ingest_writer import batch_writer, qualified
from tests.processes import is_stopped, start_icecdc, write_config

SESSION_SECONDS = 6.0
MAX_BATCHES = 150
# Rotating partitions: a batch writes one of them (and the hot one), so each settles in turn.
PARTITIONS = [(region, day) for region in ("eu", "us", "apac") for day in range(4)]
HOT = ("eu", 9)


def coordinated_config(
    stack_config: Config, unique: str, replica: str | None = None, maintenance: dict | None = None, **compactor: Any
) -> Config:
    settings = {
        "reconcile_seconds": 5,
        "settle": {"cadence_multiple": 3, "min_seconds": 1, "initial_seconds": 2, "max_seconds": 4},
        **compactor,
    }
    base = compactor_config(stack_config, unique, **settings)
    data = base.model_dump(by_alias=True)
    data["maintenance_topic"] = f"maintenance-{unique}"
    data["compactor"]["http"] = {"port": None}  # several replicas on one host
    data["coordinator"] = {
        "lease_topic": f"leases-{unique}",
        "lease_slots": 32,
        "session_timeout_seconds": SESSION_SECONDS,
        "maintenance": maintenance or {"enabled": False},
    }
    if replica is not None:
        data["compactor"]["replica_id"] = replica
    return Config.model_validate(data)


# Iceberg's own default, as on a table icecdc did not create: the writer's commits merge no
# manifests before 100 pile up, so maintenance has small manifests to merge.
ICEBERG_MANIFEST_MERGING = {"commit.manifest.min-count-to-merge": "100"}


def with_table_properties(config: Config, properties: dict[str, str]) -> Config:
    data = config.model_dump(by_alias=True)
    data["tables"][0]["properties"] = {**data["tables"][0]["properties"], **properties}
    return Config.model_validate(data)


def replica(config: Config, name: str, tmp_path: Path, failpoint: str | None = None) -> subprocess.Popen:
    data = config.model_dump(by_alias=True)
    data["compactor"]["replica_id"] = name
    path = write_config(Config.model_validate(data), tmp_path / f"{name}.yaml")
    return start_icecdc(
        "--log-format", "json", "compact", "--config", str(path), log=tmp_path / f"{name}.log", failpoint=failpoint
    )


def read_all(config: Config, topic: str, idle: float = 2.0) -> list[bytes]:
    consumer = kafka.consumer(config.kafka, f"reader-{time.monotonic_ns()}")
    consumer.assign([TopicPartition(topic, 0, 0)])
    values, last = [], time.monotonic()
    while time.monotonic() - last < idle:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            values.append(message.value())
            last = time.monotonic()
    consumer.close()
    return values


def compaction_events(config: Config) -> list[CompactionEvent]:
    return [CompactionEvent.from_json(v) for v in read_all(config, config.compaction_topic)]


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def assert_no_concurrent_compactions(events: list[CompactionEvent], ended_at: dict[str, float]) -> None:
    """Per partition, each compaction's interval (start to final event; to the replica's death
    when it never reported one) ends before the next one starts."""
    intervals: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    open_runs: dict[tuple[str, str], float] = {}
    for event in events:
        key = (event.replica, event.partition_path)
        if event.outcome is CompactionOutcome.STARTED:
            open_runs[key] = event.started_ms / 1000
        elif key in open_runs:
            intervals[event.partition_path].append((open_runs.pop(key), event.finished_ms / 1000, event.replica))
    for (name, path), start in open_runs.items():
        intervals[path].append((start, ended_at[name], name))
    for path, runs in intervals.items():
        runs.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(runs):
            assert start >= end, f"{path}: {first} until {end}, {second} from {start}"


def iceberg_table(spark, config: Config) -> IcebergTable:
    table = IcebergTable(JavaBridge(spark), config.table_ref(config.tables[0]))
    table.refresh()
    return table


def assert_snapshot_log_is_sequential(spark, config: Config) -> None:
    """In the snapshot log, each compaction of a partition started from a snapshot at or after
    the previous compaction of that partition committed."""
    snapshots = list(reversed(list(iceberg_table(spark, config).history())))
    sequence = {s.snapshot_id: s.sequence_number for s in snapshots}
    last: dict[str, int] = {}
    for snapshot in snapshots:
        summary = snapshot.summary
        if summary.get("icecdc.compaction") is None:
            continue
        start = int(summary["icecdc.starting-snapshot-id"])
        # A job of several partitions lists them all (icecdc.partitions, a JSON array).
        partitions = (
            orjson.loads(summary["icecdc.partitions"]) if "icecdc.partitions" in summary else [summary["icecdc.partition"]]
        )
        for partition in partitions:
            if start in sequence and partition in last:
                assert sequence[start] >= last[partition], (
                    f"{partition}: compaction {snapshot.snapshot_id} overlapped the previous one"
                )
            last[partition] = snapshot.sequence_number
    assert last, "no compaction in the snapshot log"


def slot_log(log: Path) -> list[tuple[float, int]]:
    """(time, slots held) for each assignment a replica logged."""
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and (match := re.search(r"holds (\d+) of \d+ slots", line)):
            stamp = orjson.loads(line)["ts"]
            out.append(
                (calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + float(stamp[19:-1]), int(match.group(1)))
            )
    return out


def committed_compactions(log: Path) -> int:
    """How many compactions a replica has logged as committed (its JSON log)."""
    if not log.exists():
        return 0
    return sum(
        1
        for line in log.read_text().splitlines()
        if line.startswith("{") and '"logger":"icecdc.compactor.compaction_runner"' in line and '"outcome":"committed"' in line
    )


def rotating_writes(stream: Stream, n: int) -> list:
    src = stream.source
    region, day = PARTITIONS[n % len(PARTITIONS)]
    index = n % len(PARTITIONS)
    changes = [src.upsert(k, region, 100 * n + k, day) for k in range(index, 400, len(PARTITIONS)) if k // 12 % 3 != n % 3]
    changes += [src.delete(k) for k in range(index, 400, len(PARTITIONS) * 7) if k in src.rows and n % 4 == 0]
    changes += [src.upsert(k, HOT[0], n, HOT[1]) for k in range(1000 + n % 5, 1040, 5)]
    return changes


def initial_rows(stream: Stream) -> list:
    src = stream.source
    rows = []
    for k in range(400):
        region, day = PARTITIONS[k % len(PARTITIONS)]
        rows.append(src.upsert(k, region, k, day))
    return rows + [src.upsert(k, HOT[0], k, HOT[1]) for k in range(1000, 1040)]


@pytest.mark.slow
def test_two_replicas_share_partitions_and_one_takes_over_when_the_other_dies(spark, stack_config, unique, tmp_path):
    # Manifests checked as often as snapshots, so that both kinds of maintenance commit within the
    # test's two rounds of writes whatever their length; and left to the maintenance to merge:
    # the replicas' own commits would merge them first (``compactor.merge_manifests``).
    maintenance = {"interval_seconds": 10, "snapshot_retention_seconds": 30, "manifest_interval_seconds": 10}
    config = with_table_properties(
        coordinated_config(stack_config, unique, maintenance=maintenance, merge_manifests=False), ICEBERG_MANIFEST_MERGING
    )
    name = qualified(config)
    replicas: dict[str, subprocess.Popen] = {}
    ended: dict[str, float] = {}
    try:
        with batch_writer(spark, config) as write:
            stream = Stream(spark, config, write)
            stream(initial_rows(stream))
            replicas = {"a": replica(config, "a", tmp_path), "b": replica(config, "b", tmp_path)}
            wait_for(
                lambda: all(slot_log(tmp_path / f"{r}.log") and slot_log(tmp_path / f"{r}.log")[-1][1] == 16 for r in "ab"),
                60,
                "both replicas to hold half the slots",
            )
            # a dies once it has committed work of its own (on a loaded machine that takes more
            # batches than on an idle one) and the writer has gone round every partition once;
            # then the writer goes round them once more, so each partition a held takes a write
            # after its death and must be answered by b.
            killed_after = None
            for n in itertools.count(1):
                stream(rotating_writes(stream, n))  # a writer failure raises here
                if killed_after is None and n >= len(PARTITIONS) and committed_compactions(tmp_path / "a.log"):
                    assert replicas["a"].poll() is None, (tmp_path / "a.log").read_text()[-3000:]
                    replicas["a"].kill()
                    replicas["a"].wait()
                    ended["a"] = killed = time.time()
                    killed_after = n
                if killed_after is not None and n >= killed_after + len(PARTITIONS):
                    break
                assert n < MAX_BATCHES, f"replica a committed no compaction in {MAX_BATCHES} batches"
                time.sleep(0.3)
        # Writes stopped: every partition settles, and b (alone now) merges every delete.
        wait_for(
            lambda: (
                not partition_files(spark, name, "eu")[EQUALITY_DELETES]
                and not any(partition_files(spark, name, r)[EQUALITY_DELETES] for r in ("us", "apac"))
            ),
            180,
            "all deletes merged",
        )
    finally:
        for process in replicas.values():
            stop(process)
    ended["b"] = time.time()
    assert replicas["b"].returncode == 0, (tmp_path / "b.log").read_text()[-3000:]  # SIGTERM: a clean stop

    events = compaction_events(config)
    committed = [e for e in events if e.outcome is CompactionOutcome.COMMITTED]
    by_replica = {r: [e for e in committed if e.replica == r] for r in "ab"}
    assert by_replica["a"] and by_replica["b"], "both replicas did work"
    assert not [e for e in events if e.outcome is CompactionOutcome.FAILED], events
    a_partitions = {e.partition_path for e in by_replica["a"]}
    taken_over = [e for e in by_replica["b"] if e.partition_path in a_partitions and e.started_ms / 1000 > killed]
    assert taken_over, "b compacted the partitions a held once a was gone"
    # The bound (docs/coordinator.md): the session timeout, plus the compaction or maintenance run
    # b had in flight (a replica joins a rebalance between two pieces of work), plus one rebalance.
    evicted = killed + SESSION_SECONDS
    maintenance = [MaintenanceEvent.from_json(v) for v in read_all(config, config.maintenance_topic)]
    busy_until = max(
        [
            e.finished_ms / 1000
            for e in [*events, *maintenance]
            if e.replica == "b" and e.outcome != "started" and e.started_ms / 1000 < evicted + 2 and e.finished_ms / 1000 > killed
        ]
        or [evicted]
    )
    takeover = next(t for t, slots in slot_log(tmp_path / "b.log") if slots == 32 and t > killed - 1)
    assert takeover <= max(busy_until, evicted) + SESSION_SECONDS + 4, (takeover - killed, busy_until - killed)

    assert_no_concurrent_compactions(events, ended)
    spark.sql(f"REFRESH TABLE {name}")
    assert_snapshot_log_is_sequential(spark, config)
    # (time travel across the compactions whose snapshots maintenance has not expired yet)
    parents = {r.snapshot_id: r.parent_id for r in spark.sql(f"SELECT snapshot_id, parent_id FROM {name}.snapshots").collect()}
    assert_compactions_kept_rows(spark, name, [e for e in committed if parents.get(e.snapshot_id) in parents])
    assert table_rows(spark, name) == stream.source.expected_rows()
    assert any(e.kind is MaintenanceKind.EXPIRE and e.outcome is MaintenanceOutcome.COMMITTED for e in maintenance), maintenance
    assert any(e.kind is MaintenanceKind.MANIFESTS and e.outcome is MaintenanceOutcome.COMMITTED for e in maintenance), (
        maintenance
    )


def table_files(spark, name: str) -> set[str]:
    """Every file any snapshot of the table references."""
    return {r.file_path.removeprefix("file:") for r in spark.sql(f"SELECT file_path FROM {name}.all_files").collect()}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("failpoint", "outcome"),
    [
        ("compactor-before-commit", "fenced"),  # frozen before its lease check: the broker refuses it
        ("compactor-after-lease-check", "conflict"),  # frozen after it: Iceberg's validation refuses it
    ],
)
def test_a_frozen_replica_cannot_commit_after_the_others_took_over(spark, stack_config, unique, tmp_path, failpoint, outcome):
    config = coordinated_config(stack_config, unique, settle={"min_seconds": 0, "initial_seconds": 0})
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        stream([src.upsert(k, "eu", k, 0) for k in range(1, 80)])
        for n in range(1, 4):
            stream([src.upsert(k, "eu", 10 * k + n, 0) for k in range(n, 80, 3)] + [src.delete(70 + n)])
    expected = src.expected_rows()
    a = b = None
    try:
        a = replica(config, "a", tmp_path, failpoint=f"{failpoint}:1:stop")
        wait_for(lambda: is_stopped(a), 90, "replica a to freeze mid-compaction")
        b = replica(config, "b", tmp_path)
        # b waits out a's session, takes every slot, and compacts the partition a was compacting.
        wait_for(
            lambda: any(e.replica == "b" and e.outcome is CompactionOutcome.COMMITTED for e in compaction_events(config)),
            90,
            "replica b to compact the partition",
        )
        a.send_signal(signal.SIGCONT)
        a_events = wait_for(
            lambda: [e for e in compaction_events(config) if e.replica == "a" and e.outcome is not CompactionOutcome.STARTED],
            60,
            "replica a's late outcome",
        )
    finally:
        for process in (a, b):
            if process is not None:
                stop(process)

    assert [e.outcome.value for e in a_events][:1] == [outcome], a_events
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == expected
    compactions = [r for r in spark.sql(f"SELECT summary FROM {name}.snapshots").collect() if "icecdc.compaction" in r.summary]
    assert [r.summary["icecdc.compactor"] for r in compactions] == ["b"]
    # a deleted what it wrote: no file under the table that no snapshot references.
    data_dir = Path(spark.sql(f"SELECT file_path FROM {name}.files LIMIT 1").first().file_path.removeprefix("file:")).parents[2]
    on_disk = {str(p) for p in data_dir.rglob("*.parquet")}
    assert on_disk <= table_files(spark, name), on_disk - table_files(spark, name)


def test_maintenance_during_a_compaction_spares_it_and_exactly_once_recovery(spark, stack_config, unique):
    config = coordinated_config(stack_config, unique)
    table_config = config.tables[0]
    name = qualified(config)
    # Retention 0 expires everything it may: only what the coordinator protects survives.
    settings = MaintenanceConfig(snapshot_retention_seconds=0, retain_last=1, orphan_age_seconds=3600)
    sent: list = []
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source

        def batch(pairs: list) -> None:
            sent.extend(pairs)
            stream(pairs)

        batch([src.upsert(k, "eu", k, 0) for k in range(1, 60)])
        for n in range(1, 4):
            batch([src.upsert(k, "eu", 10 * k + n, 0) for k in range(n, 60, 4)])
        loaded = load_table_partitions(pyiceberg_catalog(config), config.table_ref(table_config), table_config, config.compactor)
        assert loaded is not None
        [(path, partition)] = loaded.partitions.items()
        key = tuple(partition.partition[t.name] for t in loaded.layout.partition)
        # An orphan older than the safe age: a batch's file from a crash two days ago.
        orphan = Path(loaded.layout.data_location) / path / "crashed-batch.parquet"
        orphan.write_bytes(b"PAR1")
        os.utime(orphan, (time.time() - 2 * 86400,) * 2)

        compaction = compaction_of(spark, config, loaded.layout, key, 1 << 20)
        plan = plan_rewrite(compaction.files(), Work.DELETE_MERGE, config.compactor)
        starting_snapshot = compaction.starting_snapshot.snapshot_id
        maintenance = TableMaintenance(iceberg_table(spark, config), {})
        results = []

        def commit_during_maintenance(attempt):
            # The writer goes on (the compaction's starting snapshot is no longer current nor the
            # newest offsets snapshot), then maintenance runs, then the compaction commits.
            batch([src.upsert(k, "eu", 7, 0) for k in range(1, 60, 9)] + [src.delete(58)])
            now_ms = int(time.time() * 1000)
            results.append(maintenance.expire(now_ms, settings, [starting_snapshot]))
            results.append(maintenance.remove_orphans(now_ms, settings))
            return attempt()

        result = compaction.run(plan, {"icecdc.compactor": "test"}, commit_during_maintenance)
    expired, orphans = results
    assert expired.snapshots_expired >= 3 and starting_snapshot in expired.protected_snapshot_ids
    assert orphans.files_deleted == 1 and not orphan.exists()
    assert result.committed is not None  # expiry spared its starting snapshot
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == src.expected_rows()
    assert all(Path(f).exists() for f in table_files(spark, name))  # nothing live was removed

    # Without the protection the same compaction would have failed: shown on a second one.
    with batch_writer(spark, config) as write:
        stream.write = write
        batch([src.upsert(k, "eu", 11, 0) for k in range(2, 60, 5)])
        late = compaction_of(spark, config, loaded.layout, key, 1 << 20)
        late_plan = plan_rewrite(late.files(), Work.DELETE_MERGE, config.compactor)
        batch([src.upsert(k, "eu", 12, 0) for k in range(3, 60, 5)])
        batch([src.upsert(k, "eu", 13, 0) for k in range(4, 60, 5)])
        maintenance.expire(int(time.time() * 1000), settings, [])
        with pytest.raises(CommitConflict):
            late.run(late_plan, {})

        # The ingester still recovers exactly once: its offsets survived expiry, so a replay of
        # the whole source commits nothing, and new records apply once.
        assert committed_offsets(iceberg_table(spark, config).summaries_back_to(summary_keys.OFFSETS)) == {
            table_config.topic: {0: len(sent)}
        }
        snapshots = len(spark.sql(f"SELECT * FROM {name}.snapshots").collect())
        write(records_to_dataframe(spark, kafka_records(table_config.topic, sent, 0)), 1000)
        spark.sql(f"REFRESH TABLE {name}")
        assert len(spark.sql(f"SELECT * FROM {name}.snapshots").collect()) == snapshots
        batch([src.delete(3), src.upsert(4, "us", 1, 1)])
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == src.expected_rows()


def test_manifest_rewrite_merges_only_small_manifests(spark, stack_config, unique):
    """Each writer commit adds a data and a delete manifest; past ``max_small_manifests`` small
    ones the maintenance merges the small data manifests (in process), the small delete manifests
    only when they alone are past the bound (by the Spark action), leaves the large ones alone,
    and the rows stay the same."""
    config = with_table_properties(coordinated_config(stack_config, unique), ICEBERG_MANIFEST_MERGING)
    name = qualified(config)
    with batch_writer(spark, config) as write:
        stream = Stream(spark, config, write)
        src = stream.source
        stream([src.upsert(k, REGIONS[k % 3], k, 0) for k in range(1, 400)])
        for n in range(1, 9):
            stream([src.upsert(k, REGIONS[k % 3], 10 * k + n, n % 2) for k in range(n, 400, 9)] + [src.delete(400 - n)])

    def manifests() -> dict[str, ManifestFacts]:
        return {m.path: m for m in actions.current_manifests(iceberg_table(spark, config))}

    before = manifests()
    lengths = sorted(m.length for m in before.values())
    # A target size that makes the biggest quarter of the manifests "large" for this test.
    target = lengths[len(lengths) * 3 // 4] * 2
    spark.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('commit.manifest.target-size-bytes' = '{target}')")
    large = {path for path, m in before.items() if m.length >= target // 2}
    small_data = {path for path, m in before.items() if path not in large and not m.deletes}
    small_deletes = {path for path, m in before.items() if path not in large and m.deletes}
    assert large and len(small_data) >= 3 and len(small_deletes) >= 3, before
    small = len(small_data) + len(small_deletes)
    maintenance = TableMaintenance(iceberg_table(spark, config), {"icecdc.compactor": "test"})
    assert not maintenance.worth_running(MaintenanceKind.MANIFESTS, 0, MaintenanceConfig(max_small_manifests=small))
    assert not maintenance.rewrite_manifests(MaintenanceConfig(max_small_manifests=small)).committed

    # Past the bound, but the delete manifests alone are not: only the data manifests merge.
    result = maintenance.rewrite_manifests(MaintenanceConfig(max_small_manifests=len(small_deletes)))
    after = manifests()
    assert result.committed and result.manifests_rewritten == len(small_data), result
    assert not small_data & after.keys() and (large | small_deletes) <= after.keys()
    current = iceberg_table(spark, config).current_snapshot()
    assert current is not None and current.summary["icecdc.compactor"] == "test"
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == src.expected_rows()

    # The delete manifests alone past the bound: they merge too.
    result = maintenance.rewrite_manifests(MaintenanceConfig(max_small_manifests=len(small_deletes) - 1))
    final = manifests()
    assert result.committed and result.manifests_rewritten >= len(small_deletes), result
    assert not small_deletes & final.keys() and large <= final.keys()
    assert len(final) < len(after) < len(before)
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == src.expected_rows()


@pytest.mark.slow
def test_soak_ingester_compactor_and_maintenance_together(spark, stack_config, unique, tmp_path):
    """A bounded soak: the ingester and one compactor replica (with maintenance every 10 s) as
    processes, fed 80 rounds of inserts, updates and deletes on a hot day and late changes to
    older days."""
    interval, retention = 10, 20
    config = coordinated_config(
        stack_config,
        unique,
        maintenance={
            "interval_seconds": interval,
            "snapshot_retention_seconds": retention,
            "manifest_interval_seconds": interval,
            "max_small_manifests": 8,
        },
        merge_manifests=False,
    )
    # Iceberg's own manifest merging, as on a table icecdc did not create, and the compactor's
    # commits merging none (``compactor.merge_manifests``): the maintenance merges.
    data = with_table_properties(config, ICEBERG_MANIFEST_MERGING).model_dump(by_alias=True)
    data["ingest"] = {"source": "direct", "min_commit_interval_seconds": 0.5, "max_batch_records": 500, "http": {"port": None}}
    config = Config.model_validate(data)
    table = config.tables[0]
    name = qualified(config)
    kafka.ensure_topics(config.kafka, [table.topic])
    path = write_config(config, tmp_path / "soak.yaml")
    src = SourceDatabase()
    producer = kafka.producer(config.kafka)

    def send(pairs: list) -> None:
        for key, value in pairs:
            producer.produce(table.topic, key=key, value=value)
        producer.flush(30)

    send([src.upsert(k, REGIONS[k % 3], k, k % 5) for k in range(500)])
    compactor = start_icecdc("--log-format", "json", "compact", "--config", str(path), log=tmp_path / "compactor.log")
    ingester = start_icecdc(
        "--log-format", "json", "ingest", "--config", str(path), "--until-idle", "8", log=tmp_path / "ingest.log"
    )
    try:
        for n in range(1, 81):
            hot = [src.upsert(k, REGIONS[k % 3], n * 100 + k, 5) for k in range(500 + n % 7, 700, 7)]  # today
            late = [src.upsert(k, REGIONS[k % 3], n, k % 5) for k in range(n % 25, 500, 25) if k in src.rows and k % 5 == n % 5]
            gone = [src.delete(k) for k in range(n % 50, 500, 97) if k in src.rows]
            send(hot + late + gone)
            time.sleep(0.4)
        assert ingester.wait(240) == 0, (tmp_path / "ingest.log").read_text()[-3000:]
        # Everything has settled: the compactor merges every delete.
        wait_for(
            lambda: not spark.sql(f"SELECT 1 FROM {name}.files WHERE content != 0").collect(),
            180,
            "every partition to settle and lose its delete files",
        )

        def expired() -> bool:
            events = [MaintenanceEvent.from_json(v) for v in read_all(config, config.maintenance_topic)]
            return any(e.kind is MaintenanceKind.EXPIRE and e.outcome is MaintenanceOutcome.COMMITTED for e in events)

        # A fast machine may feed and settle the soak before any snapshot is older than the
        # retention; the rounds after it expire them (a round's other work may take a while).
        wait_for(expired, retention + 3 * interval + 120, "a snapshot expiry to commit")
    finally:
        stop(ingester)
        stop(compactor)
    assert compactor.returncode == 0, (tmp_path / "compactor.log").read_text()[-3000:]
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == src.expected_rows()
    ingest_log = (tmp_path / "ingest.log").read_text()
    assert '"level":"error"' not in ingest_log and "Traceback" not in ingest_log  # zero writer commit failures
    events = compaction_events(config)
    assert sum(e.outcome is CompactionOutcome.COMMITTED for e in events) >= 5
    assert not [e for e in events if e.outcome is CompactionOutcome.FAILED]
    maintenance = [MaintenanceEvent.from_json(v) for v in read_all(config, config.maintenance_topic)]
    assert any(e.kind is MaintenanceKind.EXPIRE and e.outcome is MaintenanceOutcome.COMMITTED for e in maintenance), maintenance
    assert any(e.kind is MaintenanceKind.MANIFESTS and e.outcome is MaintenanceOutcome.COMMITTED for e in maintenance), (
        maintenance
    )
    assert not [e for e in maintenance if e.outcome is MaintenanceOutcome.FAILED], maintenance
    # The orphan listing (first due one interval after start) ran beside the loop and ended.
    assert any(e.kind is MaintenanceKind.ORPHANS and e.outcome is not MaintenanceOutcome.STARTED for e in maintenance), (
        maintenance
    )
