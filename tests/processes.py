"""Running ``icecdc`` commands as separate processes, as users and Kubernetes do, with an
optional crash point (see icecdc/runtime/failpoints.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from icecdc.runtime.config import Config


def write_config(config: Config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


def icecdc_process(
    *args: str, failpoint: str | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "ICECDC_FAILPOINT"}, **(env or {})}
    if failpoint:
        env["ICECDC_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "icecdc.cli", *args], check=False, env=env, capture_output=True, text=True, timeout=timeout
    )


def start_icecdc(*args: str, log: Path, failpoint: str | None = None, own_group: bool = False) -> subprocess.Popen:
    """A long-running ``icecdc`` command in the background, its output in ``log``; with
    ``own_group``, in a process group of its own (its id the command's pid), as a service
    manager starts it, so that a signal can be sent to the command and its Spark JVM at once."""
    env = {k: v for k, v in os.environ.items() if k != "ICECDC_FAILPOINT"}
    if failpoint:
        env["ICECDC_FAILPOINT"] = failpoint
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "icecdc.cli", *args],
            env=env,
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
