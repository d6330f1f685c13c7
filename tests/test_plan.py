"""symgrad.plan: the plan is data, printed once; the float16 policy decides on its fields."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from conftest import generated_names
from code_text import code

import symgrad
from symgrad.codegen.syntax import plain, source
from symgrad.codegen.write import read_spec
from symgrad.derive import derive
from symgrad.frontend.parse import parse_spec
from symgrad.plan import make_plan
from symgrad.plan.ir import (
    Assign,
    Comment,
    CreateGraphBranch,
    FirstOrderBranch,
    If,
    Line,
    Method,
    Return,
    Rounding,
    Unpack,
    Widen,
    walk,
)
from symgrad.plan.operations import eager_operations, every_value_is_one_operation, kernels


def test_a_method_prints_its_fields_in_order():
    method = Method(
        ("ctx", "grad_output"),
        body=(Comment("why"), Assign("t0", code("x * y")), If(code("ctx.needs_input_grad[0]"), (Assign("grad_x", code("t0")),))),
        values=(code("grad_x"), code("None")),
        unpack=Unpack(("x", "y", "a"), ("a",)),
        widen=Widen(("grad_output", "x", "y"), "_"),
    )
    assert method.lines == (
        "x, y, a = ctx.saved_tensors",
        "if a is None:",
        "    a = ctx.a_number",
        "grad_output, x, y, _ = _float32_for_half(grad_output, x, y)",
        "# why",
        "t0 = x * y",
        "if ctx.needs_input_grad[0]:",
        "    grad_x = t0",
    )
    assert method.returns == "grad_x, None"
    assert method.helpers == {"_float32_for_half", "_half_of"}


def test_rounding_is_a_field_of_the_returned_values():
    method = Method(("x", "y"), values=(code("x * y"), code("dx")), rounding=Rounding("half", count=1))
    assert method.returns == "_round_to(half, x * y), dx"
    own = Method(("x", "y"), values=(code("torch.exp(y)"), code("x * y")), rounding=Rounding("half", None, ("y_half", "half")))
    assert own.returns == "_round_to(y_half, torch.exp(y)), _round_to(half, x * y)"
    assert "_round_to" in own.helpers


def test_branches_are_structure():
    branch = FirstOrderBranch((Assign("grad_x", code("kernel(g, x)")),), (Comment("formula"), Assign("grad_x", code("g * x"))))
    assert branch.render() == ["if not torch.is_grad_enabled():", "    grad_x = kernel(g, x)", "else:", "    # formula", "    grad_x = g * x"]
    create_graph = CreateGraphBranch((Assign("d", code("F.apply(x)")), Return((code("g * d"),))))
    assert create_graph.render() == ["if torch.is_grad_enabled():", "    d = F.apply(x)", "    return g * d"]


def test_operations_are_counted_per_statement():
    body = Method(("g", "x"), (Assign("t0", code("torch.exp(x)")), If(code("g is not None"), (Assign("r", code("g * t0")),))), (code("r"),))
    assert eager_operations(body) == 3  # exp, is not, *
    assert kernels(body) == 2  # (an identity test launches nothing)


def test_single_operation_outputs_are_not_widened():
    """Each value one kernel (with the temporaries it reads): no float32 round trip."""
    single = Method(("x", "y"), values=(code("x * y"), code("x + y")))
    assert every_value_is_one_operation(single)
    several = Method(("x", "y"), (Assign("t0", code("x * y")),), (code("t0 + y"), code("x")))
    assert not every_value_is_one_operation(several)


def test_widening_decides_per_output_in_generated_modules():
    pair = symgrad.generate_source("x*y, x+y", "Pair", inputs=["x", "y"])
    forward = pair.split("def forward(x, y):")[1].split("@staticmethod")[0]
    assert "_float32_for_half" not in forward
    blend = symgrad.generate_source("alpha*x*y + log(1 + y**2)*exp(-x)", "Blend", params=["alpha"])
    assert "_float32_for_half" in blend.split("def forward(")[1].split("@staticmethod")[0]


def test_backward_does_not_bind_an_unused_half():
    cube = symgrad.generate_source("x**3", "Cube")
    backward = cube.split("def backward(")[1].split("class ")[0]
    assert "grad_output, x, _ = _float32_for_half(grad_output, x)" in backward
    assert "half" not in backward.replace("_float32_for_half", "")


GENERATED = sorted(p for p in (Path(__file__).resolve().parent.parent / "generated").glob("*.py") if p.name != "__init__.py")
# (the row-wise ones have a planner of their own, which runs no pass over code: printed once)
GENERATED = [p for p in GENERATED if p.stem in generated_names()]


def _expressions(method: Method):
    """Every expression ``method`` holds as a syntax tree, the returned one included."""
    for statement in walk(method.statements):
        if isinstance(statement, Assign):
            yield statement.value
        elif isinstance(statement, Line):
            yield statement.code
        elif isinstance(statement, Return):
            yield from statement.values
        elif isinstance(statement, (If, FirstOrderBranch, CreateGraphBranch)):
            yield (statement if isinstance(statement, If) else statement.as_if()).condition
    if method.values:
        yield method.result


@pytest.mark.parametrize("fast", [False, True], ids=["default", "fast"])
@pytest.mark.parametrize("path", GENERATED, ids=[p.stem for p in GENERATED])
def test_the_passes_read_the_tree_that_the_code_parses_to(path, fast):
    """Counting operations and the --fast buffer reuse read ``syntax.plain(tree)``, never the
    printed code: for every expression a plan holds, that is exactly what Python parses
    the printed code to."""
    spec = read_spec(path.read_text())
    plan = make_plan(derive(parse_spec(dataclasses.replace(spec, fast=fast))))
    count = 0
    for method in plan.methods():
        for tree in _expressions(method):
            printed = source(tree)
            # (as a return statement: a returned tuple may unpack a call, ``*_round_to(...), t0``)
            parsed = ast.parse(f"return {printed}").body[0].value
            assert ast.dump(parsed) == ast.dump(plain(tree)), printed
            count += 1
    assert count


def _method_tree(source_text: str, method_name: str) -> str:
    """The return statement of the first ``method_name`` in ``source_text``, as the parser
    groups it (ast.unparse)."""
    for node in ast.walk(ast.parse(source_text)):
        if isinstance(node, ast.FunctionDef) and node.name == method_name:
            returns = [n for n in ast.walk(node) if isinstance(n, ast.Return)]
            return ast.unparse(returns[-1].value)
    raise AssertionError(f"no {method_name}")


def test_backward_and_jvp_multiply_the_upstream_last():
    """The derivative first, then the upstream gradient (tangent): ATen's order, and the
    fast one where the upstream gradient is an expanded tensor (``y.sum().backward()``)."""
    text = symgrad.generate_source("x**3", "Cube")
    assert _method_tree(text, "backward") == "grad_output * (3 * x ** 2)"
    assert "x_tangent * (3 * x ** 2)" in _method_tree(text, "jvp")
    # --fast: the derivative is computed in its own buffer; the upstream, which may be
    # batched under vmap where the derivative is not, multiplies out of place.
    fast = symgrad.generate_source("x**3", "Cube", fast=True)
    assert "grad_x = grad_output * ((x**2).mul_(3))" in fast


def test_a_0d_upstream_gradient_takes_the_numbers_first():
    """The gradient of a sum is 0-d: times 2 it is a scalar operation, not a pass over memory."""
    text = symgrad.generate_source("sum(x**2)", "SquareSum")
    assert _method_tree(text, "backward") == "(grad_output * 2 * x).expand(ctx.result_elementwise_shape)"


def test_the_upstream_comes_first_where_only_that_order_keeps_float16():
    """g * (2 * x) overflows float16 from |x| = 32752 where the gradient 2*x*g is finite
    (g = 0.01); g * 2 * x does not, so Square's backward keeps that order and float16."""
    text = symgrad.generate_source("x**2", "Square")
    assert _method_tree(text, "backward") == "grad_output * 2 * x"
    assert "_float32_for_half" not in text
