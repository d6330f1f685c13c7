"""Code as text, for tests: the plan holds syntax trees (symgrad.codegen.syntax), and a test
may write them as the text they print as. (A test may parse code; a pass may not.)"""

from __future__ import annotations

import ast

from symgrad.codegen.syntax import source
from symgrad.plan.inplace import reuse_buffers_in
from symgrad.plan.ir import Assign, Method


def code(text: str) -> ast.expr:
    """The expression ``text`` as a syntax tree."""
    return ast.parse(text, mode="eval").body


def reuse_buffers(
    lines: tuple[str, ...],
    returns: str,
    tensors: frozenset[str],
    floating: frozenset[str],
    params: frozenset[str],
) -> tuple[tuple[str, ...], str]:
    """plan.inplace.reuse_buffers_in on statements written as lines, ``target = value`` (other
    lines, an ``if ...:`` header, are kept; an indented assignment counts in the order it
    runs), and a return written as its expression: the lines and the return, with each
    statement the rewrite changed printed again."""
    assigns: dict[int, Assign] = {}
    for index, line in enumerate(lines):
        try:
            tree = ast.parse(line.strip())
        except SyntaxError:
            continue
        statement = tree.body[0] if len(tree.body) == 1 else None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            assigns[index] = Assign(ast.unparse(statement.targets[0]), statement.value)
    values = () if not returns else tuple(_elements(code(returns)))
    method = Method((), tuple(assigns.values()), values)
    rewritten = reuse_buffers_in(method, tensors, floating, params).method
    new_lines = list(lines)
    for index, before, after in zip(assigns, assigns.values(), rewritten.body):
        if after.value is not before.value:
            indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
            new_lines[index] = f"{indent}{after.target} = {source(after.value)}"
    new_returns = returns if rewritten.values == method.values else rewritten.returns
    return tuple(new_lines), new_returns


def _elements(tree: ast.expr) -> list[ast.expr]:
    return list(tree.elts) if isinstance(tree, ast.Tuple) else [tree]
