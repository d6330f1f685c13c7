"""The package layout: stages as packages, imports pointing down the pipeline only.

Read from the source with ``ast`` (nothing is imported), counting the imports inside
functions too: a lazy import hides a cycle from Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "symgrad"
MAX_LINES = 1000

# The layers, lowest first: a module may import from its own layer and the ones below it.
# math sits below the frontend because the grammar builds expressions from math's functions.
LAYERS = (
    # codegen.syntax: the expression trees that the printer, math's generated families and
    # the plan build; it imports nothing of symgrad.
    (
        "base",
        ("symgrad.errors", "symgrad.spec", "symgrad.naming", "symgrad.version", "symgrad.runtime", "symgrad.codegen.syntax"),
    ),
    ("math", ("symgrad.math",)),
    ("frontend", ("symgrad.frontend",)),
    ("rewrite", ("symgrad.rewrite",)),
    ("derive", ("symgrad.derive",)),
    # The printer turns SymPy expressions into torch code (syntax trees), and the planner builds
    # each body from them, so it sits below the plan though it lives in codegen/.
    ("print", ("symgrad.codegen.printer",)),
    ("plan", ("symgrad.plan",)),
    ("codegen", ("symgrad.codegen",)),
    # The report runs generated modules (so it imports torch) and is called by the cli only.
    ("cli", ("symgrad.cli", "symgrad.api", "symgrad.__main__", "symgrad", "symgrad.report")),
)

def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "templates" not in p.parts}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> set[str]:
    """The symgrad modules that module ``name`` imports, anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "symgrad")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if _is_package(name) else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "symgrad":
                continue
            for alias in node.names:
                # `from .pkg import module` imports a module; `from .module import name`, a name.
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in MODULES else module)
    found.discard(name)
    return {m for m in found if m in MODULES}


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int:
    matches = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if name == prefix or name.startswith(prefix + ".")
    ]
    assert matches, f"{name} belongs to no layer: add it to LAYERS in tests/test_layout.py"
    return max(matches)[1]


def _cycle() -> list[str] | None:
    """One import cycle among the symgrad modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(GRAPH[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for name in sorted(GRAPH):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return None


def test_the_graph_sees_the_packages():
    # (a guard on the parsing above: an import it misread would pass every check below)
    assert "symgrad.rewrite.engine" in GRAPH["symgrad.derive.gradients"]
    assert "symgrad.math.functions" in GRAPH["symgrad.frontend.grammar"]
    assert "symgrad.derive.gradients" in GRAPH["symgrad.derive"]


def test_no_import_cycle():
    cycle = _cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_size(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES})"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down_the_pipeline(name):
    upward = sorted(target for target in GRAPH[name] if _layer(target) > _layer(name))
    assert not upward, f"{name} ({LAYERS[_layer(name)][0]}) imports from a later stage: {upward}"



# Issue 43's rule: no pass may parse, regex or string-match code that symgrad itself
# generated. A decision made on printed text breaks when a spelling changes (a comment's
# wording, black's parentheses) and hides what it depends on; the plan decides on SymPy
# expressions and on its own structures (plan/ir.py, whose expressions are codegen.syntax
# trees) instead, and prints once, at the end.
# These are the tools such a pass would reach for.
_TEXT_READERS = {"ast.parse", "ast.get_source_segment", "re", "tokenize"}
# Where one is used on text that symgrad did not generate, with the reason.
_READS_OTHER_TEXT = {
    # the package's own hand-written helpers (symgrad/runtime/helpers.py), sliced into functions
    "symgrad.codegen.printer": {"ast.parse"},
    # a custom template's rendered module, checked for what the template must provide: it
    # refuses a broken template, and decides nothing in the output
    "symgrad.codegen.render": {"ast.parse"},
}


def _text_readers(name: str) -> set[str]:
    """The text readers (``_TEXT_READERS``) that module ``name`` imports or calls."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names} & _TEXT_READERS
        elif isinstance(node, ast.ImportFrom) and node.module in _TEXT_READERS:
            found.add(node.module)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if f"{node.value.id}.{node.attr}" in _TEXT_READERS:
                found.add(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(("symgrad.plan", "symgrad.codegen"))))
def test_no_pass_reads_generated_code(name):
    allowed = _READS_OTHER_TEXT.get(name, set())
    used = _text_readers(name)
    assert used <= allowed, f"{name} reads code as text with {sorted(used - allowed)}: decide on the plan's data"
