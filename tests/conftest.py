"""Shared fixtures: one embedded broker and one Spark session (with its own SQLite catalog and
warehouse) per test run, since a JVM holds one Spark session and starting either costs seconds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icecdc.runtime.broker import EmbeddedBroker, free_port
from icecdc.runtime.config import Config, embedded_config


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
