"""A throwaway PostgreSQL cluster for the demo and the tests: ``initdb`` into a directory,
logical decoding on, loopback only on a free port, trust authentication, started and stopped
with ``pg_ctl``.

The binaries are Debian's ``postgresql`` package, found in ``/usr/lib/postgresql/<major>/bin``
(or on PATH, or in ``$ICECDC_PG_BINDIR``) and installed by scripts/setup.sh. Not the wheels:
their major is newer than the ones Debezium's connector is tested against, and Debian's package
brings the ``postgres`` system user a root set-up needs to run the server as.

Run as root, every server command runs as the ``postgres`` user, which must reach the data
directory: without a directory of its own the cluster lives in a fresh one under the system
temp directory and is removed on stop.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icecdc.domain.errors import UserError
from icecdc.runtime.broker import free_port

if TYPE_CHECKING:
    import psycopg

SERVER_USER = "postgres"
DEBIAN_BINARIES = Path("/usr/lib/postgresql")
# Logical decoding for Debezium; durability off, since the cluster is thrown away with the test.
# ``synchronous_commit`` stays on, PostgreSQL's default: with it off, a commit reaches the WAL
# sender, and so Debezium, only at the WAL writer's next flush (``wal_writer_delay``), a delay
# users do not have and the latency bench would count as the pipeline's.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "wal_level": "logical",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
}


class PostgresError(UserError):
    """PostgreSQL's binaries are missing, or the throwaway cluster cannot start."""


def server_bindir(environ: dict[str, str] | None = None) -> Path:
    """Where ``initdb`` and ``pg_ctl`` are: ``$ICECDC_PG_BINDIR``, else beside ``initdb`` on
    PATH, else the newest major under Debian's /usr/lib/postgresql (not on PATH there)."""
    env = os.environ if environ is None else environ
    if env.get("ICECDC_PG_BINDIR"):
        return Path(env["ICECDC_PG_BINDIR"])
    on_path = shutil.which("initdb", path=env.get("PATH"))
    if on_path:
        return Path(on_path).resolve().parent
    majors = sorted(
        (p for p in DEBIAN_BINARIES.glob("*/bin") if (p / "initdb").exists() and p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
    )
    if majors:
        return majors[-1]
    raise PostgresError(
        "PostgreSQL's server binaries (initdb, pg_ctl) are missing: install them (as root: apt-get install -y postgresql, "
        "or run scripts/setup.sh) or point ICECDC_PG_BINDIR at their directory"
    )


def _reachable_by(directory: Path, uid: int) -> bool:
    """True if every parent of ``directory`` lets ``uid`` pass (owner or world execute bit)."""
    for parent in directory.resolve().parents:
        info = parent.stat()
        if info.st_uid != uid and not info.st_mode & stat.S_IXOTH:
            return False
    return True


@dataclass
class ThrowawayPostgres:
    """A PostgreSQL cluster in ``directory`` (a fresh temp directory if none), listening on
    127.0.0.1:``port`` (a free one if 0), superuser ``postgres`` without a password."""

    directory: Path | None = None
    port: int = 0
    host: str = "127.0.0.1"
    user: str = "postgres"
    database: str = "postgres"
    bindir: Path | None = None
    _owned_directory: bool = field(default=False, init=False, repr=False)

    @property
    def data_directory(self) -> Path:
        assert self.directory is not None, "start() chooses the directory"
        return self.directory / "data"

    @property
    def log_file(self) -> Path:
        assert self.directory is not None, "start() chooses the directory"
        return self.directory / "postgres.log"

    @property
    def conninfo(self) -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={self.database}"

    def _server_account(self) -> pwd.struct_passwd | None:
        """The account the server runs as when we are root (it refuses root); None otherwise."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise PostgresError(
                f"running as root, the server needs the system user {SERVER_USER!r}, which Debian's postgresql package creates"
            ) from None

    def _run(self, *args: str, timeout: float) -> None:
        account = self._server_account()
        command = [str((self.bindir or server_bindir()) / args[0]), *args[1:]]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.directory,
            check=False,
            user=account.pw_uid if account else None,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
        )
        if result.returncode != 0:
            raise PostgresError(f"{' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")

    def _prepare_directory(self) -> None:
        account = self._server_account()
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="icecdc-pg-"))
            self._owned_directory = True
        self.directory.mkdir(parents=True, exist_ok=True)
        if account is not None:
            if not _reachable_by(self.directory, account.pw_uid):
                raise PostgresError(
                    f"the server runs as {SERVER_USER!r} (we are root), which cannot reach {self.directory}: "
                    "choose a directory under one it can enter, e.g. the system temp directory"
                )
            os.chown(self.directory, account.pw_uid, account.pw_gid)

    def start(self, timeout: float = 60.0) -> None:
        """Create the cluster on first use, then start it; it keeps its data across restarts."""
        self._prepare_directory()
        if not (self.data_directory / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                str(self.data_directory),
                "-U",
                self.user,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                timeout=timeout,
            )
            with (self.data_directory / "postgresql.conf").open("a") as conf:
                conf.writelines(f"{name} = {value}\n" for name, value in SETTINGS.items())
        if not self.port:
            self.port = free_port()
        self._run(
            "pg_ctl",
            "start",
            "-D",
            str(self.data_directory),
            "-l",
            str(self.log_file),
            "-w",
            "-t",
            str(int(timeout)),
            "-o",
            f"-p {self.port}",
            timeout=timeout + 10,
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the server (fast: open sessions are ended); a cluster in a directory of its own is removed."""
        if self.directory is None or not (self.data_directory / "postmaster.pid").exists():
            return
        self._run(
            "pg_ctl", "stop", "-D", str(self.data_directory), "-m", "fast", "-w", "-t", str(int(timeout)), timeout=timeout + 10
        )
        if self._owned_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
            self._owned_directory = False

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection to the cluster, autocommit unless told otherwise."""
        try:
            import psycopg
        except ImportError:
            raise PostgresError("connecting to PostgreSQL needs the postgres extra: pip install 'icecdc[postgres]'") from None
        return psycopg.connect(self.conninfo, **{"autocommit": True, **kwargs})

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
