"""Prometheus metrics and health endpoints over HTTP, for the ingester and the compactor alike.

- ``/metrics``: the Prometheus text format;
- ``/healthz`` (liveness): the command's main loop has made progress within ``stall_seconds``
  (a loop stuck for longer is worth a restart; a long compaction or batch is not, so the default
  is generous);
- ``/readyz`` (readiness): every check passes; each command registers what "ready" means for it
  (its Kafka consumer has its assignment, its catalog answers).

Both answer JSON with each check's detail, 200 when healthy and 503 when not.
"""

from __future__ import annotations

import logging
import socketserver
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import make_wsgi_app

from icecdc.domain.errors import UserError
from icecdc.runtime.config import HttpConfig

log = logging.getLogger(__name__)
Check = Callable[[], tuple[bool, str]]


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # probes every few seconds are not news
        pass


class Health:
    """What the probes report: a heartbeat from the main loop, and named readiness checks."""

    def __init__(self, stall_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stall_seconds = stall_seconds
        self._clock = clock
        self._last_beat = clock()
        self._marks: dict[str, tuple[bool, str]] = {}
        self._checks: dict[str, Check] = {}

    def beat(self) -> None:
        self._last_beat = self._clock()

    def mark(self, name: str, ok: bool, detail: str) -> None:
        """Record the state of something the main loop learns as it goes (a consumer's assignment)."""
        self._marks[name] = (ok, detail)

    def add_check(self, name: str, check: Check) -> None:
        """A check evaluated on each probe (cache it if it is costly)."""
        self._checks[name] = check

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        age = self._clock() - self._last_beat
        ok = age < self._stall_seconds
        return ok, {"loop": {"ok": ok, "detail": f"last progress {age:.0f}s ago (stall after {self._stall_seconds:.0f}s)"}}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        results = dict(self._marks)
        for name, check in self._checks.items():
            try:
                results[name] = check()
            except Exception as exc:  # noqa: BLE001 - a failing check means "not ready", with the reason
                results[name] = (False, f"{type(exc).__name__}: {exc}")
        if not results:
            results["starting"] = (False, "nothing checked yet")
        return all(ok for ok, _ in results.values()), {k: {"ok": ok, "detail": d} for k, (ok, d) in results.items()}


def cached(check: Check, seconds: float, clock: Callable[[], float] = time.monotonic) -> Check:
    """A check re-evaluated at most every ``seconds`` (probes must not hammer a catalog)."""
    state: dict[str, Any] = {"at": float("-inf"), "result": (False, "not checked yet")}
    lock = threading.Lock()

    def run() -> tuple[bool, str]:
        with lock:
            if clock() - state["at"] >= seconds:
                try:
                    state["result"] = check()
                except Exception as exc:  # noqa: BLE001 - reported as not ready
                    state["result"] = (False, f"{type(exc).__name__}: {exc}")
                state["at"] = clock()
            return state["result"]

    return run


@contextmanager
def serving(settings: HttpConfig, checks: dict[str, Check], pending: Mapping[str, str] | None = None) -> Iterator[Health]:
    """The Health of a long-running command, served on ``settings`` while the block runs.
    ``pending`` names what the main loop marks ready later (name -> why not yet): marked not
    ready before the first probe can come, so that readiness never passes on the checks alone."""
    health = Health(settings.stall_seconds)
    for name, check in checks.items():
        health.add_check(name, check)
    for name, detail in (pending or {}).items():
        health.mark(name, False, detail)
    server = HealthServer(settings, health).start()
    try:
        yield health
    finally:
        server.stop()


class HealthServer:
    def __init__(self, settings: HttpConfig, health: Health) -> None:
        self._settings = settings
        self._health = health
        self._metrics = make_wsgi_app()
        self._server: _Server | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server else (self._settings.port or 0)

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path in ("/healthz", "/readyz"):
            ok, checks = self._health.liveness() if path == "/healthz" else self._health.readiness()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")])
            return [orjson.dumps({"ok": ok, "checks": checks})]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    def start(self) -> HealthServer:
        if self._settings.port is None:
            return self
        try:
            self._server = make_server(
                self._settings.host, self._settings.port, self._app, server_class=_Server, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise UserError(
                f"cannot serve metrics and health on {self._settings.host}:{self._settings.port}: "
                f"{exc.strerror} (set the http.port of this command in the config, or null to disable)"
            ) from None
        threading.Thread(target=self._server.serve_forever, name="icecdc-http", daemon=True).start()
        log.info("metrics and health on http://%s:%d (/metrics, /healthz, /readyz)", self._settings.host, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
