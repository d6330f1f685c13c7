"""Small pieces of generated code that several parts of the plan build."""

from __future__ import annotations

import sympy

from ..codegen.printer import prints_as_sum
from ..codegen.syntax import NONE, Code, binop, compare, if_else, joined, parens
from .ir import Assign, If, Statement


def unpack_target(names: list[str] | tuple[str, ...]) -> str:
    """The target that unpacks a sequence into ``names`` (a one-tuple keeps its comma)."""
    return f"({names[0]},)" if len(names) == 1 else ", ".join(names)


def sum_of_present(target: str, terms: list[tuple[str, Code]], term_name: str | None) -> list[Statement]:
    """Statements setting ``target`` to the sum of ``terms``, (a name that may be None at run
    time, a term that uses it): each is added only where its name is not None, and
    ``target`` stays None where none is."""
    statements: list[Statement] = [Assign(target, NONE)]
    for n, (optional, term) in enumerate(terms):
        statements.append(If(compare(optional, "is not", None), tuple(accumulate(target, term, n == 0, term_name))))
    return statements


def accumulate(target: str, term: Code, first: bool, term_name: str | None) -> list[Statement]:
    """Statements adding ``term`` to ``target``, which is None until a first term arrives (a
    term may be skipped at run time: an absent gradient or tangent)."""
    if first:
        return [Assign(target, term)]
    added = if_else(compare(target, "is", None), term_name, binop(target, "+", term_name))
    return [Assign(term_name, term), Assign(target, added)]


def factor(code: Code, expr: sympy.Expr) -> Code:
    """``code``, the printed ``expr``, as the right operand of ``*``: parenthesised where the
    printer prints ``expr`` as a sum or difference (:func:`~symgrad.codegen.printer.prints_as_sum`)."""
    return parens(code) if prints_as_sum(expr) else code


def times_upstream(upstream: Code, code: Code, expr: sympy.Expr, upstream_first: bool = False) -> Code:
    """The upstream gradient (or tangent) ``upstream`` times the derivative ``expr``, which
    prints as ``code``.

    By default the derivative is computed first and the upstream multiplies it last,
    ``grad_output * (3 * x**2)``, as ATen's formulas do. Under ``y.sum().backward()`` the
    upstream gradient is a stride-0 expanded tensor, and an op reading it first is the slow
    order: at 1e6 float32 on one thread ``g * 3 * x**2`` took 0.65 ms, ``g * (3 * x**2)``
    0.36 ms (with a full ``g``, 0.55 and 0.52). Both orders make the same kernels.

    ``upstream_first``: multiplied in the order it reads, ``grad_output * 3 * x**2``. For a
    0-d upstream (the gradient of a sum or a mean) the leading numbers then join it in
    scalar operations; and a derivative computed first in float16 may overflow where the
    product does not (``2 * x`` at x = 4e4), so a body that keeps the float16 contract only
    in this order takes it (symgrad.plan.assemble).
    """
    if is_one(expr):
        return upstream
    if upstream_first:
        return joined(upstream, "*", factor(code, expr))
    return binop(upstream, "*", factor(code, expr))


def is_one(expr: sympy.Expr) -> bool:
    """Whether ``expr`` is the number 1 (SymPy's ``Float(1.0) == 1`` is False)."""
    return bool(expr.is_number) and not expr.free_symbols and float(expr) == 1.0


def sum_of(terms: list[Code]) -> Code:
    """``a + b + c``, the terms joined as text would be (:func:`~symgrad.codegen.syntax.joined`)."""
    total = terms[0]
    for term in terms[1:]:
        total = joined(total, "+", term)
    return total


def with_helpers(statements: list[Statement], helpers: frozenset[str]) -> list[Statement]:
    """``statements`` (an accumulation of printed terms), each assignment, nested ones too,
    also calling ``helpers``."""
    result: list[Statement] = []
    for statement in statements:
        if isinstance(statement, Assign):
            statement = Assign(statement.target, statement.value, statement.helpers | helpers)
        elif isinstance(statement, If):
            statement = If(statement.condition, tuple(with_helpers(list(statement.body), helpers)), statement.orelse)
        result.append(statement)
    return result
