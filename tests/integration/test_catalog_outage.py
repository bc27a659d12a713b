"""A catalog that stops answering in the middle of a run is not a crash: the ingester and the
compactor (with maintenance) run as processes, the SQLite catalog is held under an exclusive lock
for 45 s, past its busy timeout, while changes keep arriving; both ride it out, say so in their
logs, metrics and readiness, and the table ends exactly as the change stream implies. Nor is it
idleness: ``--until-idle`` counts neither the outage nor the writer's backlog after it."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from icecdc.runtime import kafka
from icecdc.runtime.broker import free_port
from icecdc.runtime.config import Config
from icecdc.runtime.spark import sqlite_catalog_file
from tests.cdc import REGIONS, SourceDatabase, table_rows
from tests.integration.test_coordinator import coordinated_config, stop, wait_for
from tests.integration.test_ingest_writer import qualified
from tests.integration.test_observability import get, scrape
from tests.processes import start_icecdc, write_config

# Minutes on 2 cores: `make test-all` runs it, `make test` does not.
pytestmark = pytest.mark.slow

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
        "min_commit_interval_seconds": 0.5,
        "max_batch_records": 500,
        "http": {"host": "127.0.0.1", "port": port},
    }
    return Config.model_validate(data), port


class ChangeFeed:
    """The source database's changes to the test's table, sent to its topic."""

    def __init__(self, config: Config) -> None:
        self.topic = config.tables[0].topic
        kafka.ensure_topics(config.kafka, [self.topic])
        self.src = SourceDatabase()
        self._producer = kafka.producer(config.kafka)

    def send(self, pairs: list) -> None:
        for key, value in pairs:
            self._producer.produce(self.topic, key=key, value=value)
        self._producer.flush(30)

    def snapshot(self) -> None:
        src = self.src
        self.send([src.upsert(k, REGIONS[k % 3], k, k % 5) for k in range(300)])

    def round_of_changes(self, n: int) -> None:
        src = self.src
        hot = [src.upsert(k, REGIONS[k % 3], n * 100 + k, 5) for k in range(300 + n % 7, 400, 7)]
        late = [src.upsert(k, REGIONS[k % 3], n, k % 5) for k in range(n % 25, 300, 25) if k in src.rows]
        gone = [src.delete(k) for k in range(n % 50, 300, 97) if k in src.rows]
        self.send(hot + late + gone)


def json_lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


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
    database = sqlite_catalog_file(config.catalog.properties)
    assert database is not None
    path = write_config(config, tmp_path / "icecdc.yaml")
    feed = ChangeFeed(config)
    feed.snapshot()
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
            feed.round_of_changes(n)
            time.sleep(0.4)
        outage.start()
        locked.wait(60)
        lock_ends = time.monotonic() + OUTAGE_SECONDS
        n = 11
        while time.monotonic() < lock_ends - 5:  # changes keep arriving while the catalog is down
            feed.round_of_changes(n)
            n += 1
            status, body = get(ingest_port, "/readyz")
            readiness_during_outage.append((status, body))
            time.sleep(1)
        metrics_during_outage = scrape(ingest_port)
        outage.join()
        assert ingester.poll() is None and compactor.poll() is None, "a command stopped during the outage"
        for m in range(n, n + 5):
            feed.round_of_changes(m)
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
    assert table_rows(spark, qualified(config)) == feed.src.expected_rows()

    # The outage was seen, ridden out and said so: in the logs of both, in the ingester's
    # readiness and metrics while it lasted.
    for log in ("ingest.log", "compactor.log"):
        lines = json_lines(tmp_path / log)
        messages = [line["message"] for line in lines]
        assert any(m.startswith("the catalog does not answer") for m in messages), log
        assert any(m.startswith("the catalog answers again") for m in messages), log
        assert not [line for line in lines if line["level"] == "error"], log
    assert any(status == 503 and b"catalog" in body for status, body in readiness_during_outage), readiness_during_outage
    assert metrics_during_outage[("icecdc_catalog_available", (("command", "ingest"),))] == 0


# The idle window of both commands: longer than a batch takes on a loaded machine (up to 50 s
# for the first, seen with the suite running beside it), so that the writer's commit events come
# more often than that. The outage is longer still: held in the window, it would run out there.
UNTIL_IDLE_SECONDS = 30.0
IDLE_OUTAGE_SECONDS = 1.5 * UNTIL_IDLE_SECONDS


def ready(port: int) -> bool:
    try:
        return get(port, "/readyz")[0] == 200
    except TimeoutError:  # a loaded machine: asked again
        return False


def logged_at(line: dict) -> float:
    return dt.datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc).timestamp()


def last_count(lines: list[dict], pattern: str) -> int:
    counts = [int(m.group(1)) for line in lines if (m := re.search(pattern, line["message"]))]
    assert counts, pattern
    return counts[-1]


def with_sidecar_endpoints(config: Config, tmp_path: Path) -> tuple[Config, int, Path, Path]:
    """The config with the sidecar's health endpoints on a free port, written to a file; returns
    it, that port, the catalog's database file and the config file."""
    data = config.model_dump(by_alias=True)
    compactor_port = free_port()
    data["compactor"]["http"] = {"host": "127.0.0.1", "port": compactor_port}
    config = Config.model_validate(data)
    database = sqlite_catalog_file(config.catalog.properties)
    assert database is not None
    return config, compactor_port, database, write_config(config, tmp_path / "icecdc.yaml")


def test_until_idle_counts_neither_a_catalog_outage_nor_the_writers_backlog_after_it(spark, stack_config, unique, tmp_path):
    config, ingest_port = outage_config(stack_config, unique)
    config, compactor_port, database, path = with_sidecar_endpoints(config, tmp_path)
    feed = ChangeFeed(config)
    feed.snapshot()
    until_idle = ("--until-idle", f"{UNTIL_IDLE_SECONDS:g}")
    rounds = itertools.count(1)

    def changes_until(done: Callable[[], bool], timeout: float, what: str) -> None:
        """A round of changes a second (the writer commits them, so neither command is idle)
        until ``done``."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            feed.round_of_changes(next(rounds))
            time.sleep(1)

    # Each command stops after UNTIL_IDLE_SECONDS without work, which is less than either takes to
    # start: the ingester starts first and gets changes until the sidecar is up.
    ingester = start_icecdc("--log-format", "json", "ingest", "--config", str(path), *until_idle, log=tmp_path / "ingest.log")
    compactor = None
    locked = threading.Event()
    outage = threading.Thread(target=hold_catalog_locked, args=(str(database), IDLE_OUTAGE_SECONDS, locked))
    try:
        wait_for(lambda: ready(ingest_port), 180, "the ingester to be ready")
        compactor = start_icecdc(
            "--log-format", "json", "compact", "--config", str(path), *until_idle, log=tmp_path / "compactor.log"
        )
        changes_until(lambda: ready(compactor_port), 180, "the sidecar to join its group")
        assert ingester.poll() is None
        before_outage = time.time()
        outage.start()
        assert locked.wait(60)
        lock_ends = time.monotonic() + IDLE_OUTAGE_SECONDS

        def outage_nearly_over() -> bool:
            assert compactor.poll() is None, "the sidecar stopped during the outage"
            return time.monotonic() >= lock_ends - 5

        changes_until(outage_nearly_over, 2 * IDLE_OUTAGE_SECONDS, "the outage to end")  # a backlog for the writer
        outage.join()
        assert compactor.poll() is None, "the sidecar stopped as the outage ended"
        # Nothing more is sent: the ingester commits its backlog, then both run out of work.
        assert ingester.wait(300) == 0, (tmp_path / "ingest.log").read_text()[-3000:]
        assert compactor.wait(300) == 0, (tmp_path / "compactor.log").read_text()[-3000:]
    finally:
        stop(ingester)
        if compactor is not None:
            stop(compactor)

    ingested, compacted = json_lines(tmp_path / "ingest.log"), json_lines(tmp_path / "compactor.log")
    messages = [line["message"] for line in compacted]
    # The sidecar was itself blocked by the outage, and it saw every commit the writer made,
    # the backlog after the outage included.
    assert any(m.startswith("the catalog does not answer") for m in messages)
    published = last_count(ingested, r"(\d+) commit events published")
    assert last_count(compacted, r"compactor finished \(idle\): (\d+) commit events") == published
    # It stopped on its idle window, a whole window after the catalog answered again.
    stopped = [line for line in compacted if line["message"].startswith("no commit event for")]
    assert stopped, messages[-20:]
    released_no_earlier = before_outage + IDLE_OUTAGE_SECONDS
    assert logged_at(stopped[0]) >= released_no_earlier + UNTIL_IDLE_SECONDS
    spark.sql(f"REFRESH TABLE {qualified(config)}")
    assert table_rows(spark, qualified(config)) == feed.src.expected_rows()


@pytest.mark.usefixtures("spark")  # the catalog's tables exist before the sidecar starts
def test_until_idle_does_not_count_the_time_the_sidecar_itself_waits_on_the_catalog(stack_config, unique, tmp_path):
    """No writer and nothing to compact, so nothing but the outage can hold the sidecar: its own
    metadata reads (every ``reconcile_seconds``) wait on the locked catalog, and it stops a whole
    window after the catalog answers again, not as soon as it does."""
    _, compactor_port, database, path = with_sidecar_endpoints(outage_config(stack_config, unique)[0], tmp_path)
    log = tmp_path / "compactor.log"
    compactor = start_icecdc(
        "--log-format", "json", "compact", "--config", str(path), "--until-idle", f"{UNTIL_IDLE_SECONDS:g}", log=log
    )
    locked = threading.Event()
    outage = threading.Thread(target=hold_catalog_locked, args=(str(database), IDLE_OUTAGE_SECONDS, locked))
    try:
        wait_for(lambda: ready(compactor_port) or compactor.poll() is not None, 180, "the sidecar to join its group")
        assert compactor.poll() is None, log.read_text()[-3000:]
        before_outage = time.time()
        outage.start()
        assert locked.wait(60)
        while outage.is_alive():
            assert compactor.poll() is None, "the sidecar stopped during the outage"
            outage.join(0.5)
        assert compactor.wait(IDLE_OUTAGE_SECONDS + 2 * UNTIL_IDLE_SECONDS) == 0, log.read_text()[-3000:]
    finally:
        stop(compactor)
    lines = json_lines(log)
    assert any(line["message"].startswith("the catalog does not answer") for line in lines)
    stopped = [line for line in lines if line["message"].startswith("no commit event for")]
    assert stopped, [line["message"] for line in lines][-20:]
    assert logged_at(stopped[0]) >= before_outage + IDLE_OUTAGE_SECONDS + UNTIL_IDLE_SECONDS
