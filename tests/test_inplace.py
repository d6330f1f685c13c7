"""symgrad.plan.inplace: eager bodies mutate only their own fresh temporaries, and only safely.

The rules are checked on statements written as lines (data-driven, as the printer's own tests are); the
generated modules run them under gradcheck, gradgradcheck, vmap, jacrev/jacfwd, forward
AD, torch.compile and every dtype in test_generated.py. Here: what those cannot reach
(integer and mixed-dtype inputs, broadcasting, a batched upstream gradient), and what an
``--inplace`` Function refuses to overwrite.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from code_text import reuse_buffers
from test_fuzz import import_source
from torch.func import jacrev, vmap

import symgrad
import symgrad.plan.bodies
import symgrad.plan.inplace
from symgrad.api import source_for_spec
from symgrad.plan.docs import metadata_of
from symgrad.plan.inplace import Reuse
from symgrad.codegen.write import read_spec

ROOT = Path(__file__).resolve().parent.parent


def generate_fast(expr: str, name: str, **options) -> str:
    """The module --fast generates: eager bodies reuse their temporaries' buffers."""
    return symgrad.generate_source(expr, name, fast=True, **options)

TENSORS = frozenset({"x", "y", "grad_output", "x_tangent"})
GRADIENTS = frozenset({"grad_output", "x_tangent"})
PARAMS = frozenset({"p"})

# (line, the line after the rewrite)
REWRITES = [
    # a chain of arithmetic on the temporary it made first
    ("r = (0.5 * x * y + 1) * y", "r = (0.5 * x * y).add_(1).mul_(y)"),
    ("r = y * (0.5 * x * y)", "r = (0.5 * x * y).mul_(y)"),  # commutative: the fresh operand is the target
    ("r = -(x * y * 0.5)", "r = (x * y * 0.5).neg_()"),
    ("r = (0.5 * x * y) / (1 + y)", "r = (0.5 * x * y).div_(1 + y)"),
    ("r = 1 / (x * 0.5)", "r = (x * 0.5).reciprocal_()"),
    # unary functions of a fresh floating tensor
    ("r = torch.sin(0.5 * x)", "r = (0.5 * x).sin_()"),
    ("r = torch.exp(-0.5 * x ** 2)", "r = (-0.5 * x ** 2).exp_()"),
    # where: its shape comes from the condition too, its dtype from the branches only
    ("r = torch.where(x > 0, x, y) * y", "r = torch.where(x > 0, x, y) * y"),  # not floating
    ("r = torch.where(x > 0, x, 0.5 * y) * y", "r = torch.where(x > 0, x, 0.5 * y).mul_(y)"),
    ("r = torch.where(y > 0, x, 0.5) * y", "r = torch.where(y > 0, x, 0.5) * y"),  # y is not in the branches
    ("r = (0.5 * x * y) * torch.where(x > 0, y, 0)", "r = (0.5 * x * y) * torch.where(x > 0, y, 0)"),
    (
        "r = torch.sin(x) * torch.where(x > 1, torch.tensor(2.5, dtype=x.dtype, device=x.device), 1)",
        "r = torch.sin(x) * torch.where(x > 1, torch.tensor(2.5, dtype=x.dtype, device=x.device), 1)",
    ),
    # the upstream gradient is never absorbed: under jacrev only it is batched
    ("r = grad_output * (x * y)", "r = grad_output * (x * y)"),
    ("r = grad_output * x * y", "r = grad_output * x * y"),
    # a chain as an operand keeps its parentheses, so black puts one call on each line
    ("r = grad_output * (0.5 * x * y + 1)", "r = grad_output * ((0.5 * x * y).add_(1))"),
    # ... but a chain that starts from it covers it
    ("r = (grad_output * x + 1) * x", "r = (grad_output * x).add_(1).mul_(x)"),
    # an operand depending on a tensor the target does not: it could broadcast or be batched
    ("r = (x * 2) * y", "r = (x * 2) * y"),
    ("r = (x * 2) * p", "r = (x * 2) * p"),  # a param may be a tensor
    # names are never mutated
    ("r = x * y", "r = x * y"),
    # producers that keep their output for backward (double backward would fail)
    ("r = torch.exp(x) * y", "r = torch.exp(x) * y"),
    ("r = torch.sigmoid(x * y) * y", "r = torch.sigmoid(x * y) * y"),
    ("r = torch.sqrt(x * y) + y", "r = torch.sqrt(x * y) + y"),
    ("r = y ** x * y", "r = y ** x * y"),  # tensor ** tensor keeps its output
    ("r = torch.exp(torch.exp(x * 1.5))", "r = torch.exp((x * 1.5).exp_())"),
    # dtypes: an input may be an integer tensor; a floating value is not put into it
    ("r = (x * 2) * torch.sin(x)", "r = torch.sin(x).mul_(x * 2)"),  # the floating one is the target
    ("r = (x * 2) / x", "r = (x * 2) / x"),
    ("r = 1 / (x * y)", "r = torch.reciprocal(x * y)"),  # the same dtype as 1 / t, one kernel
    ("r = torch.sin(x * 2)", "r = torch.sin(x * 2)"),
    ("r = (x * 2) * x", "r = (x * 2) * x"),  # x may be an integer or bool tensor
    ("r = x * y + 1", "r = x * y + 1"),
    ("r = (x * 2.0) * torch.sin(x)", "r = (x * 2.0).mul_(torch.sin(x))"),
    # reductions and views are not targets
    ("r = (grad_output * x).expand(s) * 2", "r = (grad_output * x).expand(s) * 2"),
    # ... nor operands: .expand() may make a value larger than its tensors together
    ("r = (grad_output * 2.0) * (grad_output * x).expand(ctx.s)", "r = (grad_output * 2.0) * (grad_output * x).expand(ctx.s)"),
    ("r = torch.sum(x * 2.0) * x", "r = torch.sum(x * 2.0) * x"),
    # the printer's number as a 0-d tensor (t.new_full((), c)) is an operand, never a target
    ("r = torch.hypot(x * 2.0, x.new_full((), 1)) - 1", "r = torch.hypot(x * 2.0, x.new_full((), 1)) - 1"),  # (saves output)
    ("r = (x * 2.0) / torch.hypot(x, x.new_full((), 1))", "r = (x * 2.0).div_(torch.hypot(x, x.new_full((), 1)))"),
    ("r = torch.sin(x * 2.0) * x.new_full((), 1.5)", "r = (x * 2.0).sin_().mul_(x.new_full((), 1.5))"),
    ("r = x.new_full((), 1.5) + torch.sin(x * 2.0)", "r = (x * 2.0).sin_().add_(x.new_full((), 1.5))"),
    ("r = y.new_full((), 1.5) * torch.sin(x * 2.0)", "r = y.new_full((), 1.5) * ((x * 2.0).sin_())"),
    # 1 / t as one kernel (Python's is reciprocal(t) * 1); not of a param, maybe a number
    ("r = 1 / x", "r = torch.reciprocal(x)"),
    ("r = 1 / p", "r = 1 / p"),
    # a sum's product or quotient term as one fused kernel, out of place (the in-place forms
    # have no vmap batching rule): floating operands, or a floating sum built from them
    ("r = torch.sin(x * y) + x * y", "r = torch.sin(x * y).addcmul(x, y)"),
    (
        "r = torch.sin(x) - 2 * torch.exp(x) * torch.tanh(x)",
        "r = torch.sin(x).addcmul(torch.exp(x), torch.tanh(x), value=-2)",  # (each keeps its output)
    ),
    # ... but a fresh factor takes the product in place and the fresh sum the term: nothing
    # allocated (glibc's default allocator page-faults each new buffer)
    (
        "r = torch.sin(x) - 2 * torch.cos(x) * torch.exp(x)",
        "r = torch.sin(x).add_(torch.cos(x).mul_(torch.exp(x)), alpha=-2)",
    ),
    ("r = torch.sin(x) - torch.exp(x) * torch.cos(x)", "r = torch.sin(x).sub_(torch.cos(x).mul_(torch.exp(x)))"),
    ("r = torch.sin(x) + torch.cos(x) / x", "r = torch.sin(x).add_(torch.cos(x).div_(x))"),
    ("r = torch.sin(x) + x / torch.cos(x)", "r = torch.sin(x).addcdiv(x, torch.cos(x))"),  # (x is no target)
    ("r = y - torch.exp(x) * torch.log1p(y)", "r = y.addcmul(torch.exp(x), torch.log1p(y), value=-1)"),
    ("r = x * torch.exp(x) + torch.sin(x)", "r = torch.sin(x).addcmul(x, torch.exp(x))"),
    (
        "r = torch.sin(x * y) + 0.5 * torch.exp(x) / (1 + y)",
        "r = torch.sin(x * y).addcdiv(torch.exp(x), 1 + y, value=0.5)",
    ),
    ("r = torch.sin(x) - 3 * x", "r = torch.sin(x).add_(x, alpha=-3)"),  # alpha in place where it may be
    ("r = torch.exp(x) + 3 * x", "r = torch.exp(x).add(x, alpha=3)"),  # (exp keeps its output)
    # ... not where the dtype could differ or a number is no tensor
    ("r = torch.sin(x) + x * y", "r = torch.sin(x) + x * y"),  # y could be wider
    ("r = x + torch.sin(x * y) * y", "r = torch.sin(x * y).mul_(y).add_(x)"),  # x: maybe an integer
    ("r = torch.sin(x * y) + x / y", "r = torch.sin(x * y) + x / y"),  # addcdiv refuses two integers
    ("r = torch.sin(x * y) + 0.5 * x * y / (1 + y)", "r = torch.sin(x * y) + ((0.5 * x * y).div_(1 + y))"),
    ("r = torch.sin(x) + p * x", "r = torch.sin(x) + p * x"),  # a param may be a number
    ("r = grad_output * x + torch.sin(x)", "r = grad_output * x + torch.sin(x)"),  # sin of an integer x
    ("r = grad_output * x_tangent + torch.sin(x_tangent)", "r = torch.sin(x_tangent).addcmul(grad_output, x_tangent)"),
    # a Python float times a tensor that may be an integer one is of the default dtype: not
    # added into a target that another tensor (float16, say) could make narrower (review)
    ("r = torch.sin(x * y) + 0.5 * y", "r = torch.sin(x * y) + 0.5 * y"),
    ("r = x / y + torch.sin(x)", "r = x / y + torch.sin(x)"),
    ("r = torch.sin(x * y) + 0.5 * y * torch.exp(x)", "r = torch.sin(x * y) + 0.5 * y * torch.exp(x)"),
    ("r = torch.sin(x * y) + 2 * y * torch.exp(x)", "r = torch.sin(x * y).addcmul(y, torch.exp(x), value=2)"),
    ("r = torch.sin(x) + 0.5 * x", "r = torch.sin(x).add_(x, alpha=0.5)"),  # one tensor: one dtype
    # untouched lines keep the printer's spelling
    ("r = (x).sum()", "r = (x).sum()"),
    ("if ctx.needs_input_grad[0]:", "if ctx.needs_input_grad[0]:"),
]


@pytest.mark.parametrize("line, expected", REWRITES, ids=[line for line, _ in REWRITES])
def test_rewrite(line, expected):
    (got,), _ = reuse_buffers((line,), "", TENSORS, GRADIENTS, PARAMS)
    assert got == expected


def _count_visits(monkeypatch) -> list:
    visited = []
    visit = symgrad.plan.inplace._Rewriter.visit

    def counted(self, node):
        visited.append(node)
        return visit(self, node)

    monkeypatch.setattr(symgrad.plan.inplace._Rewriter, "visit", counted)
    return visited


def test_a_long_sum_is_rewritten_in_linear_work(monkeypatch):
    """150 terms, each a product a fused op could add (review find: a memo keyed by
    ast.dump made this quadratic, 50x slower at 120 terms, and it hit Python's recursion
    limit from 140)."""
    terms = 150
    line = "r = " + " + ".join(f"{n + 1.5!r} * torch.sin(x * {n}.0) * y" for n in range(terms))
    visited = _count_visits(monkeypatch)
    (got,), _ = reuse_buffers((line,), "", TENSORS, GRADIENTS, PARAMS)
    assert len(visited) < 40 * terms
    assert got.count(".addcmul(") + got.count(".add_(") + got.count(".mul_(") >= terms - 1
    x = torch.linspace(-2, 2, 9, dtype=torch.float64)
    y = torch.linspace(0.5, 3, 9, dtype=torch.float64)
    assert torch.allclose(eval(got[4:], {"torch": torch, "x": x, "y": y}), eval(line[4:], {"torch": torch, "x": x, "y": y}))


def test_horners_scheme_is_one_chain_and_each_term_is_visited_a_bounded_number_of_times(monkeypatch):
    """Horner's scheme nests a term in each term (a Taylor series of degree 36 nests 18):
    visiting each term's factors on copies and then the term whole visited the innermost
    one 2**18 times (the fuzz campaign's tanh(x) - x**-2 ran 100 s, against 4 s before the
    series printed as Horner). The rewrite must stay linear and give the same chain."""
    degree = 12  # (visiting terms again: 24574 visits, a count that fails in a few seconds)
    text = f"{degree + 1.0!r}"
    for n in range(degree, 0, -1):
        text = f"{float(n)!r} + s * ({text})"
    lines = ("s = x * y", f"r = {text}")
    visited = _count_visits(monkeypatch)
    (_, got), _ = reuse_buffers(lines, "", TENSORS, GRADIENTS, PARAMS)
    assert len(visited) < 20 * degree
    # The innermost product is the first fresh tensor; every step after it is in place.
    steps = "".join(f".add_({float(n)!r}).mul_(s)" for n in range(degree, 1, -1))
    assert got == f"r = (s * {degree + 1.0!r}){steps}.add_(1.0)"
    s = torch.linspace(-1.5, 1.5, 7, dtype=torch.float64)
    assert torch.allclose(eval(got[4:], {"s": s}), eval(text, {"s": s}), rtol=1e-14, atol=0)


def test_temporaries_carry_what_they_depend_on():
    lines = ("t0 = torch.exp(-x)", "t1 = y ** 2", "r = (2 * t0 * y) / (1 + t1)", "u = (t0 * 2.0) * y")
    got, returns = reuse_buffers(lines, "(t0 * 3.0) * t0, t1 * 1.5", TENSORS, GRADIENTS, PARAMS)
    assert got[2] == "r = (2 * t0 * y).div_(1 + t1)"  # t1 depends on y only
    assert got[3] == "u = (t0 * 2.0) * y"  # t0 * 2.0 depends on x only
    assert returns == "((t0 * 3.0).mul_(t0), t1 * 1.5)"


def test_a_param_replaced_by_a_number_still_counts():
    """``p = ctx.p_number`` runs only when p was not saved as a tensor: p may still be one,
    and ``ctx`` itself is no tensor that would let an operand in."""
    lines = (
        "if p is None:",
        "    p = ctx.p_number",
        "r = (x * 2.0) * p",
        "s = (x * p * 2.0) * p",
        "u = (grad_output * p * 2.0) * (grad_output * p).expand(ctx.shape)",
    )
    got, _ = reuse_buffers(lines, "", TENSORS, GRADIENTS, PARAMS)
    assert got[2:] == (
        "r = (x * 2.0) * p",
        "s = (x * p * 2.0).mul_(p)",
        "u = ((grad_output * p).mul_(2.0)) * (grad_output * p).expand(ctx.shape)",
    )


def test_abs_keeps_an_integer_dtype():
    (got,), _ = reuse_buffers(("r = torch.abs(x) / x",), "", TENSORS, GRADIENTS, PARAMS)
    assert got == "r = torch.abs(x) / x"


def _in_place_and_not(text: str, name: str, directory, monkeypatch, **options):
    """The module as generated, and with reuse_buffers switched off (the out-of-place code)."""
    new = import_source(generate_fast(text, name, **options), directory)
    with monkeypatch.context() as patch:
        patch.setattr(symgrad.plan.bodies, "reuse_buffers_in", lambda method, *rest: Reuse(method, False, False))
        old = import_source(generate_fast(text, name, **options), directory)
    return new, old


# (expression, inputs): what a fresh-eyes review found, the forward run on odd dtypes
DTYPE_CASES = [
    ("x*y + 1", [torch.tensor([True, False]), torch.tensor([True, True])]),  # bool * bool is bool
    # a 0-d float32 y does not promote a float16 x, but where(x > 0, y, 0) has x's shape
    ("x*y*Piecewise((y, x > 0), (0, True))", [torch.tensor([0.3, -1.0, 2.0], dtype=torch.float16), torch.tensor(1.1)]),
    ("x*Piecewise((y, x > 0), (0, True))", [torch.tensor([0.3, -1.0, 2.0]), torch.tensor([1, 2, 3])]),
    ("x*Piecewise((y, x > 0), (0, True))", [torch.tensor([0.3, -1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)]),
    ("sin(x)*Piecewise((2.5, x > 1), (1, True))", [torch.arange(-2, 3)]),
    ("x**3/(1 + x**2) + 2*x*x", [torch.arange(-3, 4)]),
    # a Python float times an integer y is float32, wider than float16 x's terms (review)
    ("sin(x*y) + y/2", [torch.tensor([0.3, -1.0, 2.0], dtype=torch.float16), torch.tensor([1, 2, 3])]),
    ("sin(x*y) + y/2*exp(x)", [torch.tensor([0.3, -1.0, 2.0], dtype=torch.float16), torch.tensor([1, 2, 3])]),
    ("x/y + sin(x)", [torch.tensor([1, 2, 3]), torch.tensor([0.3, -1.0, 2.0], dtype=torch.float16)]),
    # an integer tensor to a negative power: x**-2.0, not x**-2, which torch refuses (review)
    ("y + 3/x**2", [torch.tensor([1, 2, 3]), torch.tensor([0.5, 1.0, 2.0])]),
]


@pytest.mark.parametrize("text, args", DTYPE_CASES, ids=[text for text, _ in DTYPE_CASES])
def test_forward_matches_out_of_place_on_any_dtype(text, args, tmp_path, monkeypatch):
    names = tuple(sorted({"x", "y"} & set(text)))
    modules = _in_place_and_not(text, "Odd", tmp_path, monkeypatch, inputs=names)
    new, old = (getattr(m, metadata_of(m)["alias"])(*args) for m in modules)
    assert new.dtype == old.dtype
    torch.testing.assert_close(new, old, rtol=0, atol=0)


def test_backward_matches_out_of_place_with_an_integer_input(tmp_path, monkeypatch):
    """An integer label y and a float x: the gradient by x is exact (review find)."""
    text = "x**2*Piecewise((y, x > 0), (0, True)) + x"
    modules = _in_place_and_not(text, "Label", tmp_path, monkeypatch, inputs=("x", "y"))
    grads = []
    for module in modules:
        x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
        y = torch.tensor([1, 2, 3])
        getattr(module, metadata_of(module)["alias"])(x, y).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    torch.testing.assert_close(grads[0], torch.tensor([2.0, 1.0, 13.0], dtype=torch.float64))


def test_an_integer_param_to_a_negative_power(tmp_path):
    """A tensor param may be an integer one: 2/n**2 prints as 2 * n**-2.0 (review find)."""
    module = import_source(generate_fast("x + 2/n**2", "IntParam", params=["n"]), tmp_path)
    x = torch.tensor([0.5, 1.0], requires_grad=True)
    out = module.int_param(x, torch.tensor(3))
    torch.testing.assert_close(out, x.detach() + 2 / torch.tensor(3) ** 2)
    assert out.dtype == torch.float32


def test_integer_inputs_keep_working(tmp_path):
    """An integer input is not written with floats: forward matches torch on int64."""
    module = import_source(generate_fast("x**3/(1 + x**2) + 2*x*x + sin(x)*x", "IntPoly"), tmp_path)
    x = torch.arange(-3, 4)
    expected = x**3 / (1 + x**2) + 2 * x * x + torch.sin(x) * x
    torch.testing.assert_close(module.int_poly(x), expected)


def test_numbers_made_tensors_follow_type_promotion_with_an_integer_input(tmp_path):
    """A number param in a torch function, and a Piecewise of numbers, with an integer input:
    the dtype eager torch gives them (float32), not the input's (a user hunt: 0.5 was cast
    to 0, so x*sigmoid(0.5*x) computed x*sigmoid(0*x), and 2.5 to 2)."""
    x = torch.arange(-3, 4)
    swish = import_source(generate_fast("x*sigmoid(beta*x)", "IntSwish", params=["beta"]), tmp_path)
    torch.testing.assert_close(swish.int_swish(x, 0.5), x * torch.sigmoid(0.5 * x))
    text = "Piecewise((x**2/2, abs(x) <= d), (d*(abs(x) - d/2), True))"
    huber = import_source(generate_fast(text, "IntHuber", params=["d"]), tmp_path)
    torch.testing.assert_close(huber.int_huber(x, 1.5), torch.where(x.abs() <= 1.5, x**2 / 2, 1.5 * (x.abs() - 0.75)))
    scaled = import_source(generate_fast("sin(x)*Piecewise((2.5, x > 1), (1, True))", "IntScaled"), tmp_path)
    torch.testing.assert_close(scaled.int_scaled(x), torch.sin(x) * torch.where(x > 1, 2.5, 1.0))


def test_an_in_place_function_refuses_a_result_its_input_cannot_hold(tmp_path):
    """As torch.tensor([1, 2]).exp_() does: copy_ truncated exp of an int64 tensor to [2, 7]
    (a user hunt). Where the dtype holds it, the write goes ahead."""
    module = import_source(generate_fast("exp(x)", "IntExp_", inplace=True), tmp_path)
    for x in (torch.tensor([1, 2]), torch.tensor([True, False])):
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
            module.int_exp_(x)
        assert x.tolist() in ([1, 2], [True, False])
    x = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert module.int_exp_(x) is x and x.tolist() == [1.0, torch.e]


def test_an_in_place_function_refuses_a_gradient_that_reads_what_it_overwrote(tmp_path):
    """mul_(a, a): the second input is the memory forward overwrites, and backward read its
    new values (a wrong gradient, silently: a user hunt). Now the gradient that reads it
    raises, as torch's own a.mul_(a) does at backward; a copy, inference, and a gradient that
    does not read it go ahead (review finds)."""
    module = import_source(generate_fast("x*y + sin(x)", "Fma_", inplace=True), tmp_path)
    leaf = torch.tensor([0.5, 1.0, 2.0], requires_grad=True)
    message = r"y shares memory with the input this in-place function overwrote, .* \(y.clone\(\)\)"
    for second in (lambda a: a, lambda a: a[:], lambda a: a.detach()):  # itself, a view, detached
        a = leaf * 1
        out = module.fma_(a, second(a))
        with pytest.raises(RuntimeError, match=message):
            torch.autograd.grad(out.sum(), leaf)
    (grad,) = torch.autograd.grad(module.fma_(leaf * 1, (leaf * 1).detach()).sum(), leaf)
    torch.testing.assert_close(grad, leaf.detach() + torch.cos(leaf.detach()))
    a = leaf * 1
    (grad,) = torch.autograd.grad(module.fma_(a, a.clone()).sum(), leaf)
    torch.testing.assert_close(grad, 2 * leaf.detach() + torch.cos(leaf.detach()))
    with torch.no_grad():  # (an nn.Parameter updated in place: no gradient, nothing to refuse)
        b = leaf.detach().clone().requires_grad_()
        module.fma_(b, b)
    torch.testing.assert_close(b.detach(), leaf.detach() ** 2 + torch.sin(leaf.detach()))
    with torch.inference_mode():  # (inference tensors have no version counter to read)
        b = leaf.detach().clone()
        module.fma_(b, b)
    torch.testing.assert_close(b, leaf.detach() ** 2 + torch.sin(leaf.detach()))
    # Only y's gradient is wanted, and it reads x's copy, not y: the write into y is harmless.
    y = leaf * 1
    (grad,) = torch.autograd.grad(module.fma_(y.detach(), y).sum(), leaf)
    torch.testing.assert_close(grad, leaf.detach())
    shift = import_source(generate_fast("exp(x) + y", "Shift_", inplace=True), tmp_path)
    c = leaf * 1
    (grad,) = torch.autograd.grad(shift.shift_(c, c).sum(), leaf)  # backward reads no y
    torch.testing.assert_close(grad, torch.exp(leaf.detach()) + 1)


def test_mixed_dtypes_and_broadcasting_keep_working(tmp_path):
    """float16 and float64 inputs of different shapes: the same values as out of place."""
    text = "exp(-x)*log(1 + y**2)*y + x*y/(1 + y**2)"
    module = import_source(generate_fast(text, "MixedInputs"), tmp_path)
    x = torch.linspace(-1, 1, 3, dtype=torch.float16).reshape(3, 1).requires_grad_()
    y = torch.linspace(-2, 2, 4, dtype=torch.float64).requires_grad_()
    out = module.mixed_inputs(x, y)
    expected = torch.exp(-x) * torch.log(1 + y**2) * y + x * y / (1 + y**2)
    assert out.dtype == torch.float64 and out.shape == (3, 4)
    torch.testing.assert_close(out, expected)
    gx, gy = torch.autograd.grad(out.sum(), (x, y))
    ex, ey = torch.autograd.grad(expected.sum(), (x, y))
    torch.testing.assert_close(gx, ex, rtol=1e-3, atol=1e-3)  # float16
    torch.testing.assert_close(gy, ey)


def test_batched_upstream_gradient_and_unbatched_inputs(tmp_path):
    """jacrev batches only the upstream gradient; vmap over one input batches only that one."""
    source = generate_fast("(x*y + 1)*y*sin(x) + x/(1 + y**2)", "Batched", inputs=("x", "y"))
    module = import_source(source, tmp_path)
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    y = torch.linspace(0.5, 2, 5, dtype=torch.float64)

    def reference(x, y):
        return (x * y + 1) * y * torch.sin(x) + x / (1 + y**2)

    for argnums in (0, 1):
        torch.testing.assert_close(jacrev(module.batched, argnums)(x, y), jacrev(reference, argnums)(x, y))
    batch = torch.stack([x, 2 * x])
    torch.testing.assert_close(vmap(module.batched, (0, None))(batch, y), vmap(reference, (0, None))(batch, y))
    torch.testing.assert_close(vmap(module.batched, (None, 0))(x, batch), vmap(reference, (None, 0))(x, batch))


def test_torch_compile_twin_runs_the_forward_out_of_place(module):
    """Under torch.compile the alias calls the jvp-less twin, whose forward is the forward
    as written: buffer reuse buys nothing there (inductor plans its own buffers), and Dynamo
    in torch 2.11 gave zero gradients through some in-place forwards (SqrtInverse, GELU,
    Mish; found on a GPU machine). The eager class keeps the in-place forward, with the
    same values."""
    meta = metadata_of(module)
    if meta["inplace"]:
        pytest.skip("an --inplace Function writes its input: torch.compile's twin does not apply")
    import inspect
    import re

    from test_generated import sample

    eager, twin = getattr(module, meta["function"]), getattr(module, f"_{meta['function']}NoJvp")
    in_place = re.compile(r"\.[a-z]\w*_\(")
    rewritten = re.compile(r"\.[a-z]\w*_\(|torch\.reciprocal\(|\.(addcmul|addcdiv)\(|alpha=")
    assert not in_place.search(inspect.getsource(twin.forward)), "in-place op in the twin"
    if "forward" in vars(eager):  # (overridden only where symgrad.inplace rewrote the forward)
        assert rewritten.search(inspect.getsource(eager.forward)), "the eager class lost its rewritten forward"
    args = [a.detach() if torch.is_tensor(a) else a for a in sample(module, "cpu")]
    with torch.no_grad():
        outputs = eager.forward(*args), twin.forward(*args)
    for got, want in zip(*(o if isinstance(o, tuple) else (o,) for o in outputs)):
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


def test_eager_classes_keep_the_in_place_forward(tmp_path):
    """Under --fast, the twin's out-of-place forward must not replace the eager one: buffer
    reuse is what makes the eager forward faster (tests/test_speed.py measures the passes)."""
    for stem in ("sqrt_inverse", "gelu", "sinc"):
        spec = dataclasses.replace(read_spec((ROOT / "generated" / f"{stem}.py").read_text()), fast=True)
        module = import_source(source_for_spec(spec), tmp_path)
        assert "forward" in vars(getattr(module, spec.name)), stem


def test_default_bodies_are_out_of_place():
    """Without --fast the generated modules write no temporary in place and fuse no sum's
    terms: plain arithmetic, readable against the docstring's derivatives. (The runtime
    helpers a module carries are hand-written and tested on their own: _scatter_added adds
    in place into a fresh tensor, by design.)"""
    from symgrad.codegen.printer import HELPERS

    for path in sorted((ROOT / "generated").glob("*.py")):
        source = path.read_text()
        spec = read_spec(source) if "symgrad-spec" in source else None
        if spec is None or spec.inplace:
            continue
        for helper in HELPERS.values():
            source = source.replace("\n".join(helper), "")
        for fragment in (".addcmul(", ".addcdiv(", "alpha=", ".add_(", ".mul_(t", ".sub_(", ".div_("):
            assert fragment not in source, (path.name, fragment)


def test_fast_is_recorded_and_rebuilt():
    """--fast is part of the header's spec, so `symgrad regen` and `symgrad check` rebuild it."""
    source = generate_fast("x*exp(x) + sin(x)", "FastFused")
    assert '"fast": true' in source.splitlines()[2]
    assert source_for_spec(read_spec(source)) == source
    assert source != symgrad.generate_source("x*exp(x) + sin(x)", "FastFused")


def test_docstring_names_only_what_the_rewrite_wrote():
    """1/x + x's bodies gain torch.reciprocal and no in-place op: the docstring does not
    describe in-place methods (review find: it did, whenever a body changed at all)."""
    source = generate_fast("1/x + x", "Recip")
    assert "torch.reciprocal(x)" in source
    assert "In-place methods" not in source and "addcmul" not in source
    sinc = generate_fast("sin(x)/x", "Sinc")  # Horner's chain: in place, no fused sum
    assert "In-place methods" in sinc and "A sum's product and quotient terms" not in sinc
    fused = generate_fast("x*exp(x) + sin(x)", "Fused")
    assert "In-place methods" in fused and "A sum's product and quotient terms" in fused and ".addcmul(" in fused
