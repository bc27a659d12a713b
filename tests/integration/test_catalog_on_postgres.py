"""The JDBC catalog on a real PostgreSQL, as production JDBC catalogs run: Iceberg's JdbcCatalog in
Spark (Debian's JDBC driver) and pyiceberg's SqlCatalog (psycopg) share it. The ingester and the
compactor (with maintenance) run as processes on a change stream; PostgreSQL is stopped (fast
shutdown: every open session is ended with 57P01) and started again a while later under them.
Neither process exits, both say so in their logs, and the table ends exactly as the stream
implies."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from icecdc.runtime.broker import free_port
from icecdc.runtime.catalog import pyiceberg_catalog
from icecdc.runtime.config import Config, expand_env
from icecdc.runtime.spark import DEBIAN_JAVA_DIR, JDBC_DRIVERS
from icecdc.testbed.postgres import PostgresError, ThrowawayPostgres, server_bindir
from tests.integration.test_catalog_outage import UNTIL_IDLE_SECONDS, ChangeFeed, json_lines, outage_config, ready
from tests.integration.test_coordinator import stop, wait_for
from tests.processes import start_icecdc, write_config

pytest.importorskip("psycopg", reason="pyiceberg's SQL catalog on PostgreSQL needs psycopg (scripts/setup.sh installs it)")
try:
    server_bindir()
except PostgresError as missing:
    pytest.skip(str(missing), allow_module_level=True)
JDBC_JAR, JDBC_PACKAGE = JDBC_DRIVERS["jdbc:postgresql:"]
if not (DEBIAN_JAVA_DIR / JDBC_JAR).is_file():
    pytest.skip(f"the PostgreSQL JDBC driver is missing (apt-get install {JDBC_PACKAGE})", allow_module_level=True)

pytestmark = pytest.mark.slow

DATABASE = "shop"
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "postgres-catalog.yaml"


@pytest.fixture
def catalog_database() -> Iterator[ThrowawayPostgres]:
    # In a directory of the test's own (under the system temp directory, which the server's own
    # user reaches when we are root): the catalog must outlive a stop of the server.
    directory = Path(tempfile.mkdtemp(prefix="icecdc-test-catalog-pg-"))
    cluster = ThrowawayPostgres(directory)
    try:
        with cluster:
            with cluster.connect() as db:
                db.execute(f"CREATE DATABASE {DATABASE}")
            yield cluster
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def on_postgres(config: Config, cluster: ThrowawayPostgres, warehouse: Path) -> Config:
    """The config with its catalog as docs/examples/postgres-catalog.yaml has it, on ``cluster``."""
    environ = {
        "CATALOG_DB_HOST": cluster.host,
        "CATALOG_DB_PORT": str(cluster.port),
        "CATALOG_DB_NAME": DATABASE,
        "CATALOG_DB_USER": cluster.user,
        "WAREHOUSE": str(warehouse),
    }
    documented = yaml.safe_load(EXAMPLE.read_text())["catalog"]["properties"]
    data = config.model_dump(by_alias=True)
    data["catalog"]["properties"] = expand_env(documented, environ=environ)
    return Config.model_validate(data)


def assert_running(processes: dict[str, subprocess.Popen], logs: Path) -> None:
    for name, process in processes.items():
        assert process.poll() is None, f"the {name} exited: " + (logs / f"{name}.log").read_text()[-3000:]


def answered_again_after(lines: list[dict]) -> list[float]:
    """The outages a command logged as ridden out, in seconds."""
    return [float(m.group(1)) for line in lines if (m := re.match(r"the catalog answers again after (\d+)s", line["message"]))]


def test_a_restart_of_the_catalogs_postgres_is_ridden_out_by_the_ingester_and_the_compactor(
    stack_config, unique, tmp_path, catalog_database
):
    base, ingest_port = outage_config(stack_config, unique)
    config = on_postgres(base, catalog_database, tmp_path / "warehouse")
    settings = config.catalog.retry
    # Down long enough for several tries at the longest backoff, and far within the window the
    # commands wait before giving up.
    down_seconds = 6 * settings.backoff_max_seconds
    assert down_seconds < settings.give_up_seconds / 2
    data = config.model_dump(by_alias=True)
    compactor_port = free_port()
    data["compactor"]["http"] = {"host": "127.0.0.1", "port": compactor_port}
    config = Config.model_validate(data)
    path = write_config(config, tmp_path / "icecdc.yaml")
    feed = ChangeFeed(config)
    feed.snapshot()
    until_idle = ("--until-idle", f"{UNTIL_IDLE_SECONDS:g}")  # longer than a batch takes on a loaded machine
    ingester = start_icecdc("--log-format", "json", "ingest", "--config", str(path), *until_idle, log=tmp_path / "ingester.log")
    running = {"ingester": ingester}
    rounds = itertools.count(1)

    def a_round() -> bool:
        """A round of changes, while both commands run."""
        assert_running(running, tmp_path)
        feed.round_of_changes(next(rounds))
        return True

    try:
        wait_for(lambda: ready(ingest_port) or ingester.poll() is not None, 180, "the ingester to be ready")
        assert_running(running, tmp_path)
        # Started once the ingester created the catalog's tables and the table: two JVMs
        # initializing an empty JDBC catalog at once race on its CREATE TABLEs.
        running["compactor"] = start_icecdc(
            "--log-format", "json", "compact", "--config", str(path), log=tmp_path / "compactor.log"
        )
        wait_for(lambda: a_round() and ready(compactor_port), 180, "the sidecar to join its group")
        for _ in range(5):
            a_round()
            time.sleep(0.5)

        stopping = time.time()
        catalog_database.stop()  # fast: the sessions of both commands' pools are ended
        stopped_at = time.monotonic()
        while time.monotonic() < stopped_at + down_seconds:  # changes keep arriving while the catalog is down
            a_round()
            time.sleep(1)
        catalog_database.start()
        restarted_at, started = time.monotonic(), time.time()
        for _ in range(5):
            a_round()
            time.sleep(0.5)
        # Nothing more is sent: the ingester commits its backlog and stops on its idle window.
        assert ingester.wait(settings.give_up_seconds) == 0, (tmp_path / "ingester.log").read_text()[-3000:]
        del running["ingester"]
        catalog = pyiceberg_catalog(config)
        table_name = config.table_ref(config.tables[0]).identifier

        def compacted() -> bool:
            assert_running(running, tmp_path)
            files = catalog.load_table(table_name).inspect.files()
            return all(content == 0 for content in files.column("content").to_pylist())

        wait_for(compacted, 240, "every partition to settle and lose its delete files")
    finally:
        for process in (ingester, running.get("compactor")):
            if process is not None:
                stop(process)
    assert running["compactor"].returncode == 0, (tmp_path / "compactor.log").read_text()[-3000:]

    # pyiceberg reads the table through the same catalog: no equality deletes are left to stop it.
    columns = ("id", "region", "amount", "updated_at")
    scanned = catalog.load_table(table_name).scan(selected_fields=columns).to_arrow().to_pylist()
    assert sorted(tuple(row[c] for c in columns) for row in scanned) == feed.src.expected_rows()

    # Both met the outage, said so, and rode it out: no error logged, each outage ended.
    ridden_out = {}
    for log in ("ingester.log", "compactor.log"):
        lines = json_lines(tmp_path / log)
        messages = [line["message"] for line in lines]
        assert any(m.startswith("the catalog does not answer") for m in messages), log
        ridden_out[log] = answered_again_after(lines)
        assert ridden_out[log], log
        assert not [line for line in lines if line["level"] == "error"], log
    # No outage is ridden out for longer than the server was away and a backoff after it.
    longest = restarted_at - stopped_at + 2 * settings.backoff_max_seconds
    assert max(max(seconds) for seconds in ridden_out.values()) <= longest, ridden_out
    print(
        f"PostgreSQL stopped at {dt.datetime.fromtimestamp(stopping, dt.timezone.utc):%H:%M:%S.%f}, down "
        f"{restarted_at - stopped_at:.1f}s, accepting again at {dt.datetime.fromtimestamp(started, dt.timezone.utc):%H:%M:%S.%f}; "
        f"outages ridden out (s): {ridden_out}"
    )
