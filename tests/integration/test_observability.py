"""Metrics and health over HTTP during a real ingest and compaction run, and secrets kept out of
every log line of a run."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import orjson
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from icecdc.compactor.sidecar import run_compactor
from icecdc.ingest.runner import run_ingest
from icecdc.runtime import kafka
from icecdc.runtime.broker import free_port
from icecdc.runtime.config import Config, embedded_config
from tests.cdc import SourceDatabase, table_rows
from tests.integration.test_compactor import compactor_config
from tests.integration.test_ingest_process import produce
from tests.processes import icecdc_process


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return 0, b""  # nothing listening (yet, or any more), or too busy to answer within the timeout


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    _, body = get(port, "/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def wait_for(condition, timeout: float = 90.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


class Running:
    """A command's run function on a thread, stopped through its stop event."""

    def __init__(self, target, **kwargs) -> None:
        self.stop = threading.Event()
        self.result = None
        self._thread = threading.Thread(target=self._run, args=(target, kwargs), daemon=True)
        self._thread.start()

    def _run(self, target, kwargs) -> None:
        self.result = target(stop=self.stop, **kwargs)

    def finish(self):
        self.stop.set()
        self._thread.join(180)
        assert self.result is not None, "the command failed (see the log)"
        return self.result


def observable_config(stack_config: Config, unique: str) -> tuple[Config, int, int]:
    base = compactor_config(stack_config, unique, settle={"min_seconds": 0, "initial_seconds": 0})
    ingest_port, compactor_port = free_port(), free_port()
    data = base.model_dump(by_alias=True)
    # Batches end full, at 40 records; the floor, counted from the reader's start, leaves the
    # records time to arrive so that the first batch is full too.
    data["ingest"] = {
        "source": "direct",
        "min_commit_interval_seconds": 3,
        "max_batch_records": 40,
        "http": {"host": "127.0.0.1", "port": ingest_port},
    }
    data["compactor"]["http"] = {"host": "127.0.0.1", "port": compactor_port}
    return Config.model_validate(data), ingest_port, compactor_port


def test_metrics_and_health_answer_during_ingest_and_compaction(spark, stack_config, unique):
    config, ingest_port, compactor_port = observable_config(stack_config, unique)
    table = config.tables[0]
    source = SourceDatabase()
    events = [source.upsert(k, "eu", k, 0) for k in range(1, 61)] + [source.upsert(k, "eu", 7, 0) for k in range(1, 41)]
    events += [source.delete(k) for k in range(41, 61)]
    kafka.ensure_topics(config.kafka, [table.topic])
    produce(config, table.topic, events)
    records_before = REGISTRY.get_sample_value("icecdc_ingest_records_total") or 0.0
    batches_before = REGISTRY.get_sample_value("icecdc_ingest_batches_total") or 0.0
    driver_jobs_before = REGISTRY.get_sample_value("icecdc_ingest_job_seconds_count", {"where": "driver"}) or 0.0

    ingest = Running(run_ingest, config=config, spark=spark)
    _, body = wait_for(lambda: (r := get(ingest_port, "/readyz"))[0] == 200 and r, what="ingest readiness")
    assert set(orjson.loads(body)["checks"]) == {"source", "catalog"}
    assert get(ingest_port, "/healthz")[0] == 200
    label = (("table", table.name),)
    # 120 records at most 40 per batch: three batches, three commits.
    wait_for(lambda: scrape(ingest_port).get(("icecdc_ingest_commits_total", label)) == 3, what="three commits")
    metrics = scrape(ingest_port)
    stats = ingest.finish()
    assert metrics[("icecdc_ingest_records_total", ())] - records_before == stats.records == len(events)
    assert metrics[("icecdc_ingest_batches_total", ())] - batches_before == stats.batches == 3
    assert metrics[("icecdc_ingest_commits_total", label)] == stats.commits == 3
    assert metrics[("icecdc_ingest_rows_written_total", (("kind", "data"), ("table", table.name)))] == stats.data_records
    assert metrics[("icecdc_ingest_commit_seconds_count", label)] == 3
    # The direct reader's small batches ran in the driver, with no Spark job.
    assert metrics[("icecdc_ingest_job_seconds_count", (("where", "driver"),))] - driver_jobs_before == 3
    assert get(ingest_port, "/healthz")[0] != 200  # the server is gone with the command

    compactor = Running(run_compactor, config=config, spark=spark)
    wait_for(lambda: get(compactor_port, "/readyz")[0] == 200, what="compactor readiness")
    committed = (("kind", "delete-merge"), ("outcome", "committed"), ("table", table.name))
    settled = (("state", "settled"), ("table", table.name))
    wait_for(
        lambda: (
            (m := scrape(compactor_port)).get(("icecdc_compactions_total", committed))
            and m.get(("icecdc_compactor_partitions", settled))
        ),
        what="a compaction, and its partition settled again",
    )
    metrics = scrape(compactor_port)
    stats = compactor.finish()
    merges = [e for e in stats.results if e.kind == "delete-merge" and e.outcome == "committed"]
    assert metrics[("icecdc_compactions_total", committed)] == len(merges) == 1
    assert metrics[("icecdc_compactor_data_files_removed_total", label)] == merges[0].data_files_rewritten == 3
    assert metrics[("icecdc_compactor_partitions", settled)] == 1
    # The table ends portable, and the writer's bytes are counted beside the compactor's.
    assert merges[0].portable and merges[0].oldest_equality_delete_age_seconds == 0.0
    assert metrics[("icecdc_compactor_portable", label)] == 1
    assert metrics[("icecdc_compactor_oldest_equality_delete_age_seconds", label)] == 0.0
    assert metrics[("icecdc_compactor_writer_bytes_total", label)] > 0
    assert table_rows(spark, config.table_ref(table).qualified) == source.expected_rows()


@pytest.mark.slow
def test_configured_secrets_never_appear_in_a_runs_logs(broker, unique, tmp_path):
    kafka_password, catalog_token = f"kafka-pw-{unique}-x9", f"catalog-token-{unique}-q7"
    # A catalog of its own: these processes share nothing with the test session's Spark.
    config = compactor_config(
        embedded_config(tmp_path / "state", broker.port), unique, settle={"min_seconds": 0, "initial_seconds": 0}
    )
    data = config.model_dump(by_alias=True)
    data["kafka"]["properties"] = {"sasl.username": "icecdc", "sasl.password": "${TEST_KAFKA_PASSWORD}"}
    data["catalog"]["properties"]["token"] = "${TEST_CATALOG_TOKEN}"
    data["ingest"] = {"source": "direct", "min_commit_interval_seconds": 1}
    path = tmp_path / "icecdc.yaml"
    path.write_text(orjson.dumps(data, default=str).decode())  # JSON is YAML
    env = {"TEST_KAFKA_PASSWORD": kafka_password, "TEST_CATALOG_TOKEN": catalog_token}
    source = SourceDatabase()
    live = Config.model_validate({**data, "kafka": {**data["kafka"], "properties": {}}, "catalog": config.catalog.model_dump()})
    kafka.ensure_topics(live.kafka, [config.tables[0].topic])
    produce(live, config.tables[0].topic, [source.upsert(k, "eu", k, 0) for k in range(1, 30)])

    runs = [
        icecdc_process("--log-format", "json", "-v", "ingest", "--config", str(path), "--until-idle", "3", env=env),
        icecdc_process("-v", "compact", "--config", str(path), "--until-idle", "2", env=env),
        icecdc_process("config", "--config", str(path), env=env),
        icecdc_process("status", "--config", str(path), "--json", env=env),
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        output = run.stdout + run.stderr
        assert kafka_password not in output and catalog_token not in output
    assert "***" in runs[2].stdout
    [partition] = orjson.loads(runs[3].stdout)["partitions"]
    assert partition["records"] == len(source.rows) and partition["equality_delete_files"] == 0  # it did run
    json_lines = [orjson.loads(line) for line in runs[0].stderr.splitlines() if line.startswith("{")]
    assert any(line.get("snapshot_id") and line.get("table") == config.tables[0].name for line in json_lines)
