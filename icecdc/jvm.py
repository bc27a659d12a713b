"""The thin bridge to Iceberg's Java API through py4j, for what Spark SQL cannot do.

py4j converts Python lists to ``java.util.ArrayList`` but not to Java arrays, and Python ints
to ``Integer``; helpers here build the exact Java values Iceberg's API expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JavaObject = Any


def jvm(spark: SparkSession) -> JavaObject:
    return spark.sparkContext._jvm


def load_table(spark: SparkSession, qualified_name: str) -> JavaObject:
    """The live ``org.apache.iceberg.Table`` for ``catalog.namespace.table``."""
    return jvm(spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, qualified_name)


def int_array(spark: SparkSession, values: Sequence[int]) -> JavaObject:
    gateway = spark.sparkContext._gateway
    array = gateway.new_array(gateway.jvm.int, len(values))
    for i, value in enumerate(values):
        array[i] = value
    return array
