"""Running ``icecdc`` commands as separate processes, as users and Kubernetes do, with an
optional crash point (see icecdc/failpoints.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from icecdc.config import Config


def write_config(config: Config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True)))
    return path


def icecdc_process(*args: str, failpoint: str | None = None, timeout: float = 600,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "ICECDC_FAILPOINT"}, **(env or {})}
    if failpoint:
        env["ICECDC_FAILPOINT"] = failpoint
    return subprocess.run([sys.executable, "-m", "icecdc.cli", *args], check=False, env=env,
                          capture_output=True, text=True, timeout=timeout)
