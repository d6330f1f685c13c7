"""The parser, data-driven: every accepted construct, and every rejected one with its message.

Each table row is one case (black's and CPython's test style): adding a construct means
adding a row, not a test function.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference
import sympy
from sympy.codegen.cfunctions import expm1, log1p

from symgrad import SymgradError
from symgrad.frontend.grammar import FUNCTIONS, ROW_FUNCTIONS
from symgrad.frontend.parse import MAX_DEPTH, MAX_LENGTH, MAX_NODES, MAX_OUTPUTS, parse_outputs, parse_spec
from symgrad.spec import Spec

x, y, z = sympy.symbols("x y z", real=True)
a = sympy.Symbol("a", real=True)
R = sympy.Rational

# text -> the SymPy expressions of its outputs (and reductions).
ACCEPTED = [
    ("x", [x]),
    ("42*x", [42 * x]),
    ("x/3", [x / 3]),
    ("2/3*x", [R(2, 3) * x]),
    ("1.5*x", [sympy.Float("1.5") * x]),
    ("1e-3*x", [sympy.Float("0.001") * x]),
    ("pi*x + E", [sympy.pi * x + sympy.E]),
    ("x + y - z", [x + y - z]),
    ("x*y/z", [x * y / z]),
    ("x**2", [x**2]),
    ("x**-1", [1 / x]),
    ("x**(1/2)", [sympy.sqrt(x)]),
    ("x**y", [x**y]),
    ("-x", [-x]),
    ("+x", [x]),
    ("--x", [x]),
    ("-(x + y)", [-x - y]),
    ("2**10*x", [1024 * x]),
    ("  x + 1  ", [x + 1]),
    ("x\t+ 1", [x + 1]),
    ("x + 1  # a comment", [x + 1]),
    ("sqrt(x)", [sympy.sqrt(x)]),
    ("exp(x)", [sympy.exp(x)]),
    ("log(x)", [sympy.log(x)]),
    ("log(x, 2)", [sympy.log(x) / sympy.log(2)]),
    ("log(x, y)", [sympy.log(x) / sympy.log(y)]),
    ("log1p(x)", [log1p(x)]),
    ("expm1(x)", [expm1(x)]),
    ("atan2(y, x)", [sympy.atan2(y, x)]),
    ("abs(x)", [sympy.Abs(x)]),
    ("Max(x)", [x]),
    ("Max(x, y)", [sympy.Max(x, y)]),
    ("Max(x, y, z, 0)", [sympy.Max(x, y, z, 0)]),
    ("Min(x, 1)", [sympy.Min(x, 1)]),
    ("Min(x, y, z)", [sympy.Min(x, y, z)]),
    ("Piecewise((x, x > 0), (0, True))", [sympy.Piecewise((x, x > 0), (0, True))]),
    ("Piecewise((x, 0 < x < 1), (0, True))", [sympy.Piecewise((x, (x > 0) & (x < 1)), (0, True))]),
    ("Piecewise((x, (x > 0) and (y > 0)), (0, True))", [sympy.Piecewise((x, (x > 0) & (y > 0)), (0, True))]),
    ("Piecewise((x, x > 0 or y > 0), (0, True))", [sympy.Piecewise((x, (x > 0) | (y > 0)), (0, True))]),
    ("Piecewise((x, not x > 0), (0, True))", [sympy.Piecewise((x, x <= 0), (0, True))]),
    ("Piecewise((x, x >= 0), (y, x <= -1), (z, True))", [sympy.Piecewise((x, x >= 0), (y, x <= -1), (z, True))]),
    ("Piecewise((x, x == 0), (y, x != 1), (0, True))", [sympy.Piecewise((x, sympy.Eq(x, 0)), (y, sympy.Ne(x, 1)), (0, True))]),
    ("Piecewise((x, True))", [x]),
    ("Piecewise((x, (x > 0) & (y > 0)), (0, True))", [sympy.Piecewise((x, (x > 0) & (y > 0)), (0, True))]),
    ("Piecewise((x, (x > 0) | (y > 0)), (0, True))", [sympy.Piecewise((x, (x > 0) | (y > 0)), (0, True))]),
    ("Piecewise((x, ~(x > 0)), (0, True))", [sympy.Piecewise((x, x <= 0), (0, True))]),
    ("Piecewise((x, (x > 0) & ~(y > 0) | (z < 1)), (0, True))", [sympy.Piecewise((x, ((x > 0) & (y <= 0)) | (z < 1)), (0, True))]),
    ("where(x > 0, x, 0.1*x)", [sympy.Piecewise((x, x > 0), (sympy.Float("0.1") * x, True))]),
    ("where((x > 0) & (y < 1), x, y)", [sympy.Piecewise((x, (x > 0) & (y < 1)), (y, True))]),
    ("where(x > 0 and not y > 0, 1, 0)", [sympy.Piecewise((1, (x > 0) & (y <= 0)), (0, True))]),
    ("relu(x)", [sympy.Max(x, 0)]),
    ("clamp(x, -1, 1)", [sympy.Min(sympy.Max(x, -1), 1)]),
    ("clamp(x, y, y + 1)", [sympy.Min(sympy.Max(x, y), y + 1)]),
    ("max(x, y, 0)", [sympy.Max(x, y, 0)]),
    ("min(x, y, z)", [sympy.Min(x, y, z)]),
    ("max**2 + round", [sympy.Symbol("max", real=True) ** 2 + sympy.Symbol("round", real=True)]),  # builtins name symbols
    ("x > 0", [sympy.Piecewise((1, x > 0), (0, True))]),
    ("(x < y)*x", [sympy.Piecewise((1, x < y), (0, True)) * x]),
    ("x*y, x + y", [x * y, x + y]),
    ("x, y, z", [x, y, z]),
    ("(x, y)", [x, y]),
    ("x,", [x]),
    ("ｓｉｎ(ｘ)", [sympy.sin(x)]),  # full-width: NFKC-normalised by Python's parser
    ("gamma(5)*x", [24 * x]),
    ("sum**2 + abs", [sympy.Symbol("sum", real=True) ** 2 + sympy.Symbol("abs", real=True)]),  # builtins name symbols
    ("loggamma(1000)*x", None),  # a large constant argument is evaluated numerically
    ("digamma(10**6)*x", None),
]
# Every plain function of the table, applied to x (or x, y): the whitelist is the table.
ACCEPTED += [
    (f"{name}({', '.join('xyz'[: min(entry.arity or (1,))])})", None)
    for name, entry in sorted(FUNCTIONS.items())
    if name not in ROW_FUNCTIONS and name not in ("Piecewise", "where")
]
# Row-wise functions (symgrad.math.reductions) take a literal dim.
ACCEPTED += [
    (f"{name}(x, -1)", None) for name in ROW_FUNCTIONS if name not in ("gather", "chunk")
] + [("gather(x, t)", None), ("chunk(x, 2, 1)", None), ("x - logsumexp(x, (-2, -1))", None), ("2*sum(sum(x, -1))", None), ("x/sum(x)", None)]

# (text, reduction per output)
REDUCED = [
    ("sum(x**2)", ["sum"]),
    ("sum(sum**2)", ["sum"]),
    ("mean(x)", ["mean"]),
    ("sum(x), mean(y), x*y", ["sum", "mean", None]),
]

# text -> a fragment of the error message. Every construct outside the whitelist.
REJECTED = [
    # syntax and statements
    ("x +", "invalid syntax at column 4: the expression ends too early"),
    ("x**", "ends too early"),
    ("1 +* 2", "invalid syntax at column 4"),
    ("x; import os", "invalid syntax at column 2: ';' starts a second statement"),
    ("x;", "invalid syntax at column 2"),
    ("import os", "'import' statements are not allowed"),
    ("def f(): pass", "'def' statements are not allowed"),
    ("x = 1", "invalid syntax at column 3: assignment is not allowed"),
    ("f(x) = 2", "column 6: assignment is not allowed"),
    ("sin(x", "'(' was never closed"),
    ("x\ny", "single line"),
    ("x\r+1", "single line"),
    ("x\x00", "invalid syntax at column 2: invalid character U+0000"),
    ("x\u200b+1", "non-printable character U+200B"),
    ("x²", "invalid character '²'"),
    ("", "empty"),
    ("   ", "empty"),
    ("()", "empty"),
    ("x" * (MAX_LENGTH + 1), f"the limit is {MAX_LENGTH}"),
    ("-" * (MAX_DEPTH + 5) + "x", "nested too deeply"),
    ("Max(" + ",".join(["x"] * MAX_NODES) + ")", f"more than {MAX_NODES} syntax nodes"),
    ("+".join(["x"] * (MAX_DEPTH + 5)), "nested too deeply"),  # a + chain nests in the syntax tree
    (", ".join(["x"] * (MAX_OUTPUTS + 1)), "too many outputs"),
    # attribute access, subscripts and other node kinds
    ("x.real", "attribute access (a.b) is not allowed"),
    ("x.__class__.__mro__", "attribute access"),
    ("__import__('os').system('ls')", "only calls of supported functions by name"),
    ("x[0]", "subscripts (a[i]) are not allowed"),
    ("x[1:2]", "subscripts"),
    ("(lambda: x)()", "only calls of supported functions by name"),
    ("lambda: x", "lambda is not allowed"),
    ("[x for x in y]", "comprehensions are not allowed"),
    ("{x for x in y}", "comprehensions are not allowed"),
    ("{x: 1 for x in y}", "comprehensions are not allowed"),
    ("sum(x for x in y)", "comprehensions are not allowed"),
    ("(y := x)", "assignment expressions (:=) are not allowed"),
    ("f'{x}'", "f-strings are not allowed"),
    ("x if y else z", "use Piecewise"),
    ("[x, y]", "lists are not allowed"),
    ("{x: y}", "dicts are not allowed"),
    ("{x, y}", "sets are not allowed"),
    ("Max(*x)", "starred arguments are not allowed"),
    ("exp(x, base=2)", "keyword arguments are not allowed"),
    ("await x", "await is not allowed"),
    # operators
    ("x @ y", "the @ operator"),
    ("x % 2", "the % operator"),
    ("x // 2", "use floor(a/b)"),
    ("x ^ 2", "write powers as **"),
    ("x & y", "the & operator"),
    ("x | y", "the | operator"),
    ("x << 1", "shifts"),
    ("x >> 1", "shifts"),
    ("~x", "the ~ operator"),
    ("x > 0 & x < 1", "& and | bind tighter than comparisons, so x > 0 & x < 1 compares the result of & or |"),
    ("x > 0 & x < 1", "put each comparison in parentheses: (x > 0) & (x < 1)"),
    ("Piecewise((x, x > 0 | y > 0), (0, True))", "put each comparison in parentheses: (x > 0) | (y > 0)"),
    ("Piecewise((x, (x > 0) & x < 1), (0, True))", "put each comparison in parentheses: (x > 0) & (x < 1)"),
    ("where(x < -1 | x > 1 & y < 2, x, y)", "put each comparison in parentheses: (x < -1) | (x > 1) & (y < 2)"),
    ("Piecewise((x, (x > 0) & y), (0, True))", "a Piecewise condition must be a comparison"),
    ("where(x, 1, 0)", "a Piecewise condition must be a comparison"),
    ("where(x > 0, 1)", "where() takes 3 arguments, got 2"),
    ("clamp(x, 0)", "clamp() takes 3 arguments, got 2"),
    ("relu", "'relu' is a function: call it"),
    ("not x", "'not' is only allowed inside a Piecewise condition"),
    ("x and y", "'and'/'or' are only allowed inside a Piecewise condition"),
    ("x or y", "'and'/'or' are only allowed"),
    ("x is y", "only <, <=, >, >=, == and != comparisons"),
    ("x in y", "only <, <=, >, >=, == and != comparisons"),
    # literals
    ("True", "only allowed as a Piecewise condition"),
    ("None", "only allowed as a Piecewise condition"),
    ("'x'", "str literals are not allowed"),
    ("b'x'", "bytes literals are not allowed"),
    ("...", "ellipsis literals are not allowed"),
    ("1j*x", "complex numbers are not supported"),
    ("x + 2.5j", "complex numbers are not supported"),
    ("1" * 31 + "*x", "integer literal too large"),
    ("1e400*x", "not finite"),
    ("1e-320*x", "too small"),
    # names
    ("I*x", "imaginary unit I is not supported"),
    ("oo*x", "infinity (oo) is not supported"),
    ("zoo + x", "complex infinity (zoo)"),
    ("nan*x", "nan is not supported"),
    ("inf*x", "inf is not supported"),
    ("__builtins__", "names starting with '__'"),
    ("__import__('os')", "names starting with '__'"),
    ("x + __class__", "names starting with '__'"),
    ("sin + x", "'sin' is a function: call it"),
    # functions
    ("sinn(x)", "did you mean sin or sinh"),
    ("exq(x)", "did you mean exp"),
    ("foo(x)", "unknown function 'foo'"),
    ("eval('1')", "unknown function 'eval'"),
    ("exec('1')", "unknown function 'exec'"),
    ("getattr(x, 'y')", "unknown function 'getattr'"),
    ("sympify('x')", "unknown function 'sympify'"),
    ("open('/etc/passwd')", "unknown function 'open'"),
    ("print(x)", "unknown function 'print'"),
    ("Integral(x, x)", "unevaluated integrals are not supported"),
    ("Derivative(x, x)", "unevaluated derivatives are not supported"),
    ("factorial(x)", "use gamma(n + 1)"),
    ("sin()", "sin() takes 1 argument, got 0"),
    ("sin(x, y)", "sin() takes 1 argument, got 2"),
    ("atan2(x)", "atan2() takes 2 arguments, got 1"),
    ("log(x, y, z)", "log() takes 1 or 2 arguments, got 3"),
    ("Max()", "Max() takes one or more arguments, got 0"),
    ("log(x, 1)", "the base of log(x, b) must be positive and not 1"),
    ("log(x, -2)", "the base of log(x, b) must be positive"),
    # Piecewise
    ("Piecewise((x, x > 0))", "needs a final (value, True) branch"),
    ("Piecewise((x, x > 0), (0, x <= 0))", "needs a final (value, True) branch"),
    ("Piecewise(x, True)", "each Piecewise argument must be a pair"),
    ("Piecewise((x, x > 0, 1), (0, True))", "each Piecewise argument must be a pair"),
    ("Piecewise((x, x + 1), (0, True))", "a Piecewise condition must be a comparison"),
    ("(x, y) + 1", "a tuple is only allowed at the top level"),
    ("sin((x, y))", "a tuple is only allowed"),
    # reductions
    ("sum(x, y)", "the dim of sum() must be an int or a tuple of ints"),
    ("sum(x, 1, 2)", "sum() takes 1 or 2 arguments, got 3"),
    ("softmax(x)", "softmax() takes 2 arguments, got 1"),
    ("sum(3, -1)", "of a constant has no shape"),
    # constants: infinite, undefined, complex, too large or too small
    ("1/0 + x", "division by zero"),
    ("x/0", "division by zero"),
    ("x/(1 - 1)", "division by zero"),
    ("0**-1 + x", "0 to a negative power"),
    ("log(0) + x", "the constant log(0) is infinite or undefined"),
    ("tan(pi/2)*x", "infinite or undefined"),
    ("atan2(0, 0) + x", "infinite or undefined"),
    ("sqrt(-1)*x", "the constant sqrt(-1) is complex"),
    ("(-1)**(1/2)*x", "is complex"),
    ("log(-1)*x", "is complex"),
    ("asin(2)*x", "is complex"),
    # a tiny imaginary part that is the value's own, not rounding noise (campaign 31)
    ("x + (-(1e-3))**(pi + 2.5)", "the constant (-(1e-3))**(pi + 2.5) is complex"),
    ("acosh(1/2) + x", "is complex"),
    ("(-2)**x", "a negative constant to a variable power"),
    ("2**10**10", "the constant 2**10**10 is too large"),
    ("9**9**9*x", "too large"),
    ("10**10**10*x", "too large"),
    ("x**(10**100)", "the exponent in x**(10**100) is too large"),
    ("x**1e10", "exponent in x**1e10 is too large"),
    ("x**-1001", "exponent"),
    ("pi**1000*x", "too large"),
    ("exp(10**20)*x", "the constant exp(10**20) is too large"),
    ("exp(-10**20)*x", "too small"),
    ("gamma(10**9)*x", "the constant gamma(10**9) is too large"),
    ("gamma(-200)*x", "infinite or undefined"),
    ("loggamma(-200.5) + x", "complex"),
    ("z <= log((x < y) <= x, 2)", "cannot build"),  # SymPy meets log(0) folding the Piecewise
    # gamma(gamma(0)) on the x >= 3 branch: SymPy folding (1 >= gamma(zoo)) & (x >= 3) into
    # the Piecewise ran for minutes (fuzz campaign 34, with --fuse and without)
    ("1 >= gamma(gamma(x < 3))", "a condition compares an undefined value (1 >= gamma(zoo))"),
    # 9 indicators in one comparison are 2**9 branch combinations
    ("Piecewise((x, " + " + ".join(f"(x > {k})" for k in range(9)) + " > 4), (0, True))", "more than 256 branch"),
    # outputs
    ("x > 0 and y", "only allowed inside a Piecewise condition"),
]

# (spec keyword arguments) -> a fragment of the message: inputs and params resolution.
RESOLUTION = [
    (dict(expr="x*y", inputs=("x",)), "symbol 'y' is neither an input nor a param"),
    (dict(expr="x*y", inputs=("x", "q")), "--inputs names 'q', which the expression does not use"),
    (dict(expr="x*y", params=("q",)), "--params names 'q', which the expression does not use"),
    (dict(expr="x*y", inputs=("x", "y"), params=("y",)), "'y' is listed in both --inputs and --params"),
    (dict(expr="a*2", params=("a",)), "no differentiable input"),
    (dict(expr="3"), "no differentiable input"),
    (dict(expr="x, a", params=("a",)), "output 2 does not depend on any input"),
    (dict(expr="x*y - x*y + y, x - x", inputs=("x", "y")), "output 2 does not depend on any input"),
    (dict(expr="x - x + 1"), "no differentiable input"),
    # (a domain given twice was taken silently, the last one winning: a user hunt)
    (dict(expr="x**2", domain=(("x", 0.0, 1.0), ("x", 2.0, 3.0))), "--domain x=... is given twice"),
    (dict(expr="x", params=("lam",), grads=(("x", "-mu"),)), "--params names 'lam', which the expression does not use"),
    # (a param, not an input: an input only a surrogate reads would have a gradient of 0)
    (dict(expr="x", inputs=("x", "mu"), params=("lam",), grads=(("x", "-lam*mu"),)), "--inputs names 'mu'"),
]


@pytest.mark.parametrize("text, expected", ACCEPTED, ids=[t[:40] for t, _ in ACCEPTED])
def test_accepted(text, expected):
    outputs = parse_outputs(text)
    if expected is not None:
        assert [sympy.simplify(o.expr - e) for o, e in zip(outputs, expected)] == [0] * len(expected)
        assert len(outputs) == len(expected)
    for out in outputs:
        assert out.reduction is None
        assert all(s.is_real for s in out.expr.free_symbols)


@pytest.mark.parametrize("text, reductions", REDUCED)
def test_reductions(text, reductions):
    assert [o.reduction for o in parse_outputs(text)] == reductions


@pytest.mark.parametrize("text, fragment", REJECTED, ids=[t[:40] for t, _ in REJECTED])
def test_rejected(text, fragment):
    with pytest.raises(SymgradError) as info:
        parse_outputs(text)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize("kwargs, fragment", RESOLUTION, ids=[k["expr"] for k, _ in RESOLUTION])
def test_inputs_and_params_resolution(kwargs, fragment):
    with pytest.raises(SymgradError, match=None) as info:
        parse_spec(Spec(name="F", **kwargs))
    assert fragment in str(info.value)


def test_a_param_may_appear_in_a_surrogate_gradient_alone(tmp_path):
    """--grad "x=-lam" with the output x: the scaled gradient reversal of domain-adversarial
    training (refused as a param "the expression does not use" before: a user hunt)."""
    parsed = parse_spec(Spec(expr="x", name="F", params=("lam",), grads=(("x", "-lam"),)))
    assert [s.name for s in parsed.inputs] == ["x"] and [s.name for s in parsed.params] == ["lam"]
    assert parsed.surrogates == ((parsed.inputs[0], -parsed.params[0]),)
    import torch
    from test_fuzz import import_source

    from symgrad import generate_source

    module = import_source(generate_source("x", "ScaledReverse", params=["lam"], grads={"x": "-lam"}), tmp_path)
    for lam in (0.3, torch.tensor(2.0)):
        x = torch.tensor([0.5, -1.0], requires_grad=True)
        (grad,) = torch.autograd.grad(module.scaled_reverse(x, lam), x, torch.tensor([1.0, 3.0]))
        torch.testing.assert_close(grad, -torch.as_tensor(lam) * torch.tensor([1.0, 3.0]))


def test_a_surrogate_param_broadcasting_beyond_the_output_reduces_in_both_modes(tmp_path):
    """A param only --grad reads, of more dimensions than the output: jvp raised torch's
    "expand" error, where backward sums the surrogate over the extra dimensions (a user-level
    hunt). Now forward mode reduces the same way, so jacfwd equals jacrev."""
    import torch
    from test_fuzz import import_source

    from symgrad import generate_source

    source = generate_source("floor(x)", "Bumped", params=["lam"], grads={"x": "lam*exp(-lam*x**2)"})
    bumped = import_source(source, tmp_path).bumped
    x = torch.tensor([0.5, 1.0], dtype=torch.float64)
    lam = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    summed = (lam * torch.exp(-lam * x**2)).sum(0)
    torch.testing.assert_close(torch.func.jacrev(bumped)(x, lam), torch.diag(summed))
    torch.testing.assert_close(torch.func.jacfwd(bumped)(x, lam), torch.diag(summed))
    # With a second input, only the surrogate's own term is summed (review: summed after the
    # terms were added, y's tangent was counted once per row of lam)
    source = generate_source("floor(x)*y", "Scaled", inputs=["x", "y"], params=["lam"], grads={"x": "lam*y"})
    scaled = import_source(source, tmp_path).scaled
    y = torch.tensor([2.0, 3.0], dtype=torch.float64)
    for argnums, want in ((0, torch.diag(lam.sum() * y)), (1, torch.diag(torch.floor(x)))):
        torch.testing.assert_close(torch.func.jacrev(scaled, argnums)(x, y, lam), want)
        torch.testing.assert_close(torch.func.jacfwd(scaled, argnums)(x, y, lam), want)


def test_inputs_default_to_sorted_free_symbols_minus_params():
    parsed = parse_spec(Spec(expr="z*a + y*x", name="F", params=("a",)))
    assert [s.name for s in parsed.inputs] == ["x", "y", "z"]
    assert [s.name for s in parsed.params] == ["a"]
    parsed = parse_spec(Spec(expr="z*a + y*x", name="F", inputs=("z", "x", "y"), params=("a",)))
    assert [s.name for s in parsed.inputs] == ["z", "x", "y"]


def test_symbols_are_real():
    """SymPy's default complex symbols would leave re/im residue in d/dx Abs(x)."""
    (out,) = parse_outputs("Abs(x)")
    assert sympy.diff(out.expr, x) == sympy.sign(x)
    (out,) = parse_outputs("Abs(x*y)")
    assert not sympy.diff(out.expr, x).has(sympy.re, sympy.im)


def test_same_name_is_one_symbol():
    (out,) = parse_outputs("x*x")
    assert out.expr == x**2


# (text, column, caret line): columns count characters, the caret sits by display width.
# Syntax errors carry a caret block; every other error is one line with its column.
SYNTAX_COLUMNS = [
    ("x + @", 5, "        ^"),
    ("x; y", 2, "     ^"),
    ("x +", 4, "       ^"),  # after the end: the missing operand
    ("  x +* 2", 6, "         ^"),  # leading blanks count
    ("é + ü +* 2", 8, "           ^"),  # 2-byte letters: columns are characters, not bytes
    ("ｘ＋１", 2, "      ^"),  # full-width: each takes two terminal columns
    ("ｘ + y +* 1", 8, "            ^"),
    ("x\u200b+1", 2, "     ^"),  # zero width: the caret does not move for it
    ("x\x00", 2, "     ^"),
    ("x\ny", 2, "     ^"),
]
COLUMNS = [
    ("x + y[0]", 5),
    ("  x + y[0]", 7),
    ("é + ü[0]", 5),
    ("β*γ + foo(x)", 7),
    ("ｘ + y[0]", 5),
    ("Max(x, sinn(y))", 8),
    ("x + sqrt(-1)", 5),
]


@pytest.mark.parametrize("text, column, caret", SYNTAX_COLUMNS, ids=[ascii(t) for t, _, _ in SYNTAX_COLUMNS])
def test_syntax_error_column_and_caret(text, column, caret):
    with pytest.raises(SymgradError) as info:
        parse_outputs(text)
    assert str(info.value).startswith(f"invalid syntax at column {column}:")
    shown, pointer = info.value.caret.split("\n")
    assert shown.startswith("    ") and shown[4:] in text.rstrip().replace("\x00", " ")
    assert pointer == caret


@pytest.mark.parametrize("text, column", COLUMNS)
def test_error_column(text, column):
    with pytest.raises(SymgradError) as info:
        parse_outputs(text)
    assert str(info.value).endswith(f"(at column {column})")
    assert info.value.caret is None


def test_long_expression_caret_is_windowed():
    text = "Max(" + "x, " * 100 + "y +* 1)"
    with pytest.raises(SymgradError) as info:
        parse_outputs(text)
    shown, pointer = info.value.caret.split("\n")
    assert len(shown) <= 130
    assert shown[len(pointer) - 1] == "*"


# A condition that compares Piecewise values (an indicator is one) is expanded into and/or
# of the branches (parse._without_piecewise): SymPy's own fold of it could run for minutes.
PIECEWISE_IN_CONDITION = [
    "Piecewise((x, Piecewise((x, x > 0), (-x, True)) > 1), (0, True))",
    "(x > 0) > (y < 1)",
    "((x > y) + (y > 1/2)) >= 1",
    "Piecewise((y, Max(x > 0, y) < Piecewise((x, y > x), (2*y, True))), (x*y, True))",
    "Piecewise((x, Piecewise((Piecewise((x, y > 0), (y, True)), x > 0), (-x, True)) > 1/2), (0, True))",
    "Piecewise((x, (Piecewise((x, x > 1), (y, True)) < 2) and not (Piecewise((1, y > 0), (x, True)) >= x)), (y, True))",
]


@pytest.mark.parametrize("text", PIECEWISE_IN_CONDITION)
def test_piecewise_in_a_condition_keeps_its_meaning(text):
    grid = np.array([-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0])
    x_values, y_values = np.meshgrid(grid, grid)
    [parsed] = parse_outputs(text)
    assert not any(c.has(sympy.Piecewise) for p in parsed.expr.atoms(sympy.Piecewise) for _, c in p.args)
    ordered = sorted(parsed.expr.free_symbols, key=lambda s: s.name)
    values = {"x": x_values, "y": y_values}
    got = sympy.lambdify(ordered, parsed.expr, modules="numpy")(*(values[s.name] for s in ordered))
    [expected] = reference.evaluate(text, {name: values[name] for name in ("x", "y") if name in text})
    np.testing.assert_array_equal(np.broadcast_to(got, expected.shape), expected)
