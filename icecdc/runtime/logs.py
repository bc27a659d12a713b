"""Logging for every icecdc command: human lines or one JSON object per line (for log
pipelines), with the domain fields a record carries (table, partition, snapshot id, ...) as
top-level keys, and every configured secret masked wherever it would appear.

Secrets are registered by ``load_config`` (any value whose key looks like a password, token,
secret or credential); the mask applies to the final formatted line, so a secret cannot leak
through a message, its arguments, an exception or a library's log record.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

import orjson

MASK = "***"
# The fields icecdc attaches to its records (``extra=``) and the JSON format lifts to top level.
FIELDS = ("table", "partition", "snapshot_id", "sequence_number", "batch_id", "kind", "outcome", "replica", "records")
_secrets: set[str] = set()


def register_secrets(values: Iterable[str]) -> None:
    # Very short values would mask ordinary words; a real secret is longer than three characters.
    _secrets.update(v for v in values if isinstance(v, str) and len(v) > 3)


def mask(text: str) -> str:
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class _Masking(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record))


class JsonFormatter(_Masking):
    def __init__(self) -> None:
        super().__init__()
        self.converter = time.gmtime  # the timestamps say "Z": UTC, whatever the host's zone

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                document[name] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return mask(orjson.dumps(document, default=str).decode())


def setup_logging(verbose: bool = False, json_format: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter = JsonFormatter() if json_format else _Masking("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # py4j logs every gateway call at INFO; pyiceberg announces its FileIO choice on every load.
    for chatty in ("py4j", "pyiceberg"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
