"""The ingester and the compactor on a real Spark standalone cluster: a master and two workers
started from PySpark's own launcher (``bin/spark-class``) as separate processes, executors in
JVMs of their own with the Iceberg runtime and JDBC jars shipped to them, and icecdc's executor
code (parse, write and describe files, match keys, write position deletes) in their Python
workers. The table is checked against the CDC model, and both commands must stop cleanly."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pyspark
import pytest

from icecdc.runtime import kafka
from icecdc.runtime.broker import free_port
from icecdc.runtime.config import Config, TableConfig
from tests.cdc import REGIONS, SourceDatabase, orders_table, table_rows
from tests.integration.test_ingest_process import produce
from tests.integration.test_ingest_writer import read_topic
from tests.processes import TEST_JVM_OPTIONS, command_env, icecdc_process, with_jvm_options, write_config

# Minutes on 2 cores: `make test-all` runs it, `make test` does not.
pytestmark = pytest.mark.slow

WORKERS = 2
# Generous: on a loaded 2-core machine a JVM takes its time to start.
START_SECONDS = 180


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}")


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            state = orjson.loads(answer.read())
    except OSError:
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def standalone_cluster(directory: Path) -> Iterator[str]:
    """A Spark standalone master and ``WORKERS`` one-core workers on this host; yields the master URL."""
    spark_home = Path(pyspark.__file__).parent
    env = {
        **command_env(),
        "SPARK_HOME": str(spark_home),
        "SPARK_LOG_DIR": str(directory / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_DAEMON_JAVA_OPTS": with_jvm_options(os.environ.get("SPARK_DAEMON_JAVA_OPTS"), TEST_JVM_OPTIONS),
    }
    launcher = str(spark_home / "bin" / "spark-class")
    master_port, ui_port = free_port(), free_port()
    processes = []
    logs = []

    def start(name: str, *args: str) -> None:
        log = (directory / f"{name}.log").open("w")
        logs.append(log)
        processes.append(subprocess.Popen([launcher, *args], env=env, stdout=log, stderr=subprocess.STDOUT))

    try:
        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(master_port),
            "--webui-port",
            str(ui_port),
        )
        _wait(lambda: _listening(master_port), START_SECONDS, "the Spark master")
        url = f"spark://127.0.0.1:{master_port}"
        for n in range(WORKERS):
            work = directory / f"worker-{n}"
            work.mkdir()
            start(
                f"worker-{n}",
                "org.apache.spark.deploy.worker.Worker",
                url,
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1536m"),
                *("--webui-port", str(free_port()), "--work-dir", str(work)),
            )
        _wait(lambda: _alive_workers(ui_port) == WORKERS, START_SECONDS, f"{WORKERS} workers to register")
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        for log in logs:
            log.close()


def test_ingester_and_compactor_on_a_standalone_cluster(spark, stack_config, unique, tmp_path):
    table = TableConfig.model_validate(orders_table(f"it.cluster_{unique}", f"cluster-{unique}"))
    source = SourceDatabase()
    events = [source.upsert(k, REGIONS[k % 3], k, k % 2) for k in range(200)]
    for n in range(1, 5):  # updates that move rows across partitions, deletes, inserts
        events += [source.upsert(k, REGIONS[(k + n) % 3], 10 * k + n, (k + n) % 2) for k in range(n, 200, 7) if k in source.rows]
        events += [source.delete(k) for k in range(n, 200, 29) if k in source.rows]
    events.insert(100, (b"k", b"{broken"))  # a dead letter, from an executor's parse
    with standalone_cluster(tmp_path) as master:
        config = stack_config.model_copy(
            update={
                "tables": [table],
                "commit_topic": f"commits-{unique}",
                "dead_letter_topic": f"dlq-{unique}",
                "compaction_topic": f"compactions-{unique}",
                "ingest": stack_config.ingest.model_copy(
                    update={"source": "direct", "max_batch_records": 150, "min_commit_interval_seconds": 0.5}
                ),
                "spark": stack_config.spark.model_copy(
                    update={"master": master, "conf": {"spark.executor.memory": "1g", "spark.executor.cores": "1"}}
                ),
            }
        )
        config = Config.model_validate(
            {
                **config.model_dump(by_alias=True),
                "compactor": {
                    "consumer_group": f"compactor-{unique}",
                    "min_small_files": 2,
                    "settle": {"cadence_multiple": 3, "min_seconds": 1, "initial_seconds": 2, "max_seconds": 4},
                    "http": {"port": None},
                },
                "coordinator": {"lease_topic": f"leases-{unique}", "maintenance": {"enabled": False}},
            }
        )
        kafka.ensure_topics(config.kafka, [table.topic])
        produce(config, table.topic, events)
        path = write_config(config, tmp_path / "icecdc.yaml")
        ingested = icecdc_process("ingest", "--config", str(path), "--until-idle", "5")
        assert ingested.returncode == 0, ingested.stderr[-3000:]
        compacted = icecdc_process("compact", "--config", str(path), "--until-idle", "10")
        assert compacted.returncode == 0, compacted.stderr[-3000:]
        apps = [*(tmp_path / "worker-0").iterdir(), *(tmp_path / "worker-1").iterdir()]
    # Both commands ran their executors on the workers, and stopped their sessions cleanly.
    assert {p.name.split("-")[0] for p in apps} == {"app"} and len({p.name for p in apps}) >= 2
    for run in (ingested, compacted):
        assert " ERROR " not in run.stderr, [line for line in run.stderr.splitlines() if " ERROR " in line][:5]
    dead = read_topic(config, config.dead_letter_topic, 2, timeout=10)
    assert [dict(m.headers())["icecdc.reason"] for m in dead] == [b"unparseable-json"]
    name = config.table_ref(table).qualified
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == source.expected_rows()
    files = spark.sql(f"SELECT content FROM {name}.files").collect()
    assert files and all(f.content == 0 for f in files), "every partition settled and merged its deletes"
    partitions = spark.sql(f"SELECT count(*) FROM {name}.partitions").first()[0]
    assert len(files) == partitions  # one file each
