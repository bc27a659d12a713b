"""A writer that is not icecdc's: a Flink-style upsert sink, written with Iceberg's own Java
writer classes through the JVM (equality deletes across checkpoints, file-scoped position deletes
within one, one RowDelta per checkpoint with no validations, Flink's summary tags
``flink.job-id``, ``flink.operator-id`` and ``flink.max-committed-checkpoint-id``).

    create_table(spark, "lake.db.t")              # region-partitioned, identifier field id, v2
    sink = UpsertSink(spark, "lake.db.t", seed=1, changes_per_checkpoint=40)
    sink.commit_checkpoint(30_000)                # optional: a large first checkpoint loads the table
    sink.commit_checkpoints(8)                    # or in the background, one every 2 s:
    # sink.start(60, 2.0); sink.wait_for_commits(60, timeout_seconds); sink.stop()
    assert sink.refused == [] and sink.commits == 9
    assert sink.table_diff() == []                # the table read through Spark equals sink.model

``sink.checkpoints`` lists what each commit wrote (its snapshot, rows, equality and position
deletes) and the model after it, so ``sink.table_diff(checkpoint)`` checks that snapshot.
``sink.commit_checkpoint(before_commit=f)`` runs ``f`` between the files and the commit, for a
concurrent commit at a chosen moment. ``refused`` lists the commits Iceberg refused (each is
tried again with the same files, as a restored Flink job does). ``upserts.py`` holds the pure
part: the change generator, the plan of a checkpoint's files and the model of the rows. The table
and its rows are those of ``icecdc.testbed.writers.model``. In this JVM Iceberg tags every commit
``engine-name=spark``, so tell the sink's commits by ``flink.job-id``.
"""

from icecdc.testbed.upsert_sink.sink import Checkpoint, UpsertSink, create_table, table_rows
from icecdc.testbed.upsert_sink.upserts import Change, ChangeGenerator, ChangeKind, PartitionFiles, apply_changes, plan_checkpoint

__all__ = [
    "Change",
    "ChangeGenerator",
    "ChangeKind",
    "Checkpoint",
    "PartitionFiles",
    "UpsertSink",
    "apply_changes",
    "create_table",
    "plan_checkpoint",
    "table_rows",
]
