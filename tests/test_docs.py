"""What the pages say is a test's name or a results file away from being true, and both exist.

README.md is the entry page and docs/*.md the topics (CHANGELOG.md is history:
it may name what is gone).  A page that says a test shows something names
the test (`test_...`, in backticks); a page that gives a measured figure
cites the file under benchmarks/results/ it comes from, and a table of
docs/benchmarks.md names its results file and its command.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def existing_tests() -> set[str]:
    """Every test function and test class method name under tests/."""
    names = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name)
    return names


def cited_tests(text: str) -> set[str]:
    """The test names a page cites: ``test_...`` in backticks, a parametrization (``[...]``) left off."""
    return {m.group(1) for m in re.finditer(r"`(test_[A-Za-z0-9_]+)(?:\[[^`]*\])?`", text)}


def cited_results(text: str) -> set[str]:
    """The results files a page cites, ``benchmarks/results/...`` (``{a,b}`` spelled out)."""
    found = set()
    for match in re.finditer(r"benchmarks/results/[A-Za-z0-9_./{},-]*[A-Za-z0-9_}]", text):
        path = match.group(0)
        braces = re.search(r"\{([^}]*)\}", path)
        options = braces.group(1).split(",") if braces else [""]
        found |= {path[: braces.start()] + o + path[braces.end() :] if braces else path for o in options}
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_a_page_cites_exists(page):
    missing = sorted(cited_tests(page.read_text()) - existing_tests())
    assert not missing, f"{page.relative_to(ROOT)} cites tests that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_results_file_a_page_cites_is_committed(page):
    missing = sorted(p for p in cited_results(page.read_text()) if not (ROOT / p).is_file())
    assert not missing, f"{page.relative_to(ROOT)} cites results files that are not in benchmarks/results/: {missing}"


def test_the_citation_readers_find_what_they_are_given():
    text = "(`test_a_thing[fp16]`, `test_b`) from `benchmarks/results/quality.{txt,json}` and benchmarks/results/llm.txt."
    assert cited_tests(text) == {"test_a_thing", "test_b"}
    assert cited_results(text) == {"benchmarks/results/quality.txt", "benchmarks/results/quality.json", "benchmarks/results/llm.txt"}
    assert "test_every_test_a_page_cites_exists" in existing_tests()


def test_every_table_of_the_benchmarks_page_cites_its_results_file_and_command():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for section in re.split(r"\n(?=## )", page)[1:]:
        title = section.splitlines()[0]
        if not any(line.startswith("|") for line in section.splitlines()):
            continue
        assert cited_results(section), f"docs/benchmarks.md, {title}: a table without the results file it comes from"
        assert re.search(r"benchmarks/\w+\.py", section), f"docs/benchmarks.md, {title}: a table without the command that made it"


def anchors(page: Path) -> set[str]:
    """The fragments a page's headings answer to, as GitHub makes them."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_page_links_only_to_pages_files_and_headings_that_exist():
    for page in [*PAGES, ROOT / "CHANGELOG.md"]:
        for target, fragment in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", page.read_text()):
            if "://" in target:
                continue
            linked = page.parent / target if target else page
            assert linked.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
            if fragment and linked.suffix == ".md":
                assert fragment in anchors(linked), f"{page.relative_to(ROOT)} links to {target}#{fragment}: no such heading"
