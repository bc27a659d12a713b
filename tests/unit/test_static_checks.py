"""The code's shape, checked by the suite: one direction of dependencies (import-linter), types
(mypy: strict on the pure modules), the Java adapter as the only place that touches py4j, every
package in the wheel, formatting and lint rules (ruff).

The repository keeps the design card's top-level folders (``ingest/`` installed as
``icecdc.ingest``, ...), which tools that walk a package's folder do not follow; they run on a
mirror of the installed layout under ``.static-mirror/``, kept in place between runs so that
mypy's cache stays warm.
"""

from __future__ import annotations

import ast
import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / ".static-mirror"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
ADAPTER = "icecdc.jvm"
# What reaching the JVM looks like from Python: the gateway, the JVM view, the Java side of a
# session or a frame, and the Java exception behind a Python one.
PY4J_ATTRIBUTES = {"_jvm", "_gateway", "_jsparkSession", "_jsc", "_jdf", "java_exception", "_java_lang_class"}


def package_files() -> dict[str, Path]:
    """Module name -> source file, for every module of the installed package."""
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            relative = path.relative_to(base).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([package, *parts])
            # a subpackage folder that has its own entry in package-dir is listed from there
            if not any(
                name.startswith(f"{other}.") or name == other
                for other in PACKAGE_DIRS
                if other != package and other.startswith(f"{package}.")
            ):
                modules[name] = path
    return modules


def _copy_changed(source: Path, target: Path) -> None:
    if not target.exists() or not filecmp.cmp(source, target, shallow=False):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def mirror() -> Path:
    """The installed layout (``icecdc/ingest/...``) as files, updated in place, with the
    investigations (benchmarks/, not installed), which import the package, beside it."""
    wanted = set()
    for name, source in package_files().items():
        target = MIRROR / Path(*name.split(".")).with_suffix(".py")
        if source.name == "__init__.py":
            target = target.with_suffix("") / "__init__.py"
        wanted.add(target)
        _copy_changed(source, target)
    for source in (ROOT / "benchmarks").glob("*.py"):
        wanted.add(MIRROR / "benchmarks" / source.name)
        _copy_changed(source, MIRROR / "benchmarks" / source.name)
    for stale in MIRROR.rglob("*.py"):
        if stale not in wanted:
            stale.unlink()
    return MIRROR


def run(*command: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)


def readable(output: str) -> str:
    """Paths in the mirror, pointed back at the repository's files."""
    for name, source in package_files().items():
        mirrored = str(Path(".static-mirror", *name.split(".")).with_suffix(".py"))
        output = output.replace(mirrored, str(source.relative_to(ROOT)))
    return output


def test_every_package_is_listed_for_the_wheel():
    packages = {name for name, path in package_files().items() if path.name == "__init__.py"}
    assert packages == set(PYPROJECT["tool"]["setuptools"]["packages"])


def test_every_java_source_is_shipped_in_the_wheel():
    # Compiled in the JVM at run time (``JavaBridge.updates``): a source the wheel leaves out
    # fails the first commit of an installed ingester.
    sources = sorted((ROOT / "icecdc" / "jvm" / "java").glob("*.java"))
    assert sources
    shipped = PYPROJECT["tool"]["setuptools"]["package-data"]["icecdc.jvm"]
    assert all(any(source.match(f"icecdc/jvm/{pattern}") for pattern in shipped) for source in sources)


def test_layers_hold_and_decisions_stay_pure():
    # (import-linter puts its working directory first on the import path)
    result = run(str(Path(sys.executable).parent / "lint-imports"), "--config", str(ROOT / "pyproject.toml"), cwd=mirror())
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_types_check():
    mirror()
    result = run(
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(ROOT / ".mypy_cache"),
        "icecdc",
        "benchmarks",
        cwd=MIRROR,
    )
    assert result.returncode == 0, readable(result.stdout[-8000:] + result.stderr[-2000:])


def test_no_py4j_outside_the_java_adapter():
    offenders = []
    for name, path in package_files().items():
        if name == ADAPTER or name.startswith(f"{ADAPTER}."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            imported = (
                node.module or ""
                if isinstance(node, ast.ImportFrom)
                else ",".join(a.name for a in node.names)
                if isinstance(node, ast.Import)
                else ""
            )
            if (isinstance(node, ast.Attribute) and node.attr in PY4J_ATTRIBUTES) or "py4j" in imported:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"py4j reached outside {ADAPTER}: {offenders}"


@pytest.mark.parametrize("check", [("check",), ("format", "--check", "--diff")], ids=["lint", "format"])
def test_ruff(check):
    result = run(sys.executable, "-m", "ruff", *check, ".")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
