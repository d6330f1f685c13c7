"""The documentation stays true: its marked Python examples run, and its links resolve.

A fenced ```python block directly after the line ``<!-- test: python -->`` (invisible when
the Markdown is rendered) is an example a reader may paste: each one runs on its own in a
fresh interpreter, in an empty folder, and must exit 0. Its asserts are the documented
results. Unmarked blocks are fragments (generated code, a body, an excerpt) and do not run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = "<!-- test: python -->\n```python\n"


def marked_examples() -> list[tuple[str, str]]:
    """(test id, code) for every marked example, in page order."""
    examples = []
    for page in PAGES:
        text = page.read_text()
        for number, start in enumerate(m.end() for m in re.finditer(re.escape(MARKER), text)):
            code = text[start : text.index("```", start)]
            examples.append((f"{page.relative_to(ROOT)}:{number + 1}", code))
    return examples


EXAMPLES = marked_examples()


def test_the_python_api_has_runnable_examples():
    pages = {example_id.split(":")[0] for example_id, _ in EXAMPLES}
    assert {"README.md", "docs/usage.md"} <= pages


@pytest.mark.parametrize("code", [code for _, code in EXAMPLES], ids=[example_id for example_id, _ in EXAMPLES])
def test_marked_example_runs(code, tmp_path):
    # The repository root on the path, as for a user who ran `pip install -e .` and works
    # in it: an example may import the checked-in generated/ modules.
    env_path = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.append({env_path!r})\n{code}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr


LINK = re.compile(r"\]\(([^)#\s]*)(#[^)\s]*)?\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add("#" + re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target, anchor in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.relative_to(ROOT)} links to a missing {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.relative_to(ROOT)} links to a missing {target}{anchor}"


def test_usage_lists_every_supported_function():
    """docs/usage.md's table names every function `symgrad --list-functions` prints."""
    listing = subprocess.run(
        [sys.executable, "-m", "symgrad", "--list-functions"], capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 0, listing.stderr
    names = [line.split()[0] for line in listing.stdout.splitlines() if line.strip()]
    usage = (ROOT / "docs" / "usage.md").read_text()
    table = usage[usage.index("## Supported functions") :]
    missing = [name for name in names if not re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", table)]
    assert names and not missing, f"docs/usage.md's table lacks {missing}"


def test_stability_lists_the_engines_rules_as_they_are():
    """docs/stability.md's table of the rules in the engine's order is what
    scripts/rules_table.py makes from symgrad.rewrite.engine.RULES (their places and docstrings)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import rules_table
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    page = (ROOT / "docs" / "stability.md").read_text()
    assert rules_table.page_with_table(page) == page, "run `python scripts/rules_table.py --write`"
    assert page.count("\n| ") > len(rules_table.RULES)  # (the table is there, one row per rule)
