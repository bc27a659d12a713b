"""The README's set-up is idempotent, and the demo (the main job) runs end to end: from PostgreSQL
through the real Debezium connector by default, or says clearly what it lacks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from icecdc.demo import postgres_missing
from icecdc.runtime.broker import free_port
from tests.processes import command_env

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


def run_demo(state_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "icecdc.cli", "demo", "--state-dir", str(state_dir), "--port", str(free_port()), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=command_env(extra=env),
    )


@pytest.mark.slow
def test_demo_runs_from_postgres_through_debezium(tmp_path):
    if postgres_missing():
        pytest.skip(postgres_missing())
    result = run_demo(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The real connector read the database's snapshot, then its replication stream.
    assert "Debezium: snapshot read, streaming orders's changes to shop.public.orders" in result.stdout
    assert re.search(r"PostgreSQL: \d+ transactions committed \(.*\), [1-9]\d* rolled back", result.stdout), result.stdout
    # The demo checks the table against PostgreSQL's own rows, and says so.
    assert re.search(r"check: lake\.demo\.orders holds exactly the [1-9]\d* rows PostgreSQL holds \(SELECT \*\)", result.stdout)
    assert "0 malformed records sent to icecdc.dlq" in result.stdout
    # Beside it, a plain Spark foreachBatch MERGE job wrote a table the sidecar keeps by name alone:
    # none of its commits was refused, and the table holds exactly the rows its batches imply.
    job = re.search(
        r"check: lake\.demo\.customers \(a Spark foreachBatch MERGE job, merge-on-read\) had ([1-9]\d*) commits, 0 refused, "
        r"and holds exactly the job's ([1-9]\d*) rows",
        result.stdout,
    )
    assert job, result.stdout
    assert "demo.customers" in result.stdout.split("every partition has settled")[-1], "its partitions in the status table"
    # The compactor ran beside the ingester and left every partition merged.
    committed = re.search(r"compactor: (\d+) compactions committed", result.stdout)
    assert committed and int(committed.group(1)) > 0, result.stdout
    assert "every partition has settled and holds no equality-delete file" in result.stdout
    assert (tmp_path / "icecdc.yaml").is_file() and (tmp_path / "catalog.db").is_file()
    # What it started is stopped again.
    assert all(f"{part} stopped" in result.stdout for part in ("Debezium", "PostgreSQL", "broker"))


def test_demo_without_postgres_says_how_to_install_it_or_run_synthetic(tmp_path):
    result = run_demo(tmp_path, env={"ICECDC_PG_BINDIR": str(tmp_path / "no-postgres")}, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "apt-get install -y postgresql" in result.stderr or "icecdc[postgres]" in result.stderr
    assert "icecdc demo --source synthetic" in result.stderr
    assert not (tmp_path / "broker").exists(), "nothing started"
