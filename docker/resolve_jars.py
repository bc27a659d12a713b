"""Image build step: resolve the Iceberg and Kafka connector jars from their Maven coordinates
with Spark's own resolver (Ivy, transitive dependencies included) and copy them to one folder,
so that the running image needs no network and lists them as ``spark.jars: <folder>/*.jar``."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from pyspark.sql import SparkSession


def coordinates(spark_version: str, scala_binary: str, iceberg_version: str) -> list[str]:
    return [
        f"org.apache.iceberg:iceberg-spark-runtime-3.5_{scala_binary}:{iceberg_version}",
        f"org.apache.iceberg:iceberg-aws-bundle:{iceberg_version}",  # S3FileIO (S3, MinIO)
        f"org.apache.spark:spark-sql-kafka-0-10_{scala_binary}:{spark_version}",
    ]


def main(target: str) -> None:
    ivy = Path("/tmp/ivy")
    packages = coordinates(os.environ["SPARK_VERSION"], os.environ["SCALA_BINARY"], os.environ["ICEBERG_VERSION"])
    (
        SparkSession.builder.master("local[1]")
        .config("spark.jars.packages", ",".join(packages))
        .config("spark.jars.ivy", str(ivy))
        .getOrCreate()
        .stop()
    )
    Path(target).mkdir(parents=True, exist_ok=True)
    for jar in sorted((ivy / "jars").glob("*.jar")):
        shutil.copy(jar, target)
        print(f"resolved {jar.name}")


if __name__ == "__main__":
    main(sys.argv[1])
