"""A catalog that stops answering in the middle of a run is not a crash: the ingester and the
compactor (with maintenance) run as processes, the SQLite catalog is held under an exclusive lock
for 45 s, past its busy timeout, while changes keep arriving; both ride it out, say so in their
logs, metrics and readiness, and the table ends exactly as the change stream implies."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time

import orjson

from icecdc.runtime import kafka
from icecdc.runtime.broker import free_port
from icecdc.runtime.config import Config
from icecdc.runtime.spark import sqlite_catalog_file
from tests.cdc import REGIONS, SourceDatabase, table_rows
from tests.integration.test_coordinator import coordinated_config, stop, wait_for
from tests.integration.test_ingest_writer import qualified
from tests.integration.test_observability import get, scrape
from tests.processes import start_icecdc, write_config

OUTAGE_SECONDS = 45
BUSY_TIMEOUT_MS = 2000  # shorter than the outage many times over: every call in it fails and is retried


def outage_config(stack_config: Config, unique: str) -> tuple[Config, int]:
    config = coordinated_config(stack_config, unique, maintenance={"interval_seconds": 10, "snapshot_retention_seconds": 20})
    data = config.model_dump(by_alias=True)
    data["catalog"]["properties"]["jdbc.busy_timeout"] = str(BUSY_TIMEOUT_MS)
    data["catalog"]["retry"] = {"give_up_seconds": 300, "backoff_seconds": 1, "backoff_max_seconds": 5}
    port = free_port()
    data["ingest"] = {
        "source": "direct",
        "trigger_seconds": 0.5,
        "max_batch_records": 500,
        "http": {"host": "127.0.0.1", "port": port},
    }
    return Config.model_validate(data), port


def hold_catalog_locked(database: str, seconds: float, locked: threading.Event) -> None:
    with contextlib.closing(sqlite3.connect(database, timeout=60, isolation_level=None)) as db:
        db.execute("BEGIN EXCLUSIVE")
        locked.set()
        time.sleep(seconds)
        db.execute("ROLLBACK")


def test_a_catalog_outage_leaves_the_ingester_and_the_compactor_running_and_the_table_exact(
    spark, stack_config, unique, tmp_path
):
    config, ingest_port = outage_config(stack_config, unique)
    table = config.tables[0]
    database = sqlite_catalog_file(config.catalog.properties)
    assert database is not None
    kafka.ensure_topics(config.kafka, [table.topic])
    path = write_config(config, tmp_path / "icecdc.yaml")
    src = SourceDatabase()
    producer = kafka.producer(config.kafka)

    def send(pairs: list) -> None:
        for key, value in pairs:
            producer.produce(table.topic, key=key, value=value)
        producer.flush(30)

    def round_of_changes(n: int) -> list:
        hot = [src.upsert(k, REGIONS[k % 3], n * 100 + k, 5) for k in range(300 + n % 7, 400, 7)]
        late = [src.upsert(k, REGIONS[k % 3], n, k % 5) for k in range(n % 25, 300, 25) if k in src.rows]
        gone = [src.delete(k) for k in range(n % 50, 300, 97) if k in src.rows]
        return hot + late + gone

    send([src.upsert(k, REGIONS[k % 3], k, k % 5) for k in range(300)])
    compactor = start_icecdc("--log-format", "json", "compact", "--config", str(path), log=tmp_path / "compactor.log")
    ingester = start_icecdc(
        "--log-format", "json", "ingest", "--config", str(path), "--until-idle", "10", log=tmp_path / "ingest.log"
    )
    locked = threading.Event()
    outage = threading.Thread(target=hold_catalog_locked, args=(str(database), OUTAGE_SECONDS, locked))
    readiness_during_outage = []
    try:
        wait_for(lambda: get(ingest_port, "/readyz")[0] == 200, 120, "the ingester to be ready")
        for n in range(1, 11):
            send(round_of_changes(n))
            time.sleep(0.4)
        outage.start()
        locked.wait(60)
        lock_ends = time.monotonic() + OUTAGE_SECONDS
        n = 11
        while time.monotonic() < lock_ends - 5:  # changes keep arriving while the catalog is down
            send(round_of_changes(n))
            n += 1
            status, body = get(ingest_port, "/readyz")
            readiness_during_outage.append((status, body))
            time.sleep(1)
        metrics_during_outage = scrape(ingest_port)
        outage.join()
        assert ingester.poll() is None and compactor.poll() is None, "a command stopped during the outage"
        for m in range(n, n + 5):
            send(round_of_changes(m))
            time.sleep(0.4)
        assert ingester.wait(300) == 0, (tmp_path / "ingest.log").read_text()[-3000:]
        wait_for(
            lambda: not spark.sql(f"SELECT 1 FROM {qualified(config)}.files WHERE content != 0").collect(),
            240,
            "every partition to settle and lose its delete files",
        )
    finally:
        stop(ingester)
        stop(compactor)
    assert compactor.returncode == 0, (tmp_path / "compactor.log").read_text()[-3000:]
    spark.sql(f"REFRESH TABLE {qualified(config)}")
    assert table_rows(spark, qualified(config)) == src.expected_rows()

    # The outage was seen, ridden out and said so: in the logs of both, in the ingester's
    # readiness and metrics while it lasted.
    for log in ("ingest.log", "compactor.log"):
        lines = [orjson.loads(line) for line in (tmp_path / log).read_text().splitlines() if line.startswith("{")]
        messages = [line["message"] for line in lines]
        assert any(m.startswith("the catalog does not answer") for m in messages), log
        assert any(m.startswith("the catalog answers again") for m in messages), log
        assert not [line for line in lines if line["level"] == "error"], log
    assert any(status == 503 and b"catalog" in body for status, body in readiness_during_outage), readiness_during_outage
    assert metrics_during_outage[("icecdc_catalog_available", (("command", "ingest"),))] == 0
