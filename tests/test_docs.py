"""What the pages say is a test's name or a results file away from being true, and both exist.

README.md is the entry page and docs/*.md the topics (CHANGELOG.md is history:
it may name what is gone).  A page that says a test shows something names
the test (`test_...`, in backticks); a page that gives a measured figure
cites the file under benchmarks/results/ it comes from, and a table of
docs/benchmarks.md names its results file and its command.  Each figure a
citing sentence or table row quotes is in the file it cites
(:func:`unfound_figures`).
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


#: A quoted figure: thousands separated, a decimal (maybe with an exponent), or a whole number with a unit; a minus
#: only after a space, a table bar or a parenthesis (not Qwen3-0.6B's); not part of a version (1.5.1) or a name.
FIGURE = re.compile(
    r"(?:(?<=[\s|(])(?P<minus>-)|(?<![\w.,/^-]))"
    r"(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+"
    r"|\d+(?=\s?(?:ms|s|MB|GB|GiB|kB|dB|minutes)\b|%))"
    r"(?![\w.]*\d)(?:\s?(?P<unit>ms|s|MB|GB|GiB|kB|dB|minutes)\b)?"
)
#: What a figure with a unit may be in its results file: the same quantity in another unit (ms and s; bytes, kB, MB,
#: GB and GiB; seconds and minutes).
SCALES = {
    "ms": (1, 1e3, 1e-3),
    "s": (1, 1e3, 1e-3),
    "minutes": (1, 1 / 60),
    **{unit: (1, 1e3, 1e-3, 1e-6, 1e-9, 1 / 1024, 1 / 1024**3) for unit in ("kB", "MB", "GB", "GiB")},
}
RESULT_NUMBER = re.compile(r"-?\d[\d,]*\d(?:\.\d+)?(?:e[-+]?\d+)?|-?\d(?:\.\d+)?(?:e[-+]?\d+)?")


def result_numbers(path: str) -> list[float]:
    """Every number in a results file (thousands separators read)."""
    return [float(n.replace(",", "")) for n in RESULT_NUMBER.findall((ROOT / path).read_text())]


def quoted(text: str) -> str:
    """A page's prose without its code (commands, names, paths) and link targets, where numbers are no figure."""
    return re.sub(r"`[^`]*`|\]\([^)]*\)", " ", text)


def citing_passages(page: str) -> list[tuple[set[str], str]]:
    """(results files cited, text) for each sentence that cites one, and each row of a table whose section cites one
    before it (or, failing that, the paragraph after it: "Full table: ...")."""
    passages = []
    for section in re.split(r"\n(?=#+ )", re.sub(r"```.*?```", "", page, flags=re.S)):
        blocks = [
            [line.strip() for line in block.strip().splitlines() if not line.startswith("#")]
            for block in re.split(r"\n\s*\n", section)
        ]
        cited: set[str] = set()  # what the section cites before a table, else the paragraph after it
        for index, lines in enumerate(blocks):
            if lines and all(line.startswith("|") for line in lines):
                after = cited_results(" ".join(blocks[index + 1])) if index + 1 < len(blocks) else set()
                passages += [(cited or after, row) for row in lines[2:]]
                continue
            paragraph = " ".join(lines)
            cited = cited | cited_results(paragraph)
            for sentence in re.split(r"(?<=\.)\s+(?=[A-Z`(])", paragraph):
                if cited_results(sentence):
                    passages.append((cited_results(sentence), sentence))
    return passages


def unfound_figures(text: str, numbers: list[float]) -> list[str]:
    """The figures ``text`` quotes that no number of ``numbers`` gives at the digits shown (in another unit of the
    same quantity where the figure names one)."""
    unfound = []
    for match in FIGURE.finditer(quoted(text)):
        shown = match.group("number").replace(",", "")
        mantissa, _, exponent = shown.partition("e")
        decimals = len(mantissa.partition(".")[2])
        half_step = 0.5 * 10 ** ((int(exponent) if exponent else 0) - decimals)
        value = float(shown)
        scales = SCALES.get(match.group("unit"), (1,))
        # A figure without its minus may say it in words ("3.6 dB past the bound" for -3.6).
        signs = (-1,) if match.group("minus") else (1, -1)
        near = half_step * (1 + 1e-9)
        if not any(abs(sign * n * scale - value) <= near for n in numbers for scale in scales for sign in signs):
            unfound.append(match.group(0).strip())
    return unfound


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_figure_a_citing_sentence_or_table_row_quotes_is_in_the_results_file_it_cites(page):
    wrong = []
    for files, text in citing_passages(page.read_text()):
        readable = sorted(f for f in files if (ROOT / f).is_file() and f.endswith((".txt", ".json")))
        if not readable:
            continue
        numbers = [n for f in readable for n in result_numbers(f)]
        wrong += [f"{figure!r} ({', '.join(readable)}): {text[:100]}" for figure in unfound_figures(text, numbers)]
    assert not wrong, f"{page.relative_to(ROOT)} quotes figures its results files do not hold:\n" + "\n".join(wrong)


def test_the_figure_reader_allows_separators_units_and_rounding_and_nothing_else():
    numbers = [234995712.0, 10.94, 3552.9, -2.0, 7.5, 0.107, 5095.0, 1.6e-2]
    quoted = "235 MB, 10.9 s, 11 s, 3,553 s, 59 minutes, -2.0, 2.0 below, 0.107, 0.11, 5.1 s, 1.6e-02 | 0.016"
    assert unfound_figures(quoted, numbers) == []
    wrong = "10.8 s, 0.12, -7.5, 236 MB, 7.9 dB, 1.7e-02, 60 minutes"
    assert unfound_figures(wrong, numbers) == ["10.8 s", "0.12", "-7.5", "236 MB", "7.9 dB", "1.7e-02", "60 minutes"]
    assert unfound_figures("Qwen3-0.6B, 2-core, executorch 1.5.1, 28 layers, 3 of 3, 2^-11", numbers) == []


def test_the_passages_that_cite_a_results_file_are_its_sentences_and_the_rows_of_its_table():
    page = (
        "## A\n\nOne run (`benchmarks/results/a.txt`): the rows.  Another sentence, 1.5 s.\n\n"
        "| x | y |\n|---|---|\n| r | 2.5 |\n\n## B\n\n| x |\n|---|\n| 3.5 |\n\nFull table: `benchmarks/results/b.txt`.\n"
    )
    assert citing_passages(page) == [
        ({"benchmarks/results/a.txt"}, "One run (`benchmarks/results/a.txt`): the rows."),
        ({"benchmarks/results/a.txt"}, "| r | 2.5 |"),
        ({"benchmarks/results/b.txt"}, "| 3.5 |"),
        ({"benchmarks/results/b.txt"}, "Full table: `benchmarks/results/b.txt`."),
    ]


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
