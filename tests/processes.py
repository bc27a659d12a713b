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


def start_icecdc(*args: str, log: Path, failpoint: str | None = None) -> subprocess.Popen:
    """A long-running ``icecdc`` command in the background, its output in ``log``."""
    env = {k: v for k, v in os.environ.items() if k != "ICECDC_FAILPOINT"}
    if failpoint:
        env["ICECDC_FAILPOINT"] = failpoint
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "icecdc.cli", *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def is_stopped(process: subprocess.Popen) -> bool:
    """True once the process is frozen by SIGSTOP (state T in /proc)."""
    stat = Path(f"/proc/{process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")
