"""How many ATen operations a method's body runs eagerly, counted statement by statement.

The fused runner compares the count with the tensors' size to decide whether a compiled
call pays, and the float16 policy widens only bodies of more than one kernel. Each
statement's expression is counted on its own (every branch counts, taken or not), on the
syntax tree the plan holds, as Python's parser would give it (:func:`symgrad.codegen.syntax.plain`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..codegen.syntax import Code, dotted_name, plain
from .ir import (
    Assign,
    Comment,
    CreateGraphBranch,
    FirstOrderBranch,
    If,
    Line,
    Method,
    Pass,
    Return,
    Unpack,
    Widen,
    walk,
)


@dataclass(frozen=True)
class Count:
    """Operators on tensors (not between scalars), calls that launch a kernel, and ``is``
    tests (which launch none)."""

    operators: int = 0
    calls: int = 0
    identity_tests: int = 0

    def __add__(self, other: "Count") -> "Count":
        return Count(
            self.operators + other.operators, self.calls + other.calls, self.identity_tests + other.identity_tests
        )

    @property
    def operations(self) -> int:
        return self.operators + self.calls

    @property
    def kernels(self) -> int:
        return self.operations - self.identity_tests


def count_method(method: Method, scalars: frozenset[str] = frozenset()) -> Count:
    """The operations of ``method``: its unpacking, statements and returned values."""
    total = count_unpack(method.unpack)
    total += count_statements(method.statements, scalars)
    return total + _count_expression(method.result, scalars) if method.values else total


def count_unpack(unpack: Unpack | None) -> Count:
    if unpack is None:
        return Count()
    # (``if p is None:`` per number param: an identity test)
    return Count(operators=len(unpack.number_params), identity_tests=len(unpack.number_params))


def count_statements(statements, scalars: frozenset[str] = frozenset()) -> Count:
    total = Count()
    for statement in statements:
        if isinstance(statement, Assign):
            total += _count_expression(statement.value, scalars)
        elif isinstance(statement, Line):
            total += _count_expression(statement.code, scalars)
        elif isinstance(statement, Return):
            for value in statement.values:
                total += _count_expression(value, scalars)
        elif isinstance(statement, (If, FirstOrderBranch, CreateGraphBranch)):
            block = statement if isinstance(statement, If) else statement.as_if()
            total += _count_expression(block.condition, scalars)
            total += count_statements(block.body, scalars) + count_statements(block.orelse, scalars)
        elif isinstance(statement, Widen):
            raise ValueError("operations are counted before float16 widening")
        elif not isinstance(statement, (Comment, Pass)):
            raise TypeError(f"unknown statement {statement!r}")
    return total


def _count_expression(code: Code, scalars: frozenset[str]) -> Count:
    tree = plain(code)

    def is_scalar(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in scalars
        if isinstance(node, ast.UnaryOp):
            return is_scalar(node.operand)
        if isinstance(node, ast.Call):
            return _is_method_call(node, "numel")  # (a Python int)
        if isinstance(node, ast.Compare):
            return all(is_scalar(side) for side in [node.left, *node.comparators])
        return isinstance(node, ast.BinOp) and is_scalar(node.left) and is_scalar(node.right)

    nodes = list(ast.walk(tree))
    operators = [
        n
        for n in nodes
        if isinstance(n, (ast.BinOp, ast.Compare))
        and not is_scalar(n)
        or isinstance(n, ast.UnaryOp)
        and not is_scalar(n.operand)
    ]  # (-1 in grad_output * -1 is a constant, not an operation)
    calls = [
        n
        for n in nodes
        if isinstance(n, ast.Call) and not _is_method_call(n, "expand", "numel") and not _is_dtype_guard(n)
    ]
    identity = sum(
        1 for n in nodes if isinstance(n, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in n.ops)
    )
    return Count(len(operators), len(calls), identity)


def _is_dtype_guard(node: ast.Call) -> bool:
    """Whether ``node`` calls the helper ``_floating``, which gives a floating tensor back as
    it is (an integer one as the default dtype): no kernel where it matters."""
    return isinstance(node.func, ast.Name) and node.func.id == "_floating"


def _is_method_call(node: ast.Call, *methods: str) -> bool:
    """Whether ``node`` calls one of these methods (``shape.numel()``, ``t.expand(shape)``)."""
    return isinstance(node.func, ast.Attribute) and node.func.attr in methods


def eager_operations(body: Method, scalars: frozenset[str] = frozenset()) -> int:
    """How many ATen operations ``body`` runs eagerly: each a kernel launch and a pass over
    memory, where the compiled body makes one. (Every branch counts, taken or not.)

    Where it errs, it counts too many (every ``needs_input_grad`` branch, a ``sum_to_size``
    that is a view), which only makes a body compile sooner. ``scalars`` names values that
    are never full-size tensors (the 0-d gradient of a sum).
    """
    return count_method(body, scalars).operations


def kernels(body: Method) -> int:
    """How many kernels ``body`` may launch: its operations, less ``is None`` tests."""
    return count_method(body).kernels


def one_elementwise_operation(body: Method, scalars: frozenset[str] = frozenset()) -> bool:
    """Whether ``body`` is at most one elementwise arithmetic operation on full-size tensors.

    (``2 * x``, ``grad_output * result``, and ``(grad_output * 2 * x).expand(shape)`` where
    grad_output is the 0-d gradient of a sum: ``scalars`` names such values.) Such a body
    runs eagerly even in a fused module: one eager kernel makes the same pass over memory as
    a compiled one, and the compiled call would only add Dynamo's guard check. A body with a
    function call (exp, sigmoid, ..., or a reduction) stays compiled: inductor's kernels for
    those differ. ``expand`` makes a view and ``numel`` an int, no kernel.
    """
    count = count_method(body, scalars)
    return count.operators <= 1 and not count.calls


def every_value_is_one_operation(body: Method) -> bool:
    """Whether each value ``body`` returns is computed by at most one kernel, counting the
    temporaries it reads (a body of plain assignments; any branch makes it False)."""
    if body.unpack is not None and body.unpack.number_params:
        return False
    assigned: dict[str, Assign] = {}
    for statement in body.body:
        if isinstance(statement, Comment):
            continue
        if not isinstance(statement, Assign) or not statement.target.isidentifier():
            return False
        assigned[statement.target] = statement

    def cost(code: Code, seen: set[str]) -> int:
        total = _count_expression(code, frozenset()).kernels
        for name in sorted({n.id for n in ast.walk(code) if isinstance(n, ast.Name)}):
            if name in assigned and name not in seen:
                seen.add(name)
                total += cost(assigned[name].value, seen)
        return total

    return all(cost(value, set()) <= 1 for value in body.values)


def calls(body: Method) -> set[str]:
    """The functions ``body`` calls, by their dotted names (not a method of an expression's
    value, ``(a * b).sum``)."""
    found: set[str] = set()
    codes = [s.value for s in _assigns(body)] + ([body.result] if body.values else [])
    for code in codes:
        found |= {dotted_name(n.func) for n in ast.walk(plain(code)) if isinstance(n, ast.Call)} - {None}
    return found


def _assigns(body: Method):
    for statement in walk(body.statements):
        if isinstance(statement, Assign):
            yield statement
        elif isinstance(statement, Line):
            yield Assign("_", statement.code)
        elif isinstance(statement, Return):
            yield from (Assign("_", value) for value in statement.values)
        elif isinstance(statement, If):
            yield Assign("_", statement.condition)
        elif isinstance(statement, (FirstOrderBranch, CreateGraphBranch)):
            yield Assign("_", statement.as_if().condition)
