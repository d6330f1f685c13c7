"""The syntax trees the printer builds and the plan holds: ``source`` prints them, ``plain``
is what Python's parser makes of that source."""

from __future__ import annotations

import ast

import pytest

from symgrad.codegen import syntax as s

X, Y, T = s.name("x"), s.name("y"), s.name("t")

CASES = [
    (s.binop(s.binop(X, "+", Y), "*", T), "(x + y) * t"),
    (s.binop(X, "*", s.binop(Y, "*", T)), "x * (y * t)"),
    (s.binop(s.binop(X, "*", Y), "*", T), "x * y * t"),
    (s.binop(X, "-", s.binop(Y, "-", T)), "x - (y - t)"),
    (s.binop(X, "**", s.number(-2.0)), "x ** -2.0"),
    (s.binop(X, "**", s.unary("-", s.number(2.0))), "x ** -2.0"),
    (s.binop(X, "**", s.unary("-", Y)), "x ** (-y)"),
    (s.binop(s.number(-2.0), "**", X), "(-2.0) ** x"),
    (s.binop(s.binop(X, "**", Y), "**", T), "(x ** y) ** t"),
    (s.binop(X, "**", s.binop(Y, "**", T)), "x ** y ** t"),
    (s.unary("-", s.binop(X, "**", s.number(2))), "-x ** 2"),
    (s.binop(s.unary("-", X), "**", s.number(2)), "(-x) ** 2"),
    (s.binop(s.number(-0.5), "*", X), "-0.5 * x"),
    (s.binop(X, "*", s.number(-0.5)), "x * -0.5"),
    (s.binop(s.number(-0.0), "+", X), "-0.0 + x"),
    (s.parens(s.binop(X, "*", Y)), "(x * y)"),
    (s.binop(s.parens(s.compare(X, ">", 0)), "&", s.unary("~", s.parens(s.compare(Y, "<", 1)))), "(x > 0) & ~(y < 1)"),
    (s.binop(s.compare(X, ">", 0), "&", Y), "(x > 0) & y"),
    (s.call("torch.where", s.compare(X, ">", 0), X, s.number(0.5)), "torch.where(x > 0, x, 0.5)"),
    (s.method(s.binop(X, "*", Y), "mul_", T), "(x * y).mul_(t)"),
    (s.method(X, "new_full", s.tuple_of(), 2.0), "x.new_full((), 2.0)"),
    (s.call("torch.nn.functional.softplus", X, threshold=40.0), "torch.nn.functional.softplus(x, threshold=40.0)"),
    (s.method(X, "addcmul", Y, T, value=-8), "x.addcmul(y, t, value=-8)"),
    (s.call("float", s.string("nan")), 'float("nan")'),
    (s.unary("-", s.call("float", s.string("inf"))), '-float("inf")'),
    (s.compare(s.name("p"), "is", ast.Constant(None)), "p is None"),
    (s.call("_round_to", s.name("half"), s.starred(s.tuple_of(X, Y))), "_round_to(half, *(x, y))"),
    (s.tuple_of(X, s.binop(Y, "+", 1)), "x, y + 1"),
    (s.tuple_of(X), "x,"),
    (ast.Subscript(s.dotted("ctx.needs_input_grad"), s.number(0), ast.Load()), "ctx.needs_input_grad[0]"),
    (s.number(1e200), "1e+200"),
    (s.number(4611686018427387904), "4611686018427387904"),
]


@pytest.mark.parametrize("tree, text", CASES, ids=[text for _, text in CASES])
def test_source_and_plain(tree, text):
    assert s.source(tree) == text
    assert ast.dump(s.plain(tree)) == ast.dump(ast.parse(text, mode="eval").body)


@pytest.mark.parametrize(
    "tree, text",
    [
        (s.binop(X, "*", Y), "-x * y"),
        (s.binop(s.binop(X, "+", Y), "-", T), "-x + y - t"),
        (s.binop(X, "**", s.number(2)), "-x ** 2"),
        (s.parens(s.binop(X, "+", Y)), "-(x + y)"),
        (s.compare(X, "<", Y), "-x < y"),
    ],
)
def test_negate_is_a_leading_minus(tree, text):
    negated = s.negate(tree)
    assert s.source(negated) == text
    assert ast.dump(s.plain(negated)) == ast.dump(ast.parse(text, mode="eval").body)


def test_plain_leaves_the_tree_alone():
    tree = s.parens(s.binop(s.number(-1.5), "*", X))
    s.plain(tree)
    assert s.source(tree) == "(-1.5 * x)"


def test_a_generator_as_the_only_argument_keeps_one_pair_of_parentheses():
    tree = s.first_present("t", s.tuple_of("a", "b"))
    assert s.source(tree) == "next(t for t in (a, b) if t is not None)"
    assert ast.dump(s.plain(tree)) == ast.dump(ast.parse(s.source(tree), mode="eval").body)


def test_plain_shares_no_node():
    shared = s.binop(X, "+", 1)
    plain = s.plain(s.binop(shared, "*", shared))
    assert plain.left is not plain.right


@pytest.mark.parametrize(
    "left, op, right",
    [
        ("g", "*", s.binop(s.binop(3, "*", X), "*", Y)),
        ("g", "*", s.binop(X, "/", Y)),
        ("g", "*", s.binop(s.unary("-", X), "*", Y)),
        ("g", "*", s.binop(X, "**", 2)),
        ("g", "*", s.parens(s.binop(X, "+", Y))),
        (s.binop(X, "+", Y), "*", T),
        (s.binop(X, "-", Y), "+", s.binop(T, "-", X)),
        ("g", "*", s.number(-0.5)),
    ],
)
def test_joined_is_the_text_joined(left, op, right):
    text = f"{s.source(s._expr(left))} {op} {s.source(s._expr(right))}"
    tree = s.joined(left, op, right)
    assert s.source(tree) == text
    assert ast.dump(s.plain(tree)) == ast.dump(ast.parse(text, mode="eval").body)


def test_dotted_name_reads_names_and_attributes_only():
    assert s.dotted_name(s.dotted("torch.special.erf")) == "torch.special.erf"
    assert s.dotted_name(s.attribute(s.binop(X, "*", Y), "sum")) is None
