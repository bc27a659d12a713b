"""Structured logs, secret masking and the health logic, without a server or a cluster."""

from __future__ import annotations

import logging

import orjson

from icecdc.runtime.config import parse_config
from icecdc.runtime.health import Health, cached
from icecdc.runtime.logs import JsonFormatter, mask


def record(message: str, *args, **extra) -> logging.LogRecord:
    entry = logging.LogRecord("icecdc.test", logging.INFO, __file__, 1, message, args, None)
    entry.__dict__.update(extra)
    return entry


def test_json_lines_carry_the_domain_fields():
    line = JsonFormatter().format(record("compacted %s", "p=1", table="db.t", partition="p=1", snapshot_id=42))
    document = orjson.loads(line)
    assert document["message"] == "compacted p=1" and document["level"] == "info"
    assert (document["table"], document["partition"], document["snapshot_id"]) == ("db.t", "p=1", 42)
    assert document["ts"].endswith("Z")


def test_configured_secrets_are_masked_in_every_line():
    parse_config(
        {
            "kafka": {"properties": {"sasl.password": "hunter2-kafka"}},
            "catalog": {"properties": {"type": "rest", "token": "tok-3f9a2c"}},
        }
    )
    line = JsonFormatter().format(record("connect with %s and %s", "hunter2-kafka", "tok-3f9a2c"))
    assert "hunter2-kafka" not in line and "tok-3f9a2c" not in line and "***" in line
    assert mask("nothing secret here") == "nothing secret here"


def test_liveness_follows_the_loop_heartbeat():
    now = [0.0]
    health = Health(stall_seconds=60, clock=lambda: now[0])
    assert health.liveness()[0]
    now[0] = 61
    assert not health.liveness()[0]
    health.beat()
    assert health.liveness()[0]


def test_readiness_needs_every_check_and_reports_failures():
    health = Health(60)
    assert not health.readiness()[0]  # nothing known yet
    health.mark("kafka", True, "assigned")
    health.add_check("catalog", lambda: (_ for _ in ()).throw(ConnectionError("refused")))
    ok, checks = health.readiness()
    assert not ok and "refused" in checks["catalog"]["detail"] and checks["kafka"]["ok"]


def test_cached_checks_are_not_repeated_within_their_interval():
    calls, now = [], [0.0]
    check = cached(lambda: calls.append(1) or (True, "ok"), 10, clock=lambda: now[0])
    check(), check()
    now[0] = 11
    check()
    assert len(calls) == 2
