"""Writers that are not ours, for the tests and ``icecdc bench writers``: real Spark Structured
Streaming queries that write an Iceberg table the way other teams' jobs do, each checked against
an independent model of its rows.

The table: ``id BIGINT, region STRING, amount BIGINT, status STRING, updated_at TIMESTAMP``,
partitioned by ``region`` (``model.DDL_COLUMNS``).

The writers (each one is a ``foreachBatch`` query over a folder of Parquet files, one file per
batch and per trigger, so each batch is one commit):
- ``MergeWriter(mode=WriteMode.MERGE_ON_READ)``, writer (a): ``MERGE INTO`` from the micro-batch
  (delete on ``op = 'd'``, update matched rows, insert the rest), and ``UPDATE`` / ``DELETE``
  batches; position deletes on format v2, deletion vectors on v3.
- ``MergeWriter(mode=WriteMode.COPY_ON_WRITE)``, writer (b): the same statements, rewriting files.
- ``AppendWriter(files_per_commit=n)``, writer (c): inserts only, ``repartition(n)``, so each
  commit adds about n files per partition it touches, as the Kafka Connect sink does.

Use::

    changes = ChangeGenerator(seed=1)
    writer = MergeWriter(spark, "lake.foreign.orders", tmp_path, format_version=3, trigger_seconds=2)
    with writer:  # start(): creates the table if missing, starts the query; stop() on exit
        writer.feed([changes.inserts(200), *(changes.merge(40) for _ in range(8)), changes.update(10)])
        writer.wait_for_commits(10)  # bounded: trigger interval per missing commit + margin
    assert writer.refused == []
    writer.assert_matches()  # the table read through Spark equals the model, or a diff

What a writer exposes: ``start()``, ``feed(batches)``, ``wait_for_commits(n)``, ``stop()``,
``commits`` (how many batches committed), ``committed`` (their ``seq``), ``refused`` (each refused
commit: batch, attempt, Iceberg's error), ``retries``, ``expected()`` (the model's rows after the
committed batches), ``read_rows()`` and ``assert_matches()``.

Options of every writer: ``format_version``, ``trigger_seconds``, ``retry``, ``max_attempts``,
``margin_seconds`` (added to the wait's bound), ``gate``, and ``refresh``: Spark's catalog cache
lets a statement scan a snapshot up to the cache's expiry old when another process commits (a
user's job does so by default); ``refresh=True`` runs ``REFRESH TABLE`` before each statement.

A refused commit raises in ``foreachBatch`` and so stops the query, as it stops a user's job.
With ``retry=True`` the writer retries the statement up to ``max_attempts`` times first, as a job
with its own retry loop does; every refusal is recorded either way.

``Gate`` (icecdc/testbed/writers/gate.py) holds one task of a batch's MERGE after the MERGE planned its
scan, so a test can commit something (a compaction) between that scan and the MERGE's commit.
"""

from icecdc.testbed.writers.append import AppendWriter
from icecdc.testbed.writers.gate import Gate
from icecdc.testbed.writers.merge import MergeWriter, WriteMode
from icecdc.testbed.writers.model import Batch, BatchKind, ChangeGenerator, Mix, Row, TableModel, diff
from icecdc.testbed.writers.streaming import Refusal, StreamingWriter

__all__ = [
    "AppendWriter",
    "Batch",
    "BatchKind",
    "ChangeGenerator",
    "Gate",
    "MergeWriter",
    "Mix",
    "Refusal",
    "Row",
    "StreamingWriter",
    "TableModel",
    "WriteMode",
    "diff",
]
