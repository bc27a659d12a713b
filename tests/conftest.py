"""Shared fixtures: one embedded broker and one Spark session (with its own SQLite catalog and
warehouse) per test run, since a JVM holds one Spark session and starting either costs seconds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from icecdc.runtime.broker import EmbeddedBroker, free_port
from icecdc.runtime.config import Config, embedded_config


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding slow or bench tests run first. pytest-xdist hands whole files to workers in
    collection order (``--dist loadfile``), so a long file collected last leaves one worker
    running it alone at the end; longest first, the many short files even the workers out."""
    heavy = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("bench")}
    items.sort(key=lambda item: item.path not in heavy)  # stable: files and tests keep their order


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
