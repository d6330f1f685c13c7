"""The SymPy-to-torch printer: every supported function evaluates to the exact value.

One case per function in ``functions.FUNCTIONS`` and ``printer.PRINTERS``: the printed
code, evaluated by torch on a float64 tensor, must equal SymPy's ``evalf`` (mpmath) at a
few points of the function's domain. Then the printer's known traps: ``Max(x, 1)`` is a
clamp, ``Heaviside(0)`` is 1/2, ``gamma`` has the right sign for negative non-integers,
rationals print as floats, and constants follow the inputs' dtype.
"""

from __future__ import annotations

import math
import re

import pytest
import sympy
import torch
from code_text import reuse_buffers

from symgrad.errors import SymgradError
from symgrad.codegen import syntax
from symgrad.codegen.printer import HELPERS, PRINTERS, TorchPrinter, print_torch, prints_as_sum
from symgrad.frontend.grammar import FUNCTIONS, REDUCTIONS, ROW_FUNCTIONS
from symgrad.math import functions as sf
from symgrad.math import series as taylor
from symgrad.rewrite.engine import stabilize

X, Y = sympy.symbols("x y", real=True)
NAMES = {X: "x", Y: "y"}

# name -> (expression, points for x (and y)). Points lie in each function's domain.
ALL_REALS = [-2.5, -0.7, 0.0, 0.3, 1.9]
POSITIVE = [0.05, 0.7, 1.0, 3.3, 40.0]
UNIT = [-0.9, -0.2, 0.0, 0.4, 0.95]
ABOVE_ONE = [1.01, 1.5, 4.0, 30.0]
PAIRS = [(-1.2, 0.4), (0.0, 2.0), (3.0, -0.5), (0.7, 0.7), (-2.0, -3.0)]
POSITIVE_PAIRS = [(-1.2, 0.4), (0.0, 2.0), (3.0, 0.5), (0.7, 0.7), (2.5, 1e-3)]

# name -> (arguments, points). The expression is built by FUNCTIONS[name], as the parser
# builds it; points lie in each function's domain.
CASES = {
    "sqrt": ((X,), POSITIVE),
    "exp": ((X,), ALL_REALS + [50.0]),
    "log": ((X,), POSITIVE),
    "log1p": ((X,), [-0.5, 0.0, 1e-10, 2.0]),
    "expm1": ((X,), [-3.0, -1e-10, 0.0, 1e-8, 2.0]),
    "sin": ((X,), ALL_REALS),
    "cos": ((X,), ALL_REALS),
    "tan": ((X,), ALL_REALS),
    "asin": ((X,), UNIT),
    "acos": ((X,), UNIT),
    "atan": ((X,), ALL_REALS),
    "atan2": ((Y, X), PAIRS),
    "sinh": ((X,), ALL_REALS),
    "cosh": ((X,), ALL_REALS),
    "tanh": ((X,), ALL_REALS),
    "asinh": ((X,), ALL_REALS),
    "acosh": ((X,), ABOVE_ONE),
    "atanh": ((X,), UNIT),
    "Abs": ((X,), ALL_REALS),
    "abs": ((X,), ALL_REALS),
    "sign": ((X,), ALL_REALS),
    "Max": ((X, Y), PAIRS),
    "Min": ((X, Y), PAIRS),
    "max": ((X, Y, 0), PAIRS),
    "min": ((X, Y, sympy.Rational(1, 2)), PAIRS),
    "relu": ((X,), ALL_REALS),
    "clamp": ((X, -1, Y), PAIRS + [(5.0, -3.0)]),
    "where": ((sympy.And(X > 0, Y < 1), X * Y, X - Y), PAIRS),
    "Piecewise": (((X**2, X < 0), (sympy.sqrt(X + 1), X < 1), (X, True)), ALL_REALS + [5.0]),
    "Heaviside": ((X,), ALL_REALS),
    "floor": ((X,), ALL_REALS),
    "ceiling": ((X,), ALL_REALS),
    "round": ((X,), ALL_REALS + [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.5000000000000004]),
    "erf": ((X,), ALL_REALS),
    "erfc": ((X,), ALL_REALS + [6.0]),
    "gamma": ((X,), [-2.5, -1.5, -0.5, 0.3, 1.0, 4.5]),
    "loggamma": ((X,), POSITIVE),
    "digamma": ((X,), POSITIVE + [-0.5]),
    "sigmoid": ((X,), ALL_REALS + [30.0, -30.0]),
    "softplus": ((X,), ALL_REALS + [30.0, -30.0, 60.0]),
    "logaddexp": ((X, Y), PAIRS + [(100.0, -100.0)]),
    "hypot": ((X, Y), PAIRS + [(1e200, 1e200)]),
    "xlogy": ((X, Y), POSITIVE_PAIRS),
    "ndtr": ((X,), ALL_REALS + [-12.0, 12.0]),
    "log_ndtr": ((X,), ALL_REALS + [-40.0, 12.0]),
    "erfcx": ((X,), ALL_REALS + [-9.0, 30.0, 1e5]),
}


def build(name: str) -> sympy.Expr:
    return FUNCTIONS[name].build(*CASES[name][0])


# Printer-only functions (SymPy forms that symgrad produces itself), by class.
EXTRA = {
    sympy.polygamma: (sympy.polygamma(2, X), POSITIVE),
    sf.guard: (sf.guard(X, X > 0, 1), ALL_REALS),
    sf.hypot_excess: (sf.hypot_excess(X, Y), POSITIVE_PAIRS + [(1e-9, 2.0), (-1e200, 1e200)]),
    sf.norm_ratio: (sf.norm_ratio(X, sf.hypot(X, Y)), POSITIVE_PAIRS + [(-1e-300, 1e-300), (3e200, -4e200)]),
    sf.finite: (sf.finite(X), [0.0, -1e-300, 3.0, -1e300]),
    # (forward only: kernels.FORWARD_KERNELS)
    sf.mish: (sf.mish(X), ALL_REALS + [-30.0, 1e-8, 50.0]),
    sf.silu: (sf.silu(X), ALL_REALS + [-30.0, 1e-8, 50.0]),
    sf.log_sigmoid: (sf.log_sigmoid(X), ALL_REALS + [-50.0, 1e-8, 30.0]),
    # (printed on its own, its numbers a and p passed as they are: its switch points need them)
    sf.power_excess: (sf.power_excess(X, 2, sympy.Rational(3, 2)), [0.0, 1e-9, -1e-9, 0.5, -1.9, 3.0, 100.0, 1e10]),
}


def run(expr: sympy.Expr, point, dtype=torch.float64):
    code = print_torch(expr, NAMES)
    point = point if isinstance(point, tuple) else (point,)
    symbols = sorted(expr.free_symbols, key=str)
    env = {"torch": torch}
    for source in HELPERS.values():  # (as a generated module defines them)
        exec("\n".join(source), env)  # noqa: S102 - our own helpers
    for symbol, value in zip([X, Y], point):
        env[NAMES[symbol]] = torch.tensor([value], dtype=dtype)
    result = eval(code, env)  # noqa: S307 - our own printed code
    assert isinstance(result, torch.Tensor), code
    return code, result, dict(zip([X, Y], point)), symbols


def exact(expr: sympy.Expr, values: dict) -> float:
    return float(sympy.N(expr.subs({s: sympy.Float(v, 30) for s, v in values.items()}), 30))


def check(expr: sympy.Expr, points) -> None:
    for point in points:
        code, result, values, _ = run(expr, point)
        want = exact(expr, values)
        got = result.item()
        assert got == pytest.approx(want, rel=1e-13, abs=1e-300), (code, point)


@pytest.mark.parametrize("name", sorted(set(FUNCTIONS) - set(ROW_FUNCTIONS)))
def test_every_user_function_prints_to_its_exact_value(name):
    check(build(name), CASES[name][1])


@pytest.mark.parametrize("cls", list(EXTRA), ids=[c.__name__ for c in EXTRA])
def test_printer_only_functions(cls):
    expr, points = EXTRA[cls]
    check(expr, points)


@pytest.mark.parametrize("name", ["log_ndtr", "erfcx"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_helpers_compute_half_precision_in_float32(name, dtype):
    """ATen has no float16 or bfloat16 CPU kernel for log_ndtr and erfcx; the printed helpers
    compute those in float32, and keep the input's dtype."""
    expr = build(name)
    for point in ALL_REALS:
        code, result, values, _ = run(expr, point, dtype)
        assert result.dtype == dtype, code
        assert result.item() == pytest.approx(exact(expr, values), rel=torch.finfo(dtype).eps), (code, point)


def test_every_printer_has_a_case():
    covered = {type(build(name)) for name in CASES} | {type(expr) for expr, _ in EXTRA.values()}
    assert set(PRINTERS) <= covered


def test_every_stable_function_has_a_printer():
    # (log1mexp prints its Piecewise through torch_code, as Removable does)
    assert all(f in PRINTERS or hasattr(f, "torch_code") for f in sf.STABLE_FUNCTIONS)


def test_reductions_need_no_printer():
    assert set(REDUCTIONS) == {"sum", "mean"}


def test_max_with_a_number_is_a_clamp():
    code = print_torch(sympy.Max(X, 1), NAMES)
    assert code == "torch.clamp(x, min=1)"
    assert print_torch(sympy.Min(X, sympy.Rational(1, 2)), NAMES) == "torch.clamp(x, max=0.5)"
    code, result, _, _ = run(sympy.Max(X, 1), -3.0)
    assert result.item() == 1.0
    code, result, _, _ = run(sympy.Max(X, Y, 2), (5.0, -1.0))
    assert result.item() == 5.0 and "torch.maximum" in code


def test_heaviside_at_zero_is_half():
    _, result, _, _ = run(sympy.Heaviside(X), 0.0)
    assert result.item() == 0.5
    _, result, _, _ = run(sympy.Heaviside(X), -1e-300)
    assert result.item() == 0.0


@pytest.mark.parametrize("point", [-0.5, -1.5, -2.5, -3.5, -10.3, 0.5, 6.0])
def test_gamma_sign_at_negative_non_integers(point):
    _, result, values, _ = run(sympy.gamma(X), point)
    want = math.gamma(point)
    assert math.copysign(1.0, result.item()) == math.copysign(1.0, want)
    assert result.item() == pytest.approx(want, rel=1e-12)


def test_rationals_and_constants_print_as_floats():
    assert print_torch(sympy.Rational(1, 3), NAMES) == "0.3333333333333333"
    code = print_torch(sympy.Rational(2, 3) * X + sympy.pi + sympy.E * X**2 + sympy.Rational(5, 2), NAMES)
    assert "2/3" not in code and "0.6666666666666666" in code
    # pi + 5/2 is one constant, folded to a float; E stays a coefficient.
    assert "5.641592653589793" in code and "2.718281828459045" in code
    assert print_torch(sympy.sqrt(10) * X, NAMES) == "3.1622776601683795 * x"
    assert print_torch(X / 4, NAMES) == "0.25 * x"
    assert print_torch(X ** sympy.Rational(1, 3), NAMES) == "x ** (0.3333333333333333)"
    assert print_torch(1 / X, NAMES) == "1 / x"
    assert print_torch(sympy.sqrt(X), NAMES) == "torch.sqrt(x)"
    assert print_torch(1 / sympy.sqrt(X), NAMES) == "torch.rsqrt(x)"
    # A Float coefficient of 1 is no multiplication: GELU written 0.5*x*(1 + erf(x/sqrt(2)))
    # printed 1.0 * x * ... and .mul_(1.0), one kernel each in forward and backward (a user hunt).
    assert print_torch(sympy.Float(1.0) * X * sympy.exp(X), NAMES) == "x * torch.exp(x)"
    assert print_torch(sympy.Float(-1.0) * X * sympy.exp(X), NAMES) == "-x * torch.exp(x)"
    # (but where it is what makes an integer or bool input's product float, as in eager torch)
    assert print_torch(sympy.Float(1.0) * X**2, NAMES) == "1.0 * x ** 2"
    assert print_torch(sympy.Float(-1.0) * X * sympy.Abs(X), NAMES).startswith("-1.0 * ")


DTYPE_EXPRS = [
    X / 3 + sympy.pi,
    sympy.Piecewise((1, X > 0), (2, True)),
    sympy.Heaviside(X),
    sympy.Max(X, 1),
    sympy.gamma(X + 3),
    sf.hypot(X, 1),
    sf.logaddexp(X, 1),
    sf.softplus(X),
    sf.sigmoid(X),
    sf.xlogy(X + 1, 2),
    sf.ndtr(X),
    stabilize(sympy.sin(X) / X),
    stabilize(sympy.Piecewise((sympy.sqrt(X), X > 0), (0, True))),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("expr", DTYPE_EXPRS, ids=[str(e) for e in DTYPE_EXPRS])
def test_constants_follow_dtype(expr, dtype):
    code = print_torch(expr, NAMES)
    x = torch.tensor([-0.5, 0.0, 0.25, 2.0], dtype=dtype)
    result = eval(code, {"torch": torch, "x": x})  # noqa: S307
    assert result.dtype == dtype, code
    assert result.shape == x.shape
    want = torch.tensor([exact(expr, {X: v}) for v in x.double().tolist()], dtype=torch.float64)
    finite = torch.isfinite(want)
    tol = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 1e-6, torch.float64: 1e-14}[dtype]
    torch.testing.assert_close(result.double()[finite], want[finite], rtol=tol, atol=tol)


def test_removable_prints_a_guarded_series_and_closed_form():
    expr = stabilize(sympy.sin(X) / X)
    assert isinstance(expr, taylor.Removable)
    code = print_torch(expr, NAMES)
    assert code.count("torch.where") >= 2 and "torch.sin" in code
    # Both branches are evaluated at a guarded argument: the series' powers overflow far
    # from 0, and torch.where's backward would multiply its zero by them.
    eps = repr(type(expr).eps)
    assert f"torch.where(torch.abs(x) < {eps}, x, 0.0)" in code
    # The closed form's guard reuses the series' mask (no second comparison kernel).
    assert f"torch.where(torch.abs(x) < {eps}, {eps}, x)" in code
    assert ">=" not in code and "~" not in code
    for point in [0.0, 1e-30, 1e-5, 0.3, 0.49999, 0.5, 0.7, 30.0]:
        _, result, _, _ = run(expr, point)
        want = 1.0 if point == 0 else math.sin(point) / point
        assert result.item() == pytest.approx(want, rel=1e-15)


def test_number_arguments_become_tensors_where_torch_needs_them():
    code = print_torch(sf.hypot(X, 1), NAMES)
    assert code == "torch.hypot(x, x.new_full((), 1))"
    code = print_torch(sf.logaddexp(sympy.Float(0.5), X), NAMES)  # not 0: that is softplus
    assert code == "torch.logaddexp(x.new_full((), 0.5), x)"
    code = print_torch(sf.hypot(X / Y, 2), NAMES)  # an expression as the anchor
    assert code == "torch.hypot(x / y, (x / y).new_full((), 2))"


POWERS = [
    (sympy.Pow(X, Y), (1.7, 0.6)),
    (sympy.Pow(sympy.Pow(X, Y), 3), (1.7, 0.6)),
    (sympy.Pow(sympy.Pow(X, Y), Y), (1.7, 0.6)),  # not x**(y**y)
    (X ** (1 / Y), (1.7, 0.6)),  # not x**1/y
    (X ** (-Y), (1.7, 0.6)),
    (X ** (X / Y), (1.7, 0.6)),
    (-(X**3), (-1.3, 0.0)),
    ((-X) ** Y, (-1.3, 2.0)),
    (sympy.Rational(1, 2) ** X, (3.0, 0.0)),
    (2**X, (3.0, 0.0)),
    ((X + 1) ** sympy.Rational(1, 3), (0.4, 0.0)),
    (X ** sympy.Rational(-3, 2), (0.4, 0.0)),
    (1 / (X + Y), (0.4, 1.0)),
    (sympy.exp(X) ** Y, (0.4, 1.5)),
]


@pytest.mark.parametrize("expr,point", POWERS, ids=[str(e) for e, _ in POWERS])
def test_powers_keep_python_precedence(expr, point):
    check(expr, [point])


def test_atan2_with_a_number_argument():
    check(sympy.atan2(2, X), [-1.0, 0.5])
    check(sympy.atan2(X, -1), [-1.0, 0.5])


def test_nan_and_infinity_print_as_float_literals():
    _, result, _, _ = run(sympy.Piecewise((sympy.nan, X > 0), (X, True)), 1.0)
    assert math.isnan(result.item())
    _, result, _, _ = run(sympy.Piecewise((sympy.oo, X > 0), (-sympy.oo, True)), -1.0)
    assert result.item() == -math.inf


def test_boolean_conditions_with_rationals():
    expr = sympy.Piecewise(
        (X / 3, (X > sympy.Rational(1, 4)) & (X < 1)), (X, sympy.Not(X > 2) | (X < -1)), (2 * X, True)
    )
    check(expr, [0.5, 1.5, 3.0, -2.0])


def test_unknown_functions_fail_loudly():
    with pytest.raises(SymgradError, match="cannot print"):
        print_torch(sympy.Function("mystery")(X), NAMES)
    with pytest.raises(SymgradError, match="cannot print"):
        print_torch(sympy.besselj(0, X), NAMES)


def test_a_complex_constant_is_refused_not_printed():
    """StrPrinter would print I, a NameError in the generated module (a campaign find)."""
    with pytest.raises(SymgradError, match="complex value"):
        print_torch(X * sympy.I, NAMES)
    with pytest.raises(SymgradError, match="complex value"):
        print_torch(X * (-1) ** sympy.Rational(1, 3), NAMES)  # numbers_to_floats makes it complex


def test_heaviside_as_an_exponent_keeps_its_parentheses():
    # Found by the fuzz campaign: (2/3)**Heaviside(x) printed as 0.666 ** 0.5 * (...).
    expr = sympy.Rational(2, 3) ** sympy.Heaviside(X)
    code = print_torch(expr, NAMES)
    x = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)
    got = eval(code, {"torch": torch, "x": x})  # noqa: S307 (our own printed code)
    want = torch.tensor([1.0, (2 / 3) ** 0.5, 2 / 3], dtype=torch.float64)
    torch.testing.assert_close(got, want)


def test_piecewise_of_numbers_follows_the_reference_dtype():
    condition = sympy.Piecewise((2, X < 1), (sympy.Rational(1, 10), True))
    code = print_torch(condition, NAMES, reference="x")
    x = torch.tensor([0.0, 3.0], dtype=torch.float64)
    got = eval(code, {"torch": torch, "x": x})  # noqa: S307
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, torch.tensor([2.0, 0.1], dtype=torch.float64))


def test_functions_printed_as_expressions_are_parenthesised_operands():
    # Found by the fuzz campaign: 1/erfc(-y) printed as ... / 0.5 * torch.special.erfc(...).
    expr = X / sympy.erfc(-X)
    code = print_torch(stabilize(expr), NAMES)
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    got = eval(code, {"torch": torch, "x": x})  # noqa: S307 (our own printed code)
    want = x / torch.special.erfc(-x)
    torch.testing.assert_close(got, want)


def test_ndtr_argument_keeps_its_parentheses():
    # Found by the fuzz campaign: erfc(atan(x) - x) printed erfc(-0.707 * 1.414*x - ...).
    code = print_torch(stabilize(sympy.erfc(sympy.atan(X) - X) * X), NAMES)
    x = torch.tensor([-2.0, 0.5, 2.5], dtype=torch.float64)
    got = eval(code, {"torch": torch, "x": x})  # noqa: S307 (our own printed code)
    torch.testing.assert_close(got, torch.special.erfc(torch.atan(x) - x) * x)


def test_integers_beyond_int64_print_as_floats_or_are_refused():
    """torch takes no Python int beyond int64 (OverflowError); SymPy can fold one, e.g.
    log(10**200) from 200*log(10) (found by the fuzz campaign)."""
    x = sympy.Symbol("x", real=True)
    assert print_torch(x * sympy.Integer(2) ** 62, {x: "x"}) == "4611686018427387904 * x"
    assert print_torch(x * sympy.Integer(10) ** 200, {x: "x"}) == "1e+200 * x"
    with pytest.raises(SymgradError, match="beyond float64's range"):
        print_torch(x * sympy.Integer(10) ** 400, {x: "x"})


@pytest.mark.parametrize(
    "expr, argument",
    [
        (sympy.sin(X) / X, "even"),  # 1 - x**2/6 + ...: Horner in x**2
        ((X - sympy.sin(X)) / X**2, "odd"),  # x/6 - x**3/120 + ...: x times Horner in x**2
        ((sympy.exp(X) - 1) / X, "mixed"),  # 1 + x/2 + x**2/6 + ...: Horner in x
    ],
)
def test_taylor_series_print_as_horner_without_general_powers(expr, argument):
    """Each series term c*x**n printed as such ran torch's pow kernel once per term (sin(x)/x
    forward and backward took 2x as long); Horner's scheme needs only x**2 at most."""
    made = stabilize(expr)
    assert isinstance(made, taylor.Removable)
    series = type(made).series_at(X)
    polynomials = list(series.atoms(taylor.TaylorPolynomial))
    assert len(polynomials) == 1
    (polynomial,) = polynomials
    assert polynomial.args[0] == (X if argument == "mixed" else X**2)
    assert (series / polynomial == X) == (argument == "odd")
    code = print_torch(made, NAMES)
    assert not re.search(r"\*\* ?(?!2\b)\d", code), code
    for point in [0.0, -1e-30, 1e-5, -0.1, 0.124, 0.3, 0.49999, 30.0]:
        _, result, _, _ = run(made, point)
        # (evalf with subs raises the working precision until the cancellation is resolved)
        want = float(sympy.limit(expr, X, 0) if point == 0 else expr.evalf(30, subs={X: point}))
        assert result.item() == pytest.approx(want, rel=4e-16, abs=1e-300)


def _polynomial(coeffs, x="s"):
    variable = syntax.name(x) if x.isidentifier() else syntax.binop("a", "+", "b")
    return syntax.source(taylor._polynomial_code(coeffs, variable))


def test_polynomial_code_is_horners_scheme_and_skips_zero_coefficients():
    assert _polynomial((1.0, -0.5, 0.0, 0.25)) == "s * (s * (0.25 * s) - 0.5) + 1.0"
    text = _polynomial((1.0, -0.5, 0.0, 0.25))
    assert "**" not in text
    for s in (-3.0, -0.5, 0.0, 0.7, 2.0):
        assert eval(text, {"s": s}) == pytest.approx(1.0 - 0.5 * s + 0.25 * s**3, rel=1e-15)
    assert _polynomial((0.0, 0.0, 2.0)) == "s * (2.0 * s)"
    assert _polynomial((3.0,)) == "3.0"
    assert _polynomial((0.0, 0.0)) == "0.0 * s"
    assert _polynomial((-1.0, -2.0), "a + b") == "-2.0 * (a + b) - 1.0"
    # In place: one chain on the innermost product's buffer, no number-minus-tensor kernel.
    (line,), _ = reuse_buffers(("r = " + _polynomial((1.0, -0.5, 0.0, 0.25)),), "", frozenset({"s"}), frozenset(), frozenset())
    assert line == "r = (0.25 * s).mul_(s).sub_(0.5).mul_(s).add_(1.0)"


def test_a_last_branch_guard_selects_with_the_earlier_condition_itself():
    """guard(x, True, safe, earlier) is x where ``earlier`` does not hold: printed as
    where(earlier, safe, x), not where(~earlier, x, safe), it runs no negation kernel and
    takes a nan comparison (False) as not holding, as the branch's own where does."""
    expr = sf.guard(X, sympy.true, sympy.Integer(2), sympy.log(X) > 1)
    code = print_torch(expr, NAMES)
    assert code == "torch.where(torch.log(x) > 1, 2, x)"
    for point, want in [(-1.0, -1.0), (0.5, 0.5), (2.0, 2.0), (3.0, 2.0)]:
        _, result, _, _ = run(expr, point)
        assert result.item() == want


HELPER_CASES = [
    # (expression, compiled, promote): the helpers the printed code calls
    (sf.mish(sympy.Symbol("x", real=True)), False, False),
    (sf.log_ndtr(sympy.Symbol("x", real=True)), False, False),
    (sf.erfcx(sympy.Symbol("x", real=True)) + sf.silu(sympy.Symbol("x", real=True)), False, False),
    (sf.sigmoid(sympy.Symbol("x", real=True)), True, False),
    (sf.sigmoid(sympy.Symbol("x", real=True)), False, False),
    (sympy.Piecewise((2.5, sympy.Symbol("x", real=True) > 1), (1, True)), False, True),
    (sympy.Piecewise((2.5, sympy.Symbol("x", real=True) > 1), (1, True)), False, False),
    (sympy.exp(sympy.Symbol("x", real=True)) * sympy.Symbol("x", real=True), False, False),
]


@pytest.mark.parametrize("expr, compiled, promote", HELPER_CASES, ids=[str(c) for c in HELPER_CASES])
def test_helpers_used_are_the_helpers_printed(expr, compiled, promote):
    """printer.helpers_used reads from the SymPy tree exactly the HELPERS the printed code calls."""
    from symgrad.codegen.printer import helpers_used

    x = sympy.Symbol("x", real=True)
    code = print_torch(expr, {x: "x"}, "x", compiled=compiled, promote=promote)
    printed = {name for name in HELPERS if re.search(rf"\b{name}\(", code)}
    assert helpers_used(expr, "x", compiled=compiled, promote=promote) == printed


def _parsed_top_is_sum(code: str) -> bool:
    """The test's own reading of printed code (a test may parse it; the plan may not)."""
    import ast

    top = ast.parse(code, mode="eval").body
    return not isinstance(top, (ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Constant, ast.Attribute)) or (
        isinstance(top, ast.BinOp) and isinstance(top.op, (ast.Add, ast.Sub))
    )


@pytest.mark.parametrize(
    "expr",
    [
        X + 1,
        X - Y,
        -X - 1,
        sympy.Mul(-1, 1 + X, evaluate=False),  # evaluated before printing: -x - 1
        sympy.Mul(-2, 1 + X, evaluate=False),
        -X * (1 + Y),
        X * Y,
        -X,
        -1 / X**2,
        X**2,
        1 / X,
        sympy.sqrt(X),
        sympy.Rational(-1, 2),
        sympy.exp(X) + 1,
        sympy.Heaviside(X),
        sympy.Max(X, 1),
        sympy.Piecewise((X, X > 0), (0, True)),
        X < 1,
        sympy.oo * -1,
        sf.ndtr(X),
        stabilize(sympy.sin(X) / X),
        stabilize((X - sympy.sin(X)) / X**2),
        *(type(made).series_at(X) for made in (stabilize(sympy.sin(X) / X), stabilize((X - sympy.sin(X)) / X**2))),
        *(build(name) for name in sorted(set(FUNCTIONS) - set(ROW_FUNCTIONS))),
        *(expr for expr, _ in EXTRA.values()),
    ],
    ids=str,
)
def test_prints_as_sum_agrees_with_the_printed_code(expr):
    """The plan parenthesises a factor by :func:`prints_as_sum`, decided on the expression:
    it must say what the printed code is."""
    assert prints_as_sum(expr) == _parsed_top_is_sum(print_torch(expr, NAMES))


def _parsed_is_atom(code: str) -> bool:
    """The test's own reading: a name, a plain number, or one call of a dotted name."""
    import ast

    if code.replace("_", "a").replace(".", "a").isalnum():
        return True
    top = ast.parse(code, mode="eval").body
    func = top.func if isinstance(top, ast.Call) else None
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and not code.startswith("(")


@pytest.mark.parametrize(
    "expr",
    [
        *(build(name) for name in sorted(set(FUNCTIONS) - set(ROW_FUNCTIONS))),
        *(expr for expr, _ in EXTRA.values()),
        *(type(made).series_at(X) for made in (stabilize(sympy.sin(X) / X), stabilize((X - sympy.sin(X)) / X**2))),
        X, sympy.Float(0.5), sympy.Float(-0.5), sympy.Float(1e-5), sympy.Float(1e300), sympy.Integer(3),
        sympy.nan, sympy.oo, -sympy.oo, sympy.sqrt(X), X**2, 1 / X, X + 1, -X, X < 1,
    ],
    ids=str,
)
def test_the_printer_knows_which_code_is_an_operand_as_it_is(expr):
    """PRINTERS' entries parenthesise an argument as an operand by what the printer decided
    on the expression (Printed.operand): it must say what the printed code is."""
    printer = TorchPrinter(NAMES)
    assert printer._is_atom(expr) == _parsed_is_atom(syntax.source(printer.doprint(expr)))
