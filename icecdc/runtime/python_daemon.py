"""Spark's Python daemon (``spark.python.daemon.module``) with Arrow and pandas imported before it
forks its workers.

A worker idle for a minute exits and the next task forks a fresh one, and pyarrow's first
``pa.array`` imports pandas, a cost in CPU that every icecdc task on Spark would pay again in each
new worker. Imported here once, a forked worker inherits them. Only third-party libraries: the
runtime layer does not import ingest or compactor code.
"""

from __future__ import annotations

# Imported for the forked workers, not used here.
import pandas  # noqa: F401
import pyarrow.compute
import pyarrow.parquet  # noqa: F401
from pyspark import daemon

if __name__ == "__main__":
    daemon.manager()
