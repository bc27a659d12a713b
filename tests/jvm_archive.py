"""A class-data sharing archive (JDK CDS) of the classes a Spark driver loads, for the tests' JVMs.

The suite starts many Spark JVMs (each worker's session, every ``icecdc`` command a test
runs, a bench's compactor processes), and most of a JVM's start goes to loading and verifying
Spark's and Scala's classes. A JVM started with a dynamic archive maps them from it instead
(docs/contributing.md, "The suite's time"). The archive is made once per virtualenv by a short
Spark session that exits with ``-XX:ArchiveClassesAtExit``, before the test workers start, and
read by every later JVM. A JVM that cannot use it (another JDK, another
class path) runs as it would without it: the JVM checks the archive's header and class path, and
its complaint is silenced so that no command's output changes. For tests alone: deployments
and benchmarks start their JVMs as users do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

# The recipe's version: change it when ``_warm_up`` changes, so that older archives are not used.
_RECIPE = "1"


def archive_path() -> Path:
    """Where this virtualenv's archive lives, named by what it depends on (the JDK and Spark)."""
    java = os.path.realpath(shutil.which("java", path=_java_path()) or "java")
    key = hashlib.sha256(f"{_RECIPE}:{java}:{version('pyspark')}".encode()).hexdigest()[:16]
    return Path(sys.prefix) / "icecdc-test-jvm" / f"spark-{key}.jsa"


def _java_path() -> str:
    """The PATH spark-submit finds ``java`` on: ``$JAVA_HOME/bin`` first when set."""
    home = os.environ.get("JAVA_HOME")
    return os.pathsep.join([*([f"{home}/bin"] if home else []), os.environ.get("PATH", "")])


def archive_options() -> tuple[str, ...]:
    """JVM options that read the archive, when it exists (none otherwise)."""
    path = archive_path()
    if not path.exists():
        return ()
    return (f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off,cds+dynamic=off")


def ensure_archive() -> Path | None:
    """Make the archive unless it exists; None (and a line on stderr) if it could not be made,
    in which case the tests run as they would without it."""
    path = archive_path()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    from tests.processes import TEST_JVM_OPTIONS  # here: tests.processes imports this module

    env = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_OPTS"}
    env["SPARK_SUBMIT_OPTS"] = " ".join([*TEST_JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={partial}"])
    print(f"making the tests' JVM class archive {path} (once per virtualenv, about a minute)", file=sys.stderr, flush=True)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "tests.jvm_archive"], env=env, capture_output=True, text=True, timeout=300, check=False
        )
        if run.returncode != 0 or not partial.exists():
            print(f"no JVM class archive (the tests run without it): {run.stderr[-2000:]}", file=sys.stderr, flush=True)
            return None
        partial.replace(path)  # atomic: a JVM never maps a half-written archive
        return path
    except subprocess.TimeoutExpired:
        print("no JVM class archive (the tests run without it): its Spark session took over 300 s", file=sys.stderr)
        return None
    finally:
        partial.unlink(missing_ok=True)


def _warm_up() -> None:
    """A Spark session through the embedded Iceberg catalog doing what tests do most: create a
    table, write it, read it back, join and aggregate; its JVM archives what it loaded as it exits."""
    from icecdc.runtime.config import embedded_config
    from icecdc.runtime.spark import create_spark_session, stop_session

    with tempfile.TemporaryDirectory(prefix="icecdc-jvm-archive-") as state:
        config = embedded_config(Path(state), 9092)  # no broker: nothing here reaches Kafka
        spark = create_spark_session(config, "icecdc-jvm-archive")
        try:
            table = f"{config.catalog.name}.archive.rows"
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {config.catalog.name}.archive")
            spark.sql(f"CREATE TABLE {table} (id BIGINT, region STRING) USING iceberg PARTITIONED BY (region)")
            spark.sql(f"INSERT INTO {table} VALUES (1, 'eu'), (2, 'us'), (3, 'eu')")
            spark.sql(f"SELECT region, count(*) FROM {table} GROUP BY region").collect()
            spark.range(100).join(spark.table(table), "id").selectExpr("sum(id)").collect()
        finally:
            stop_session(spark)


if __name__ == "__main__":
    _warm_up()
