"""Every file, test and doc section that the docs and the code's comments cite exists.

Read from README.md, docs/*.md, the files under docker/, and the comments and docstrings of the
Python under icecdc/, ingest/, compactor/, coordinator/, schemas/, tests/, docker/ and the
investigation benches' top-level folder (benchmarks):

- repo-relative paths (``docs/ingest.md``, ``compactor/plans.py``, ``icecdc/jvm/``), and
  ``path::test_name``, whose test function must be defined in that file;
- a bare test file name (``test_global_deletes.py``) or, in the docs, a test function in
  backticks: somewhere under tests/;
- markdown links (``[x](coordinator.md#ownership)``), relative to the document, with the anchor
  resolved against the target's headings by GitHub's rules;
- section citations: a doc followed by a quoted section, with or without a comma or a
  parenthesis between (``docs/compactor.md, "Rewrite engines"``, ``docs/compactor.md "The policy"``),
  and in a doc ``see "Deploying"`` or ``"Scale" above`` for its own sections. A quoted section
  names a heading whole, or its start up to a colon or a parenthesis ("Hot partitions" names
  "Hot partitions: the read budget");
- row citations of the results table (``docs/BENCHMARKS.md, row "Records a second"``): the
  table has a row whose first cell is that goal;
- link anchors resolve against GitHub's heading anchors and explicit ``<a id="x"></a>`` ones.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("icecdc", "ingest", "compactor", "coordinator", "schemas", "benchmarks", "tests", "docker")
TOP_DIRS = (*CODE_DIRS, "docs", "scripts", ".ci")
DOC_NAMES = {"README": "README.md", "README.md": "README.md", "ARCHITECTURE.md": "docs/ARCHITECTURE.md"}
# A path starts at a top-level folder, not inside another path or a URL (``/etc/icecdc/x``),
# and is not a pattern (``test_*.py``, ``<state_dir>/...``).
PATH = re.compile(r"(?<![\w./$<>@:-])((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w./-]*)(::[\w:]+)?(?![\w*<{])")
BARE_TEST_FILE = re.compile(r"(?<![\w./-])(test_\w+\.py)\b(?!::)")
TEST_FUNCTION_IN_BACKTICKS = re.compile(r"`(test_\w+)`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
DOC = r"(docs/[\w-]+\.md|README(?:\.md)?|ARCHITECTURE\.md|(?<![/\w])[A-Z]+\.md|(?<![/\w])[a-z]+\.md)"
SECTION = re.compile(DOC + r"`?(?:'s)?(?:,\s*|\s*\(\s*|\s+)\"([^\"\n]+?)\"")
ROW = re.compile(r"(?<![\w-])(?:docs/)?BENCHMARKS\.md`?,\s*row\s+\"([^\"\n]+?)\"")
BENCHMARKS = "docs/BENCHMARKS.md"
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
OWN_SECTION = re.compile(r"\bsee \"([^\"\n]+?)\"|\"([^\"\n]+?)\" (?:above|below)\b")


@dataclass(frozen=True)
class Citation:
    where: str  # file:line it was read at
    path: str  # repo-relative target (a folder ends with "/"), or "" for a test function anywhere
    section: str = ""  # a heading's text or start, quoted
    anchor: str = ""  # a markdown link's #fragment
    row: str = ""  # the goal of a row of the results table
    test: str = ""  # a test function (``Class::test`` allowed)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings_of(markdown: str) -> list[str]:
    """The headings' text, in order, outside fenced code."""
    found, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.+?)\s*#*\s*$", line)):
            found.append(m.group(1).replace("`", ""))
    return found


def anchors_of(markdown: str) -> set[str]:
    """GitHub's heading anchors, numbered when a heading repeats, and explicit HTML anchors."""
    anchors: set[str] = set(HTML_ANCHOR.findall(markdown))
    seen: dict[str, int] = {}
    for heading in headings_of(markdown):
        base = slug(heading)
        anchors.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return anchors


def row_goals(markdown: str) -> set[str]:
    """The first cell of every table row, without a leading HTML anchor or bold."""
    goals = set()
    for line in markdown.splitlines():
        if line.lstrip().startswith("|"):
            cell = line.strip().split("|")[1].strip()
            cell = re.sub(r"^(?:<a\s[^>]*>\s*</a>\s*)+", "", cell).strip()
            goals.add(cell.replace("**", "").strip())
    return goals


def names_a_heading(section: str, headings: list[str]) -> bool:
    return any(h == section or h.startswith((f"{section}:", f"{section} (")) for h in headings)


def citations_in_text(text: str, where: str, first_line: int = 1, own_doc: str = "") -> list[Citation]:
    """What one passage cites. ``own_doc`` is the markdown file the passage is in, if any: its
    links are relative to it, and its "see" citations name its own sections."""

    def at(offset: int) -> str:
        return f"{where}:{first_line + text.count(chr(10), 0, offset)}"

    found = []
    for m in PATH.finditer(text):
        if m.group(1).endswith("..."):  # an elided path (``icecdc/ingest/...``, the installed layout)
            continue
        path = m.group(1).rstrip(".")
        test = (m.group(2) or "").lstrip(":")
        found.append(Citation(at(m.start()), path, test=test))
    for m in BARE_TEST_FILE.finditer(text):
        found.append(Citation(at(m.start()), "", test=m.group(1)))
    for m in ROW.finditer(text):
        found.append(Citation(at(m.start()), BENCHMARKS, row=m.group(1)))
    for m in SECTION.finditer(text):
        doc = m.group(1)
        path = DOC_NAMES.get(doc, doc if "/" in doc else f"{Path(own_doc).parent.as_posix()}/{doc}".lstrip("./"))
        found.append(Citation(at(m.start()), path, section=m.group(2)))
    if own_doc:
        for m in TEST_FUNCTION_IN_BACKTICKS.finditer(text):
            found.append(Citation(at(m.start()), "", test=m.group(1)))
        for m in OWN_SECTION.finditer(text):
            found.append(Citation(at(m.start()), own_doc, section=m.group(1) or m.group(2)))
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (Path(own_doc).parent / file).as_posix() if file else own_doc
            found.append(Citation(at(m.start()), normalised(path), anchor=anchor))
    return found


def normalised(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            parts.pop()
        elif part not in (".", ""):
            parts.append(part)
    return "/".join(parts) + ("/" if path.endswith("/") else "")


def passages_of_python(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment block and docstring: a block is consecutive comment
    lines, joined, so that a citation wrapped over two lines is read whole."""
    passages: list[tuple[int, str]] = []
    block: list[str] = []
    start = last = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        if block and line != last + 1:
            passages.append((start, " ".join(block)))
            block = []
        if not block:
            start = line
        block.append(token.string.lstrip("#").strip())
        last = line
    if block:
        passages.append((start, " ".join(block)))
    for node in ast.walk(ast.parse(source)):
        documented = isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        if documented and (doc := ast.get_docstring(node)) is not None:
            passages.append((node.body[0].lineno, " ".join(doc.split())))
    return passages


def repository_citations() -> list[Citation]:
    found: list[Citation] = []
    for folder in CODE_DIRS:
        for file in sorted((ROOT / folder).rglob("*.py")):
            relative = file.relative_to(ROOT).as_posix()
            for line, text in passages_of_python(file.read_text()):
                found += citations_in_text(text, relative, line)
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for file in docs:
        relative = file.relative_to(ROOT).as_posix()
        found += citations_in_text(file.read_text(), relative, own_doc=relative)
    for file in sorted((ROOT / "docker").rglob("*")):
        if file.is_file() and file.suffix != ".py":
            found += citations_in_text(file.read_text(), file.relative_to(ROOT).as_posix())
    return found


@cache
def functions_defined_in(path: Path) -> frozenset[str]:
    """``name`` and ``Class::name`` of every function defined in a test file."""
    names = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return frozenset(names)


def problem(citation: Citation, root: Path) -> str | None:
    """What is wrong with one citation, or None."""
    if not citation.path:
        tests = sorted((root / "tests").rglob("test_*.py"))
        if citation.test.endswith(".py"):
            ok = any(t.name == citation.test for t in tests)
        else:
            ok = any(citation.test in functions_defined_in(t) for t in tests)
        return None if ok else f"{citation.where}: no {citation.test} under tests/"
    target = root / citation.path
    if not target.exists() or (citation.path.endswith("/") and not target.is_dir()):
        return f"{citation.where}: {citation.path} does not exist"
    if citation.test:
        name = citation.test.split("[")[0]
        if target.suffix != ".py" or name not in functions_defined_in(target):
            return f"{citation.where}: {citation.path} defines no {name}"
    if citation.section and not names_a_heading(citation.section, headings_of(target.read_text())):
        return f'{citation.where}: {citation.path} has no section "{citation.section}"'
    if citation.anchor and citation.anchor not in anchors_of(target.read_text()):
        return f"{citation.where}: {citation.path} has no heading #{citation.anchor}"
    if citation.row and citation.row not in row_goals(target.read_text()):
        return f'{citation.where}: {citation.path} has no row "{citation.row}"'
    return None


def test_every_cited_file_test_and_section_exists():
    citations = repository_citations()
    assert len(citations) > 100, "the scan found next to nothing: its patterns no longer match the docs"
    problems = sorted({p for c in citations if (p := problem(c, ROOT))})
    assert not problems, "broken references:\n" + "\n".join(problems)


# A small repository of its own, so that the check's cases do not follow the real docs' edits.
SAMPLE_ROOT = {
    "README.md": "# icecdc\n## Development\n## Configuration\n",
    "docs/compactor.md": "# The compactor\n## Rewrite engines\n",
    "docs/ingest.md": "# The ingester\n## Exactly once\n## Sources as they are: before-images\n",
    "docs/coordinator.md": '# The coordinator\n<a id="on-restart"></a>\n## Restarts\n',
    "docs/BENCHMARKS.md": "# Benchmarks\n| goal | figure |\n|---|---|\n| **Partitions per job** | 16 |\n",
    "compactor/plans.py": "",
    "tests/unit/test_batch.py": "def test_a_batch():\n    pass\n",
}


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    for name, text in SAMPLE_ROOT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("text", "own_doc", "expected"),
    [
        ("see `compactor/plans.py`", "", None),
        ("see `compactor/plan_s.py`", "", "compactor/plan_s.py does not exist"),
        ('(docs/compactor.md, "Rewrite engines")', "", None),
        ('(docs/compactor.md, "Rewrite engine")', "", 'has no section "Rewrite engine"'),
        ('docs/ingest.md "Sources as they are"', "", None),
        ('README, "Development"', "", None),
        ('README, "Developing"', "", 'README.md has no section "Developing"'),
        ("tests/unit/test_batch.py::test_a_batch", "", None),
        ("tests/unit/test_batch.py::test_nothing_like_this", "", "defines no test_nothing_like_this"),
        ("test_batch.py", "", None),
        ("test_nothing_like_this.py", "", "no test_nothing_like_this.py under tests/"),
        ("[the ingester](ingest.md#exactly-once)", "docs/compactor.md", None),
        ("[the ingester](ingest.md#exactly-twice)", "docs/compactor.md", "docs/ingest.md has no heading #exactly-twice"),
        ("[x](docs/coordinator.md#on-restart)", "README.md", None),
        ("[x](docs/coordinator.md#restarts)", "README.md", None),
        ("`test_no_such_test_function`", "docs/ingest.md", "no test_no_such_test_function under tests/"),
        ('as the config says (see "Configuration")', "README.md", None),
        ('(see "Configurations")', "README.md", 'README.md has no section "Configurations"'),
        ("/etc/icecdc/icecdc.yaml, <state_dir>/compactor/x.json, tests/unit/test_*.py", "", None),
        ('(docs/BENCHMARKS.md, row "Partitions per job")', "", None),
        ('(docs/BENCHMARKS.md, row "No such goal")', "", 'docs/BENCHMARKS.md has no row "No such goal"'),
        ('BENCHMARKS.md, row "No such goal"', "docs/ingest.md", 'docs/BENCHMARKS.md has no row "No such goal"'),
        ('docs/BENCHMARKS.md, "Partitions per job"', "", 'docs/BENCHMARKS.md has no section "Partitions per job"'),
    ],
)
def test_the_check_reports_a_broken_reference_and_passes_a_sound_one(text, own_doc, expected, sample_root):
    problems = [p for c in citations_in_text(text, "x", own_doc=own_doc) if (p := problem(c, sample_root))]
    if expected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and expected in problems[0], problems


def test_anchors_follow_github_rules():
    markdown = "# Rewrite engines\n## Hot partitions: the read budget\n```\n# not a heading\n```\n## Rewrite engines\n"
    assert anchors_of(markdown) == {"rewrite-engines", "hot-partitions-the-read-budget", "rewrite-engines-1"}
    assert slug("`icecdc bench e2e`, 5x (median)") == "icecdc-bench-e2e-5x-median"


def test_a_row_citation_names_a_row_of_the_table_by_its_first_cell():
    markdown = '| goal | figure |\n|---|---|\n| <a id="records"></a>**Records a second** | 1 |\n| Writer failures | 0 |\n'
    assert {"Records a second", "Writer failures"} <= row_goals(markdown)
    cited = citations_in_text('as measured (docs/BENCHMARKS.md, row "Records a second")', "x")
    assert [(c.path, c.row) for c in cited if c.row] == [("docs/BENCHMARKS.md", "Records a second")]
    assert "records" in anchors_of(markdown)
    assert "legacy" in anchors_of('<a name="legacy"></a>\n')
