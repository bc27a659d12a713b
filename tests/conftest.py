"""Shared fixtures: one embedded broker and one Spark session (with its own SQLite catalog and
warehouse) per test run, since a JVM holds one Spark session and starting either costs seconds."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icecdc.runtime.broker import EmbeddedBroker, free_port
from icecdc.runtime.config import Config, embedded_config
from tests.jvm_archive import archive_options, ensure_archive
from tests.processes import TEST_JVM_OPTIONS, with_jvm_options

# Files whose tests share nothing (each bench smoke test runs a whole ``icecdc bench`` or
# ``python -m benchmarks`` in its own process): under ``--dist loadfile`` each of their tests is a
# unit of its own, since kept together they would be the suite's longest path on one worker.
INDEPENDENT_TEST_FILES = frozenset({"tests/integration/test_benchmarks.py"})


def pytest_configure(config: pytest.Config) -> None:
    """The Spark JVMs this run starts get the tests' options (tests/processes.py says why) and
    the class archive (tests/jvm_archive.py), which the first process makes before the workers
    start, unless the run is unit tests alone."""
    unit_tests_alone = bool(config.args) and all(a.startswith("tests/unit") for a in config.args)
    if not hasattr(config, "workerinput") and not unit_tests_alone:
        ensure_archive()
    os.environ["SPARK_SUBMIT_OPTS"] = with_jvm_options(os.environ.get("SPARK_SUBMIT_OPTS"), TEST_JVM_OPTIONS + archive_options())


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (the Makefile's): a file's tests run on one worker, so module fixtures
    (a PostgreSQL cluster, a Debezium run) are made once, except in ``INDEPENDENT_TEST_FILES``.
    A scheduler, not ``xdist_group`` marks: loadgroup ignores them with pytest 9 and xdist 3.8."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesExceptIndependentTests(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in INDEPENDENT_TEST_FILES else path

    return FilesExceptIndependentTests(config, log)


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("icecdc-state")


@pytest.fixture(scope="session")
def broker(state_dir: Path) -> Iterator[EmbeddedBroker]:
    embedded = EmbeddedBroker(state_dir / "broker", free_port())
    embedded.start()
    yield embedded
    embedded.stop()


@pytest.fixture(scope="session")
def stack_config(state_dir: Path, broker: EmbeddedBroker) -> Config:
    """The embedded default, pointed at the test broker; tests add their own tables."""
    return embedded_config(state_dir, broker.port)


@pytest.fixture(scope="session")
def spark(stack_config: Config):
    from icecdc.runtime.spark import create_spark_session

    session = create_spark_session(stack_config, "icecdc-tests")
    yield session
    session.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for table and topic names, so tests sharing the stack never collide."""
    return uuid.uuid4().hex[:8]
