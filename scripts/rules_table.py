"""Print the rewrite engine's rules, in order, as the Markdown table in docs/stability.md.

The table is made from the rules themselves (``symgrad.rewrite.engine.RULES``): each rule's
name, where it sits in the order and why (``Rule.place``), and the first sentence of its
docstring (the identity). tests/test_docs.py checks that docs/stability.md holds exactly
this output between its ``rules:`` markers; after changing a rule, run

    python scripts/rules_table.py --write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from symgrad.rewrite.engine import RULES  # noqa: E402

PAGE = ROOT / "docs" / "stability.md"
BEGIN = "<!-- rules: begin (made by scripts/rules_table.py; do not edit by hand) -->\n"
END = "<!-- rules: end -->\n"


def _first_sentence(text: str) -> str:
    """The docstring's first sentence, on one line, with table pipes escaped."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?\.)(\s|$)", flat)
    sentence = match.group(1) if match else flat
    return sentence.replace("|", "\\|")


def table() -> str:
    rows = ["| # | rule | matches, and why it sits here | identity |", "|---|---|---|---|"]
    for number, rule in enumerate(RULES, 1):
        place = rule.place.replace("|", "\\|")
        rows.append(f"| {number} | `{rule.name}` | {place} | {_first_sentence(rule.identity)} |")
    return "\n".join(rows) + "\n"


def page_with_table(page: str) -> str:
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + table() + page[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/stability.md in place")
    args = parser.parse_args()
    if args.write:
        PAGE.write_text(page_with_table(PAGE.read_text()))
    else:
        sys.stdout.write(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
