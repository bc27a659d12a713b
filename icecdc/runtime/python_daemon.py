"""Spark's Python daemon (``spark.python.daemon.module``) with Arrow and pandas imported before it
forks its workers.

Spark starts one daemon per executor, and the daemon forks a worker process for each Python task
slot; a worker idle for a minute exits and the next task forks a fresh one. Every icecdc task on
Spark (the ingester's ``mapInArrow`` stages, the compactor's Arrow merge) imports pyarrow, and
pyarrow's first ``pa.array`` imports pandas: about 1 s of CPU in each new worker, paid again after
every idle minute. Imported here once, a forked worker inherits them. Only third-party libraries:
the runtime layer does not import ingest or compactor code.
"""

from __future__ import annotations

# Imported for the forked workers, not used here.
import pandas  # noqa: F401
import pyarrow.compute
import pyarrow.parquet  # noqa: F401
from pyspark import daemon

if __name__ == "__main__":
    daemon.manager()
