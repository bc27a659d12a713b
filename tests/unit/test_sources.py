"""The real source's decisions that need no database or JVM: where PostgreSQL's binaries are, who
can reach a data directory, the connector's properties, and the engine process's spec."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from icecdc.runtime.config import KafkaConfig
from icecdc.testbed import postgres
from icecdc.testbed.connector import DebeziumPostgresSource, EngineSpec
from icecdc.testbed.postgres import PostgresError, ThrowawayPostgres, server_bindir


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_binaries_from_the_environment_then_path_then_the_newest_debian_major(tmp_path, monkeypatch):
    debian = tmp_path / "lib" / "postgresql"
    for major in ("9", "15", "13"):
        executable(debian / major / "bin" / "initdb")
    monkeypatch.setattr(postgres, "DEBIAN_BINARIES", debian)
    on_path = executable(tmp_path / "path" / "initdb")

    assert server_bindir({"ICECDC_PG_BINDIR": "/opt/pg/bin", "PATH": str(on_path.parent)}) == Path("/opt/pg/bin")
    assert server_bindir({"PATH": str(on_path.parent)}) == on_path.parent
    assert server_bindir({"PATH": str(tmp_path / "empty")}) == debian / "15" / "bin"


def test_missing_binaries_say_how_to_install_them(tmp_path, monkeypatch):
    monkeypatch.setattr(postgres, "DEBIAN_BINARIES", tmp_path / "none")
    with pytest.raises(PostgresError, match="apt-get install -y postgresql"):
        server_bindir({"PATH": str(tmp_path)})


def test_a_directory_is_reachable_when_every_parent_lets_the_user_pass(tmp_path):
    other_user = os.getuid() + 4242
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    assert not postgres._reachable_by(private / "cluster", other_user)
    assert postgres._reachable_by(private / "cluster", os.getuid()), "the owner passes"
    with tempfile.TemporaryDirectory() as shared:  # the system temp directory: world-passable
        assert postgres._reachable_by(Path(shared), other_user)


def test_connector_properties_take_the_callers_overrides(tmp_path):
    database = ThrowawayPostgres(port=5999)
    source = DebeziumPostgresSource(
        tmp_path,
        database,
        KafkaConfig(bootstrap_servers="b:9092"),
        "shop",
        slot_name="s1",
        properties={"snapshot.mode": "no_data"},
    )
    properties = source.spec().properties
    assert properties["database.port"] == "5999"
    assert properties["plugin.name"] == "pgoutput"
    assert properties["skipped.operations"] == "none", "TRUNCATE is captured"
    assert properties["offset.storage.file.filename"] == str(tmp_path / "offsets.dat")
    assert properties["slot.name"] == "s1" and properties["publication.name"] == "s1_publication"
    assert properties["snapshot.mode"] == "no_data"
    assert source.topic("orders") == "shop.public.orders"


def test_engine_spec_survives_its_json_file():
    spec = EngineSpec(
        KafkaConfig(bootstrap_servers="b:9092", properties={"security.protocol": "SSL", "linger.ms": 7}),
        {"topic.prefix": "shop"},
        topic_partitions=3,
        jvm_options=("-Xmx256m",),
    )
    assert EngineSpec.from_json(spec.to_json()) == spec
