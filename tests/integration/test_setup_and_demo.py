"""The README's set-up is idempotent, and the demo (the main job) runs end to end."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from icecdc.runtime.broker import free_port

ROOT = Path(__file__).resolve().parents[2]


def venv_listing() -> dict[str, float]:
    """Every file of the active virtualenv with its modification time."""
    prefix = Path(sys.prefix)
    return {str(p): p.stat().st_mtime for p in prefix.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_setup_twice_changes_nothing_the_second_time():
    env = {**os.environ, "VENV": sys.prefix}
    subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, check=True, capture_output=True)
    before = venv_listing()
    second = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    assert "setup: up to date" in second.stdout
    assert venv_listing() == before


@pytest.mark.slow
def test_demo_runs_on_the_embedded_stack(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "icecdc.cli", "demo", "--state-dir", str(tmp_path), "--port", str(free_port())],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The demo checks the table against the state its own change feed implies, and says so.
    assert "holds exactly the" in result.stdout
    assert "2 malformed records sent to icecdc.dlq" in result.stdout
    # The compactor ran beside the ingester and left every partition merged.
    committed = re.search(r"compactor: (\d+) compactions committed", result.stdout)
    assert committed and int(committed.group(1)) > 0, result.stdout
    assert "every partition has settled and holds no equality-delete file" in result.stdout
    assert (tmp_path / "icecdc.yaml").is_file() and (tmp_path / "catalog.db").is_file()
    # The broker it started is stopped again.
    assert "broker stopped" in result.stdout
