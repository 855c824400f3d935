"""README.md is the entry page: its commands are the ones CI runs, it is short, and it leads to every docs page."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_exactly_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv .venv &&")]
    assert len(commands) == 2, commands
    test_command = next(c for c in commands if c.endswith("pytest"))
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci_lines[-1] == test_command


def test_readme_is_an_entry_page_of_at_most_300_lines_that_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, len(readme.splitlines())
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme))
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert len(pages) >= 3 and pages <= linked, f"not linked from README: {sorted(pages - linked)}"
    assert "(CHANGELOG.md)" in readme


def test_the_package_long_description_is_readmes_opening_paragraph():
    described = subprocess.run(
        [sys.executable, "setup.py", "--long-description"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    opening = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    assert described.strip() == opening.strip() and len(described.splitlines()) < 20
