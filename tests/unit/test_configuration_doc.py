"""docs/configuration.md lists every key of the configuration model, and only those, with the
model's defaults.

The page keeps one table per section whose header is ``| Key | Type | Default | Why |``. A
row's key is a dotted path in backticks (``compactor.settle.min_seconds``; list items as
``tables[].primary_key``). Its default is ``required`` or a YAML value in backticks, compared
with the model's default; words may follow the backticks.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from icecdc.runtime.config import Config, expand_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEADER = ["Key", "Type", "Default", "Why"]
REQUIRED = "required"


def _nested_model(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """How a field holds a model: itself ("model"), as list items ("list") or as dict values
    ("dict"); None for a plain value."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _nested_model(inner[0]) if len(inner) == 1 else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model", annotation
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return "list", args[0]
    if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return "dict", args[1]
    return None


def model_keys(model: type[BaseModel], prefix: str = "", defaults: BaseModel | None = None) -> dict[str, Any]:
    """Every leaf key of ``model`` as a dotted path, with its effective default (``REQUIRED``
    when it has none). ``defaults`` is the parent's default instance of this model, whose values
    win over the model's own (``ingest.http.port`` is 9401 where ``HttpConfig.port`` is None)."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        if defaults is not None:
            default = getattr(defaults, name)
        else:
            default = REQUIRED if field.is_required() else field.get_default(call_default_factory=True)
        nested = _nested_model(field.annotation)
        if nested is None:
            keys[key] = default
        elif nested[0] == "model":
            keys |= model_keys(nested[1], f"{key}.", default if isinstance(default, BaseModel) else None)
        elif nested[0] == "list":
            keys |= model_keys(nested[1], f"{key}[].")
        else:
            keys |= model_keys(nested[1], f"{key}.<name>.")
    return keys


def _cells(line: str) -> list[str] | None:
    if not line.startswith("|"):
        return None
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def documented_keys(markdown: str) -> dict[str, str]:
    """key -> its Default cell, from every table with the key header."""
    rows: dict[str, str] = {}
    in_table = False
    for line in markdown.splitlines():
        cells = _cells(line)
        if cells is None:
            in_table = False
        elif cells == HEADER:
            in_table = True
        elif in_table and not re.fullmatch(r"[|\-: ]+", line):
            key = re.fullmatch(r"`([^`]+)`", cells[0])
            assert key and len(cells) == len(HEADER), f"not a row of a key table: {line}"
            assert key.group(1) not in rows, f"{key.group(1)} is documented twice"
            assert all(cells[1:]), f"{key.group(1)}: every cell needs a value: {line}"
            rows[key.group(1)] = cells[2]
    return rows


def default_problem(key: str, cell: str, default: Any) -> str | None:
    """What is wrong with one documented default, or None."""
    if default == REQUIRED:
        return None if cell == REQUIRED else f"{key}: the model requires it, the doc says {cell!r}"
    value = re.match(r"`([^`]*)`", cell)
    if value is None:
        return f"{key}: the default cell must start with a value in backticks, not {cell!r}"
    documented = yaml.safe_load(value.group(1))
    expected = to_jsonable_python(default)
    return None if documented == expected else f"{key}: the doc says {documented!r}, the model {expected!r}"


def problems(markdown: str, keys: dict[str, Any]) -> list[str]:
    documented = documented_keys(markdown)
    found = [f"{key}: in the model, missing from docs/configuration.md" for key in keys if key not in documented]
    found += [f"{key}: in docs/configuration.md, not in the model" for key in documented if key not in keys]
    found += [p for key, cell in documented.items() if key in keys and (p := default_problem(key, cell, keys[key]))]
    return found


def test_the_page_documents_every_key_of_the_model_with_its_default():
    keys = model_keys(Config)
    assert "compactor.hot_read_budget" in keys and "tables[].primary_key" in keys, "the walk misses nested keys"
    assert keys["ingest.http.port"] == 9401 and keys["catalog.properties"] == REQUIRED
    found = problems(DOC.read_text(), keys)
    assert not found, "docs/configuration.md is out of step with icecdc/runtime/config.py:\n" + "\n".join(found)


def test_the_full_example_is_a_valid_configuration():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    examples = [yaml.safe_load(b) for b in blocks]
    examples = [e for e in examples if isinstance(e, dict) and "catalog" in e]
    assert examples, "docs/configuration.md has no full example (a yaml block with a catalog)"
    for example in examples:
        names = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", yaml.safe_dump(example)))
        Config.model_validate(expand_env(example, environ=dict.fromkeys(names, "x")))


TABLE = "| Key | Type | Default | Why |\n|---|---|---|---|\n"


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("| `a` | int | `5` | why |\n| `b.c` | text | required | why |\n", []),
        ("| `a` | int | `5` | why |\n", ["b.c: in the model, missing"]),
        ("| `a` | int | `5` | why |\n| `b.c` | text | required | why |\n| `z` | int | `1` | gone |\n", ["z: in docs"]),
        ("| `a` | int | `6` (six) | why |\n| `b.c` | text | required | why |\n", ["a: the doc says 6, the model 5"]),
        ("| `a` | int | 5 | why |\n| `b.c` | text | required | why |\n", ["a: the default cell must start"]),
    ],
)
def test_the_check_names_a_missing_an_extra_and_a_wrong_default(rows, expected):
    found = problems(TABLE + rows, {"a": 5, "b.c": REQUIRED})
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found, strict=True)), found
