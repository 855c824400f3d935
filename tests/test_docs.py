"""What the pages say is a test's name or a results file away from being true, and both exist.

README.md is the entry page and docs/*.md the topics (CHANGELOG.md is history:
it may name what is gone).  A page that says a test shows something names
the test (`test_...`, in backticks); a page that gives a measured figure
cites the file under benchmarks/results/ it comes from, and a table of
docs/benchmarks.md names its results file and its command.  Each figure a
citing sentence or table row quotes, a count without a unit included, is in
the file it cites (:func:`unfound_figures`): a table row's on the rows of the
file that carry the row's name (:func:`rows_named`), a sentence's on the rows whose name it says
(:func:`rows_a_sentence_names`), on any row where it says none.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@functools.cache
def existing_tests() -> frozenset[str]:
    """Every test function and test class method name under tests/."""
    names = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name)
    return frozenset(names)


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


#: A quoted figure: thousands separated, a decimal (maybe with an exponent), or a whole number (a count: 379 passed,
#: or with a unit); a minus only after a space, a table bar or a parenthesis (not Qwen3-0.6B's); not part of a version
#: (1.5.1, macOS 27) or a name (fp16, 2-core, K=64 in a row's name: :func:`row_figures`).
FIGURE = re.compile(
    r"(?:(?<=[\s|(])(?P<minus>-)|(?<![\w.,/^=-]))(?<!OS )"
    r"(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+"
    r"|\d+(?=\s?(?:ms|s|MB|GB|GiB|kB|dB|minutes)\b|%|x\b)|\d+(?![\w-]))"
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


def numbers_in(text: str) -> list[float]:
    """Every number in ``text`` (thousands separators read)."""
    return [float(n.replace(",", "")) for n in RESULT_NUMBER.findall(text)]


def name_of(row: str) -> str:
    """A row's name, lower case, without markup: a table row's first cell, or a text table's line up to its first
    gap of two spaces."""
    row = row.strip()
    first = row.strip("|").split("|")[0] if row.startswith("|") else re.split(r"\s{2,}|\t", row)[0]
    return re.sub(r"[`*]", "", first).strip().lower()


def rows_named(name: str, rows: list[str]) -> list[str]:
    """The rows of a results file that carry a page's row ``name``: their name is it, or (of two words or more) begins
    it ("encoder fp16, its linear" for "encoder fp16, its linear layers as the runtime's"); a file may give one page
    row in several (the fp16 and the fp32 table of an op)."""

    def carries(row: str) -> bool:
        own = name_of(row)
        if not own or own == name:
            return bool(own)
        return len(own.split()) >= 2 and name.startswith(own) and name[len(own) : len(own) + 1] in (" ", ",", "(")

    return [row for row in rows if carries(row)]


def rows_a_sentence_names(sentence: str, rows: list[str]) -> list[str]:
    """The lines of a results file a sentence may quote from, where it names a row: the rows holding figures whose
    name it says (a whole word or phrase outside code, not followed by a number, which would name another row:
    "coreai passed 397 of 467" speaks of the row ``coreai``, "Gemma 4" not of ``gemma``), and the file's prose lines
    (a run's setup, its time).  A sentence that names no row speaks of the whole file: none."""
    prose = quoted(sentence).lower()

    def said(name: str) -> bool:
        return len(name) >= 3 and bool(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])(?!\s*\d)", prose))

    named = [row for row in rows if is_table_row(row) and numbers_in(row) and said(name_of(row))]
    return named + [row for row in rows if not is_table_row(row)] if named else []


def is_table_row(line: str) -> bool:
    """A line of a results file's table: cells apart by ``|`` or a gap of two spaces (else a line of prose)."""
    return "|" in line or bool(re.search(r"\S\s{2,}\S", line.strip()))


def row_figures(row: str) -> tuple[str, str]:
    """A page's table row as (its name, the text of its other cells): a number in the name names the row (K=64,
    28 layers), it quotes no figure."""
    cells = row.strip().strip("|").split("|")
    return re.sub(r"[`*]", "", cells[0]).strip().lower(), "|".join(cells[1:])


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


def misquoted(page: str, read=lambda path: (ROOT / path).read_text() if (ROOT / path).is_file() else None) -> list[str]:
    """The figures of ``page`` (its text) that the results files it cites do not hold where they should: a table
    row's on the rows named as it is, a sentence's on the rows whose names it says (where the files name none so,
    anywhere in them).
    ``read`` gives a results file's text, or ``None`` where it is not there."""
    wrong = []
    for files, text in citing_passages(page):
        texts = {f: read(f) for f in sorted(files) if f.endswith((".txt", ".json"))}
        texts = {f: t for f, t in texts.items() if t is not None}
        if not texts:
            continue
        numbers = [n for t in texts.values() for n in numbers_in(t)]
        rows = [row for f, t in texts.items() if f.endswith(".txt") for row in t.splitlines()]
        if text.startswith("|"):
            name, text = row_figures(text)
            named = rows_named(name, rows)
        else:
            named = rows_a_sentence_names(text, rows)
        numbers = [n for row in named for n in numbers_in(row)] if named else numbers
        wrong += [f"{figure!r} ({', '.join(texts)}): {text[:100]}" for figure in unfound_figures(text, numbers)]
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_figure_a_citing_sentence_or_table_row_quotes_is_in_the_results_file_it_cites(page):
    wrong = misquoted(page.read_text())
    assert not wrong, f"{page.relative_to(ROOT)} quotes figures its results files do not hold:\n" + "\n".join(wrong)


def test_a_count_the_page_quotes_is_checked_on_its_own_row_of_the_results_file():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    row = "| coreai | 467 | 397 | 58 | 0 | 70 |"
    assert row in page and misquoted(page) == []
    assert misquoted(page.replace(row, "| coreai | 467 | 398 | 58 | 0 | 70 |", 1)) == [  # the first table's row
        "'398' (benchmarks/results/backend_suite.txt):  467 | 398 | 58 | 0 | 70 "
    ]
    # xnnpack's 97 skipped is in the file, on another row: not coreai's
    assert [w.split(" ")[0] for w in misquoted(page.replace(row, "| coreai | 467 | 397 | 58 | 0 | 97 |", 1))] == ["'97'"]
    sentence = "coreai passed 397 of 467 cases (`benchmarks/results/backend_suite.txt`)."
    assert misquoted(sentence) == [] and misquoted(sentence.replace("397", "396"))[0].startswith("'396'")
    # 363 is XNNPACK's count of passed cases, on its own row: a sentence about coreai does not hold it
    assert misquoted(sentence.replace("397", "363"))[0].startswith("'363'")


def test_the_figure_reader_allows_separators_units_and_rounding_and_nothing_else():
    numbers = [234995712.0, 10.94, 3552.9, -2.0, 7.5, 0.107, 5095.0, 1.6e-2]
    quoted = "235 MB, 10.9 s, 11 s, 3,553 s, 59 minutes, -2.0, 2.0 below, 0.107, 0.11, 5.1 s, 1.6e-02 | 0.016, 5095 | 2"
    assert unfound_figures(quoted, numbers) == []
    wrong = "10.8 s, 0.12, -7.5, 236 MB, 7.9 dB, 1.7e-02, 60 minutes, 5096 cases"
    assert unfound_figures(wrong, numbers) == ["10.8 s", "0.12", "-7.5", "236 MB", "7.9 dB", "1.7e-02", "60 minutes", "5096"]
    names = "Qwen3-0.6B, 2-core, executorch 1.5.1, 2^-11, fp16, int4, K=64, macOS 27, 2026-12-04"
    assert unfound_figures(names, numbers) == []


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


def test_the_quantization_page_says_what_is_known_of_per_block_ints_on_the_neural_engine_and_what_is_not_measured():
    from coreai_partitioner.quantize.schemes import NEURAL_ENGINE_SCHEMES

    page = (ROOT / "docs" / "quantization.md").read_text()
    section = page.split("## Per-block integers on the Neural Engine", 1)[1].split("\n## ", 1)[0]
    for says in ("coreai-models/issues/279", "0.367", "0.999", "0.9975", "What is not measured here", "warns once"):
        assert says in section, f"docs/quantization.md's Neural Engine section does not say {says!r}"
    for name in NEURAL_ENGINE_SCHEMES:
        assert f"`{name}`" in section


def test_the_llm_pages_recommended_device_scheme_stores_no_per_block_integers():
    from coreai_partitioner.quantize.schemes import NEURAL_ENGINE_SCHEMES, per_block_int

    page = (ROOT / "docs" / "llm.md").read_text()
    recommended = re.search(r"The recommended device scheme is `--quantize ([a-z0-9-]+)`", page)
    assert recommended, "docs/llm.md names no recommended device scheme"
    assert recommended.group(1) in NEURAL_ENGINE_SCHEMES and not per_block_int(recommended.group(1))
