"""SIGTERM to a command's whole process group while it works, as systemd's default
``KillMode=control-group`` and ``tini -g`` send it: the Spark JVM, the command's child, gets it
too. Each command freezes itself in the middle of its work (a failpoint: the ingester with a
batch's files written, the sidecar with a compaction's), the group gets SIGTERM and then SIGCONT;
the command finishes that work, exits 0 with no traceback, and leaves no JVM behind. The
ingester, restarted, ends with exactly the rows of the change stream."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

from icecdc.ingest.runner import run_ingest
from icecdc.runtime.config import Config
from tests.cdc import SourceDatabase, table_rows
from tests.integration.test_coordinator import coordinated_config, stop, wait_for
from tests.integration.test_ingest_process import UNTIL_IDLE_SECONDS, history, ingest_process, produce
from tests.integration.test_ingest_writer import config_for, qualified
from tests.processes import child_pids, is_running, is_stopped, start_icecdc, write_config

# Minutes on 2 cores: `make test-all` runs it, `make test` does not.
pytestmark = pytest.mark.slow

# Starting a command (Spark, the group) and getting to the failpoint, on a loaded machine.
REACH_FAILPOINT_SECONDS = 300
# Finishing the frozen batch or compaction, stopping Spark and exiting.
FINISH_SECONDS = 120


def sigterm_to_the_group_at_the_failpoint(process: subprocess.Popen, log: Path) -> list[int]:
    """Once the command has frozen itself at its failpoint, SIGTERM to its process group (the JVM
    gets it first: the command is frozen), then SIGCONT; returns the pids of the command's
    children (its JVM)."""
    wait_for(lambda: process.poll() is not None or is_stopped(process), REACH_FAILPOINT_SECONDS, "the failpoint")
    assert process.poll() is None, log.read_text()[-3000:]
    children = child_pids(process)
    assert children, "no Spark JVM under the command"
    os.killpg(process.pid, signal.SIGTERM)
    os.killpg(process.pid, signal.SIGCONT)
    return children


def assert_clean_exit(process: subprocess.Popen, log: Path, children: list[int], finished: str) -> list[str]:
    """Exit code 0, no traceback, the command's last word says SIGTERM stopped it, and no JVM is
    left behind; returns the command's log messages."""
    try:
        code = process.wait(FINISH_SECONDS)
    finally:
        stop(process)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "py4j" not in text.lower(), text[-3000:]
    messages = [orjson.loads(line)["message"] for line in text.splitlines() if line.startswith("{")]
    assert any(m.startswith(f"{finished} (stopped by SIGTERM)") for m in messages), messages[-10:]
    wait_for(lambda: not any(is_running(pid) for pid in children), FINISH_SECONDS, "the JVM to exit with the command")
    return messages


def ingest_config(stack_config: Config, unique: str) -> Config:
    """The direct Kafka reader, in batches of 120 records."""
    ingest = stack_config.ingest.model_copy(
        update={"max_batch_records": 120, "min_commit_interval_seconds": 0.5, "source": "direct"}
    )
    return config_for(stack_config, unique).model_copy(update={"ingest": ingest})


def test_sigterm_to_the_ingesters_group_mid_batch_commits_the_batch_and_exits_cleanly(spark, stack_config, unique, tmp_path):
    config = ingest_config(stack_config, unique)
    source = SourceDatabase()
    events = history(source, keys=30, rounds=6)
    produce(config, config.tables[0].topic, events)
    path = write_config(config, tmp_path / "icecdc.yaml")
    log = tmp_path / "ingest.log"
    # Frozen after writing the second batch's files, before its commit (120 records of 210).
    ingester = start_icecdc(
        "--log-format", "json", "ingest", "--config", str(path), log=log, failpoint="after-files:2:stop", own_group=True
    )
    children = sigterm_to_the_group_at_the_failpoint(ingester, log)
    messages = assert_clean_exit(ingester, log, children, "ingest finished")
    # The batch in flight was committed, then the ingester stopped.
    assert any(m.startswith("ingest finished (stopped by SIGTERM): 2 batches") for m in messages), messages[-5:]

    restarted = ingest_process(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    name = qualified(config)
    spark.sql(f"REFRESH TABLE {name}")
    assert table_rows(spark, name) == source.expected_rows()
    summary = spark.sql(f"SELECT summary FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0].summary
    assert sum(orjson.loads(summary["icecdc.offsets"])[config.tables[0].topic].values()) == len(events)


def test_sigterm_to_the_sidecars_group_mid_compaction_commits_it_and_exits_cleanly(spark, stack_config, unique, tmp_path):
    config = coordinated_config(ingest_config(stack_config, unique), unique)
    source = SourceDatabase()
    produce(config, config.tables[0].topic, history(source, keys=30, rounds=6))
    run_ingest(config, until_idle=UNTIL_IDLE_SECONDS, spark=spark)  # small files and deletes, and their commit events
    path = write_config(config, tmp_path / "icecdc.yaml")
    log = tmp_path / "compactor.log"
    # Frozen with its first compaction's files written, before the commit.
    compactor = start_icecdc(
        "--log-format",
        "json",
        "compact",
        "--config",
        str(path),
        log=log,
        failpoint="compactor-before-commit:1:stop",
        own_group=True,
    )
    children = sigterm_to_the_group_at_the_failpoint(compactor, log)
    messages = assert_clean_exit(compactor, log, children, "compactor finished")
    # The compaction in flight was committed, then the sidecar stopped.
    assert any("committed" in m for m in messages if m.startswith("compactor finished")), messages[-5:]
    spark.sql(f"REFRESH TABLE {qualified(config)}")
    assert table_rows(spark, qualified(config)) == source.expected_rows()
