"""The ``icecdc`` command: the product's commands declared in one short parser, the benchmarks'
options beside their code and loaded only for ``icecdc bench``, matplotlib only there; the
investigations (``python -m benchmarks``) outside the installed package."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import INVESTIGATIONS
from benchmarks.__main__ import build_parser as investigations_parser
from icecdc import bench, cli
from icecdc.bench import BENCHMARKS, INSTALL_HINT

try:
    import tomllib
except ImportError:  # Python 3.10, which the package supports
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_the_parser_declares_the_commands_and_no_benchmark_options():
    lines = inspect.getsource(cli.build_parser).splitlines()
    assert len(lines) < 100, f"build_parser is {len(lines)} lines: options belong beside the code they configure"


# Every module of the package but the benchmarks, imported, and a command parsed: neither loads a
# benchmark or matplotlib (a container without the bench extra has none).
IMPORT_ALL = """
import importlib, pkgutil, sys
packages = [p for p in sys.argv[1:] if p.split(".")[:2] != ["icecdc", "bench"]]
names = list(packages)
for package in packages:
    path = importlib.import_module(package).__path__
    names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(path) if not m.ispkg]
for name in names:
    importlib.import_module(name)
from icecdc.cli import build_parser
build_parser().parse_args(["ingest", "--config", "icecdc.yaml"])
print(len(names))
print(" ".join(m for m in sys.modules if m.split(".")[0] == "matplotlib" or m.startswith("icecdc.bench.")))
"""


def test_no_module_outside_the_benchmarks_imports_matplotlib_or_a_benchmark():
    run = subprocess.run([sys.executable, "-c", IMPORT_ALL, *PACKAGES], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    imported, loaded = run.stdout.splitlines()
    assert int(imported) > 50  # every module was reached, icecdc.ingest's and icecdc.compactor's too
    assert loaded == ""


def test_every_benchmark_declares_its_options_and_runs_from_them():
    parser = cli.build_parser()
    for benchmark in BENCHMARKS:
        args = parser.parse_args(["bench", benchmark.name, "--out", "elsewhere"])
        assert args.bench == benchmark.name and args.out == Path("elsewhere") and isinstance(args.state_dir, Path)
        module = sys.modules[benchmark.module]
        assert callable(module.add_arguments) and callable(module.main)
    assert parser.parse_args(["bench", "ingest", "--changes", "500"]).changes == 500


def test_every_investigation_declares_its_options_outside_the_package():
    parser = investigations_parser()
    for benchmark in INVESTIGATIONS:
        args = parser.parse_args([benchmark.name, "--out", "elsewhere"])
        assert args.bench == benchmark.name and args.out == Path("elsewhere")
        assert benchmark.module.startswith("benchmarks.")
        module = sys.modules[benchmark.module]
        assert callable(module.add_arguments) and callable(module.main)
    assert parser.parse_args(["manifests", "--rows", "500"]).rows == 500


def test_the_installed_package_holds_no_investigation():
    moved = {b.module.split(".")[-1] for b in INVESTIGATIONS}
    assert not [p for p in PACKAGES if p.split(".")[0] == "benchmarks" or p.split(".")[-1] in moved]
    in_package = {path.stem for path in (ROOT / "icecdc" / "bench").rglob("*.py")}
    assert not in_package & moved and not {b.name for b in BENCHMARKS} & {b.name for b in INVESTIGATIONS}
    importers = [
        str(path.relative_to(ROOT))
        for folder in ("icecdc", "ingest", "compactor", "coordinator")
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"^\s*(from|import) benchmarks\b", path.read_text(), re.MULTILINE)
    ]
    assert not importers, f"the product imports the investigations: {importers}"


def test_a_benchmark_runs_its_module(monkeypatch):
    from icecdc.bench import ingest

    seen = []
    monkeypatch.setattr(ingest, "main", lambda args: seen.append(args.changes) or 0)
    assert cli.main(["bench", "ingest", "--changes", "7"]) == 0
    assert seen == [7]


def test_an_investigation_runs_its_module(monkeypatch):
    from benchmarks import manifests
    from benchmarks.__main__ import main

    seen = []
    monkeypatch.setattr(manifests, "main", lambda args: seen.append(args.rows) or 0)
    assert main(["manifests", "--rows", "7"]) == 0
    assert seen == [7]


def test_a_benchmark_without_matplotlib_says_how_to_install_it(monkeypatch, capsys):
    from icecdc.bench import ingest

    def measured(args):
        raise AssertionError("the benchmark ran without matplotlib to plot it")

    monkeypatch.setattr(ingest, "main", measured)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails as if not installed
    assert cli.main(["bench", "ingest"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and INSTALL_HINT in err, err


def test_the_bench_extra_holds_matplotlib_and_the_package_does_not():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("matplotlib")]
    assert [d for d in project["optional-dependencies"]["bench"] if d.startswith("matplotlib")]
    installed = re.search(r"-e '\.\[([a-z,]+)\]'", (ROOT / "scripts" / "setup.sh").read_text())
    assert installed and {"test", "bench"} <= set(installed.group(1).split(","))


@pytest.mark.parametrize("text", ["0,4", "x", "1,,2"])
def test_lists_of_positive_numbers_are_checked(text):
    from icecdc.domain.errors import UserError

    with pytest.raises(UserError, match="--sizes"):
        bench.positive_numbers(text, "--sizes")


def test_key_value_options_split_at_the_first_equals_or_are_refused():
    from icecdc.domain.errors import UserError

    assert bench.key_value(" write.target=a=b ", "--table-property") == ("write.target", "a=b")
    assert bench.key_value("k=", "--table-property") == ("k", "")
    assert bench.table_properties_said({"b": "2", "a": "1"}) == "table property a=1; table property b=2; "
    assert bench.table_properties_said({}) == ""
    for text in ("k", "=v", " =v"):
        with pytest.raises(UserError, match="--table-property wants KEY=VALUE"):
            bench.key_value(text, "--table-property")


def test_portable_snapshot_names_a_table_the_config_does_not_have(capsys, monkeypatch):
    # Refused before any catalog is opened: exit 2 and the name, as for every user error.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "unused")
    assert cli.main(["portable-snapshot", "--config", str(ROOT / "docker" / "icecdc.yaml"), "--table", "nope"]) == 2
    assert "not a configured table: nope" in capsys.readouterr().err
