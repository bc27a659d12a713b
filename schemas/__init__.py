"""JSON Schemas of what icecdc reads and writes on Kafka; shipped as documentation and used by
the code to validate (compiled once with fastjsonschema: validation sits on the ingest path).

``icecdc.schemas`` lives in the repository's top-level ``schemas/`` folder (the design card's
layout), with the ``*.schema.json`` files themselves."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import fastjsonschema

DEBEZIUM_ENVELOPE = "debezium-envelope"
COMMIT_EVENT = "commit-event"
COMPACTION_EVENT = "compaction-event"
MAINTENANCE_EVENT = "maintenance-event"

SchemaError = fastjsonschema.JsonSchemaValueException


def load_schema(name: str) -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath(f"{name}.schema.json").read_text())


@functools.cache
def validator(name: str, definition: str | None = None) -> Callable[[Any], Any]:
    """A compiled validator for the named schema, or for one of its ``definitions`` (the
    Debezium payload alone, once unwrapped, is checked twice as fast as the whole oneOf);
    it raises SchemaError naming the failing path."""
    schema = load_schema(name)
    if definition is not None:
        schema = {**schema, "$ref": f"#/definitions/{definition}"}
        schema.pop("oneOf", None)
    return fastjsonschema.compile(schema)
