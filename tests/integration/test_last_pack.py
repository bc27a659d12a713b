"""The last pack on the real stack: a settled partition whose few small files stay under the minor
compaction's trigger ends packed once nobody has written it for two settle windows. The table is
key-less (mirrored append-only), so no delete ever makes a delete merge pack it first."""

from __future__ import annotations

from collections import Counter
from typing import Any

from icecdc.compactor.sidecar import create_sidecar
from icecdc.domain.events import CompactionKind, CompactionOutcome
from icecdc.ingest.records import records_to_dataframe
from icecdc.runtime.catalog import ensure_tables
from tests.cdc import kafka_records
from tests.integration.test_append_only import COLUMNS, EVENTS_SCHEMA, change, rows_of, with_table
from tests.integration.test_compactor import assert_compactions_kept_rows, compactor_config, running, until_answered
from tests.integration.test_ingest_writer import batch_writer, qualified

REGIONS = ("eu", "us")
BATCHES = 3


def data_files(spark: Any, name: str) -> Counter[str]:
    spark.sql(f"REFRESH TABLE {name}")
    return Counter(
        r.region for r in spark.sql(f"SELECT partition.region AS region FROM {name}.files WHERE content = 0").collect()
    )


def test_settled_partitions_under_the_minor_trigger_end_with_at_most_two_data_files(spark, stack_config, unique):
    settle = {"cadence_multiple": 3, "min_seconds": 2, "initial_seconds": 2, "max_seconds": 4}
    config = compactor_config(stack_config, unique, min_small_files=12, settle=settle)
    spec = {"name": f"it.events_{unique}", "topic": f"events-{unique}", "partition_by": ["region"], "schema": EVENTS_SCHEMA}
    config = with_table(config, spec)
    ensure_tables(spark, config)
    name, topic = qualified(config), spec["topic"]
    expected: Counter[tuple[Any, ...]] = Counter()
    with batch_writer(spark, config) as write:
        offset = 0
        for batch in range(BATCHES):
            rows = [{"id": i, "region": REGIONS[i % 2], "note": f"batch {batch}"} for i in range(20)]
            expected.update(tuple(row[c] for c in COLUMNS) for row in rows)
            pairs = [change("c", row, offset + i + 1) for i, row in enumerate(rows)]
            write(records_to_dataframe(spark, kafka_records(topic, pairs, offset)), batch)
            offset += len(pairs)
        assert data_files(spark, name) == dict.fromkeys(REGIONS, BATCHES), "under the trigger of 12"
        # The last pack is due once the partition has been quiet for two windows of at most max_seconds.
        bound = config.compactor.last_pack_after_windows * settle["max_seconds"] + 60
        with running(create_sidecar(config, spark), 120) as sidecar:
            until_answered(sidecar, write, bound, lambda: max(data_files(spark, name).values()) <= 2)
    events = list(sidecar.stats.results)
    assert max(data_files(spark, name).values()) == 1, events
    packs = [e for e in events if e.outcome is CompactionOutcome.COMMITTED]
    assert packs and all(e.kind is CompactionKind.MINOR and "last pack" in (e.reason or "") for e in packs), events
    assert rows_of(spark, name, COLUMNS) == expected
    assert_compactions_kept_rows(spark, name, events)
