"""Right across the float range: values, gradients and second derivatives far from the
sampling domain (docs/stability.md, "Across the float range").

Every module in generated/ (default tier) and every stability case (``slow``; the issue-45
cases also in the default tier) is evaluated at log-spaced magnitudes of both signs, from
the subnormals up to the dtype's overflow, in float32 and float64, and compared with the
exact mathematics: wherever the true value, gradient or second derivative is a finite float
of the dtype, the generated one is within RANGE_RTOL of it relatively, or within the
dtype's smallest normal number absolutely (a result in the subnormal range, or flushed to
0, is not an error). EXCEPTIONS lists, with the reason, the few points where no
implementation can meet that.

The truths are mpmath's, from the expression as its spec or case writes it (parsed by
tests/reference.py, which shares no code with symgrad) and its symbolic derivatives, at a
precision raised until two evaluations agree; they are stored in tests/data/range_truths.json
by ``python tests/regen_range_truths.py`` (tests/truths.py's format), and a stale store is a
loud error, never a silent recomputation.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import mpmath
import pytest
import sympy
import torch

from reference import _MEAN, _SUM, parse_reference
from symgrad.plan.docs import metadata_of
from truths import StaleTruths, TruthStore, from_text, point_key

ROOT = Path(__file__).resolve().parent.parent
RANGE_STORE_PATH = Path(__file__).resolve().parent / "data" / "range_truths.json"
REGENERATE_RANGE = "python tests/regen_range_truths.py"

RANGE_RTOL = {torch.float32: 1e-4, torch.float64: 1e-9}
# Significant digits stored: 1e-17 relative, far inside the tightest tolerance, 1e-9.
RANGE_DIGITS = 17

# Magnitudes, both signs and 0: log-spaced from float64's subnormals to its overflow, with the
# places where exponentials overflow (float32 from 88.7, float64 from 709.8) and powers do.
# Each is rounded to float32 where float32 holds it as a nonzero finite number, so that one
# point serves both dtypes (exact in float64 too); the rest are float64's alone.
MAGNITUDES = (
    1e-300, 1e-200, 1e-100, 1e-40, 1e-30, 1e-20, 1e-12, 1e-6, 1e-3, 0.1, 0.5, 1.0, 2.0, 5.0,
    10.0, 20.0, 50.0, 90.0, 200.0, 400.0, 720.0, 1e3, 3e3, 1e4, 1e5, 1e6, 1e8, 1e10, 1e15,
    1e20, 1e30, 1e38, 1e60, 1e100, 1e200, 1e300,
)  # fmt: skip
# For two inputs, every pair of these (and 0), signed.
PAIR_MAGNITUDES = (1e-20, 0.5, 3.0, 30.0, 1e3, 1e10, 1e30)

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _as_float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _rounded(magnitude: float) -> float:
    as32 = _as_float32(magnitude) if magnitude <= _FLOAT32_MAX else math.inf
    return as32 if as32 != 0 and math.isfinite(as32) else magnitude


def range_points(inputs: int) -> list[tuple[float, ...]]:
    """The points of a target with ``inputs`` inputs (at most two; more: none)."""
    if inputs == 1:
        values = sorted({0.0} | {s * _rounded(m) for m in MAGNITUDES for s in (1, -1)})
        return [(v,) for v in values]
    if inputs == 2:
        values = sorted({0.0} | {s * _as_float32(m) for m in PAIR_MAGNITUDES for s in (1, -1)})
        return list(itertools.product(values, repeat=2))
    return []


# -- targets ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What the range test checks: a module's formula and which derivatives are the formula's.

    ``key`` names it in the store (``generated/NAME`` or ``stability/CASE``); ``expr`` and
    ``inputs`` are the spec's; ``params`` their values (substituted); ``derivatives`` whether
    each output's derivatives are the formula's (not a surrogate's, not a nondifferentiable
    output's)."""

    key: str
    expr: str
    inputs: tuple[str, ...]
    params: tuple[tuple[str, float], ...] = ()
    derivatives: tuple[bool, ...] = ()

    @property
    def record(self) -> str:
        """What the store keeps to see that a target changed: the formula and its params."""
        params = ", ".join(f"{name}={value!r}" for name, value in self.params)
        return self.expr + (f" [{params}]" if params else "")

    def outputs(self) -> list[sympy.Expr]:
        """Each output as a SymPy expression of the inputs (a reduction of a point: itself)."""
        names = list(self.inputs) + [name for name, _ in self.params]
        exprs = parse_reference(self.expr, names)
        values = {sympy.Symbol(name, real=True): sympy.Float(value, 30) for name, value in self.params}
        u = sympy.Dummy("u", real=True)
        definitions = {
            sympy.Function("sigmoid"): sympy.Lambda(u, 1 / (1 + sympy.exp(-u))),
            sympy.Function("softplus"): sympy.Lambda(u, sympy.log(1 + sympy.exp(u))),
        }
        outputs = []
        for e in exprs:
            e = e.args[0] if isinstance(e, (_SUM, _MEAN)) else e
            for function, definition in definitions.items():
                e = e.replace(function, definition)
            outputs.append(e.subs(values))
        return outputs


def generated_target(name: str) -> Target:
    meta = metadata_of(importlib.import_module(f"generated.{name}"))
    outputs = len(meta["outputs"])
    derivatives = tuple(k not in meta["nondifferentiable"] and not meta["surrogate"] for k in range(outputs))
    return Target(f"generated/{name}", meta["expr"], tuple(meta["inputs"]), tuple(meta["params"].items()), derivatives)


def generated_targets() -> list[Target]:
    # (the elementwise ones: tests/test_range_rowwise.py probes the row-wise ones)
    from conftest import generated_names

    return [generated_target(name) for name in generated_names()]


def stability_targets() -> list[Target]:
    from test_stability import CASES

    return [Target(f"stability/{case.name}", case.expr, tuple(case.inputs), (), (True,)) for case in CASES]


# The stability cases checked in the default tier too (the rest: slow): those of issue 45.
DEFAULT_STABILITY = ("exp_times_cosh", "log_one_plus_fourth_power")


def all_targets() -> list[Target]:
    return [t for t in generated_targets() + stability_targets() if range_points(len(t.inputs))]


# -- exact values ----------------------------------------------------------------------

# Beyond this size an exponent is far outside any float format, and mpmath's cost grows
# with it (exp(exp(1e3))): the point is left out for that target.
_MAX_EXPONENT = mpmath.mpf(1e40)
# Digits: at least 40 plus 3 per decade of the point's largest or smallest coordinate
# ((exp(x) - 1)/x's gradient cancels its terms to x**2 at x = 1e-300: 600 digits), then
# twice and four times that.
_BASE_DIGITS = 40
_DIGITS_PER_DECADE = 3
_AGREEMENT = mpmath.mpf(10) ** -20


# (tanh(exp(1e10)) ran out of memory in mpmath: tanh's own exponential of an exponent that large)
_GUARDED = ("exp", "expm1", "sinh", "cosh", "tanh", "sin", "cos", "tan", "erf", "erfc")


def _guarded(function):
    def guarded(x):
        if abs(x) > _MAX_EXPONENT:
            raise OverflowError("exponent beyond any float format")
        return function(x)

    return guarded


def _quantities(target: Target) -> tuple[list[sympy.Symbol], list[sympy.Expr]]:
    """(symbols, [each output's value, its gradient by each input, its second derivatives
    by each pair i <= j of inputs]) for the outputs whose derivatives are the formula's
    (others: the value alone)."""
    symbols = [sympy.Symbol(name, real=True) for name in target.inputs]
    exprs: list[sympy.Expr] = []
    for expr, differentiable in zip(target.outputs(), target.derivatives or itertools.repeat(True)):
        exprs.append(expr)
        if not differentiable:
            continue
        gradients = [sympy.diff(expr, s) for s in symbols]
        exprs += gradients
        exprs += [sympy.diff(gradients[i], symbols[j]) for i in range(len(symbols)) for j in range(i, len(symbols))]
    # (Dirac deltas of steps are 0 almost everywhere, as autograd has them)
    exprs = [e.replace(lambda n: isinstance(n, sympy.DiracDelta), lambda n: sympy.Integer(0)) for e in exprs]
    return symbols, exprs


@functools.cache
def _evaluator(target: Target):
    symbols, exprs = _quantities(target)
    guarded = {name: _guarded(getattr(mpmath, name)) for name in _GUARDED}
    return sympy.lambdify(symbols, exprs, modules=[guarded, "mpmath"])


def _real(value):
    """An mpf, or None where the value is not a real finite number."""
    value = mpmath.mpf(value) if isinstance(value, (int, float)) else value
    if isinstance(value, mpmath.mpc):
        if value.imag != 0:
            return None
        value = value.real
    if not isinstance(value, mpmath.mpf) or not mpmath.isfinite(value):
        return None
    return value


def exact_quantities(target: Target, point: Sequence[float]) -> tuple[int, list]:
    """(digits, [each quantity at ``point``, exact; None where it is not a finite real or
    never settles]): each quantity is taken at the first precision that agrees with the one
    before (cancellation needs more digits: log(1 + exp(-400)) 174). An empty list where the
    formula cannot be evaluated there at all (an exponent beyond _MAX_EXPONENT)."""
    evaluate = _evaluator(target)
    decades = max((abs(math.log10(abs(p))) for p in point if p != 0), default=0)
    base = _BASE_DIGITS + int(_DIGITS_PER_DECADE * decades)
    # (and 16 times, for a quantity still 0 there: log(erf(20)) is 0 to 172 digits, and -5e-176)
    precisions = (base, 2 * base, 4 * base, 16 * base)
    previous: list | None = None
    settled: dict[int, object] = {}
    for dps in precisions:
        with mpmath.workdps(dps):
            try:
                values = [_real(v) for v in evaluate(*(mpmath.mpf(p) for p in point))]
            except (ArithmeticError, ValueError, TypeError, AttributeError, MemoryError, mpmath.libmp.NoConvergence):
                return dps, []
        if previous is not None:
            for index, (a, b) in enumerate(zip(previous, values)):
                if index not in settled and (a is None) == (b is None):
                    # (A 0 only at the last precision: log(erf(20)) rounds to 0 up to 172
                    # digits, and is -5e-176.)
                    if a is None or abs(a - b) <= _AGREEMENT * abs(b) and (b != 0 or dps == precisions[-1]):
                        settled[index] = b
        if len(settled) == len(values):
            break
        previous = values
    values = [settled.get(index) for index in range(len(values))]
    return dps, _without_derivatives_off_the_domain(target, values)


def _without_derivatives_off_the_domain(target: Target, values: list) -> list:
    """``values`` with each output's derivatives None where its value is: a complex value's
    derivative may be real by accident ((sqrt(1 + x) - 1)/x's at x = -2 is 1/4)."""
    per_output = [1 + len(target.inputs) + len(target.inputs) * (len(target.inputs) + 1) // 2 if d else 1
                  for d in (target.derivatives or (True,) * len(values))]
    out, start = [], 0
    for size in per_output:
        group = values[start : start + size]
        out += [None] * len(group) if group and group[0] is None else group
        start += size
    return out


# -- the store -------------------------------------------------------------------------


@functools.cache
def range_store() -> TruthStore:
    return TruthStore.load(RANGE_STORE_PATH)


def stored_truths(target: Target) -> dict[str, list]:
    """{point key: [quantity or None]} of ``target``; StaleTruths where the store lacks it."""
    entry = range_store().cases.get(target.key)
    if entry is None or entry["expr"] != target.record:
        raise StaleTruths(f"no current range truths for {target.key}: run `{REGENERATE_RANGE}`")
    return {key: [None if text is None else from_text(text) for text in row[1:]] for key, row in entry["points"].items()}


# -- the check -------------------------------------------------------------------------

def _exp_overflows(u: float, dtype) -> bool:
    return u > math.log(torch.finfo(dtype).max)


# Points where no implementation in the dtype can meet the bound: the problem itself is
# ill-conditioned there. By target key: (where, as a predicate of the point and dtype; the
# reason). Short and explicit; docs/stability.md ("Across the float range") lists them too.
EXCEPTIONS: dict[str, tuple] = {
    **dict.fromkeys(
        ("generated/blend", "generated/blend_speed"),
        (
            lambda p, dtype: p[1] == 0 and _exp_overflows(-p[0], dtype),
            "log(1 + y**2)*exp(-x) at y = 0 where exp(-x) overflows: 0 at y = 0 exactly, inf at"
            " the next float, and so are the derivatives' terms (condition number infinite)",
        ),
    ),
    "generated/pair_speed": (
        lambda p, dtype: p[0] == 0 and _exp_overflows(-p[1], dtype),
        "x*exp(-y) at x = 0 where exp(-y) overflows: 0 at x = 0 exactly, inf at the next float",
    ),
    **dict.fromkeys(
        ("stability/bce_logits", "stability/bce_logits_max"),
        (
            lambda p, dtype: p[1] == 0.5 and abs(p[0]) < 1e-6,
            "the gradient sigmoid(x) - t at t = 1/2 and |x| < 1e-6: a difference of an input and"
            " a value equal to it to |x|/4, condition number in t above 1e6",
        ),
    ),
}


def _excepted(target: Target, point: tuple[float, ...], dtype) -> bool:
    rule = EXCEPTIONS.get(target.key)
    return rule is not None and bool(rule[0](point, dtype))


# Targets that fail the range check today for a reason in symgrad, or in the torch kernels it
# calls, that no rule here fixes yet: xfail, strict, so that a fix shows (XPASS fails) and
# the entry is removed. Each says where and why (docs/stability.md, "What is still open").
KNOWN_DEFECTS: dict[str, str] = {
    **dict.fromkeys(
        ("generated/blend", "generated/blend_speed"),
        "float32, |y| from 1.8e19: y**2 overflows in log1p(y**2) and 2*y/(1 + y**2); squares are"
        " left unguarded (rewrite.roots._GUARDED_POWER), as guarding them took Blend from 1.2x to"
        " 4.3x eager autograd's time",
    ),
    **dict.fromkeys(
        ("stability/inverse_square_minus_one", "stability/barron_negative_alpha"),
        "float32, |x| from 1.8e19: x**2 overflows in the ratio (squares are left unguarded,"
        " rewrite.roots._GUARDED_POWER)",
    ),
    "generated/si_lu": "float32, |x| in [88.7, 104]: torch.sigmoid (and F.silu) is 0 where it is"
    " subnormal, so x*sigmoid(x), a normal float down to x = -104, is 0",
    "generated/mish": "float32: F.mish's gradient and second derivative 0 at x = -90 (sigmoid"
    " underflow, as si_lu); second derivative nan at x = 1e38",
    "generated/mish_fused": "as generated/mish, and its fused forward 0 at x = -90",
    "generated/gelu_speed": "float32, |x| = 1e20: autograd's second derivative of x*exp(-x**2/2)"
    " is inf*0 = nan where x**2 overflows (the probe cannot evaluate exp(-5e39))",
    "generated/gelu_fused_speed": "as generated/gelu_speed",
    # The stability cases (slow tier), as the range sweep found them:
    **dict.fromkeys(
        ("stability/silu", "stability/mish", "stability/x_over_one_minus_exp", "stability/bernoulli"),
        "float32, |x| about 90: torch.sigmoid or exp(-x) is 0 or subnormal where the result is a normal float",
    ),
    "stability/silu_simplified": "as stability/silu; and its gradient 0 from x = 1e8 in float32 (1e20 in"
    " float64), where it is 1",
    **dict.fromkeys(
        ("stability/exprel", "stability/one_minus_exp_over_x"),
        "float32, |x| in (88.7, 93.5): expm1 overflows where the quotient by x is finite",
    ),
    "stability/logarithmic_mean": "float32: second derivative -inf at x = 1e-20",
    **dict.fromkeys(
        (
            "stability/barron",
            "stability/power_minus_value_cube_root",
            "stability/inverse_difference_of_squares_minus_one",
            "stability/inverse_root_minus_one",
            "stability/power_minus_value_negative",
            "stability/power_minus_value_negative_root",
        ),
        "a fractional or negative power of 1 + x**2 (or 1 + x): x**2 overflows, or an intermediate"
        " underflows, where the gradient or second derivative is a normal float (|x| from 1e10 in"
        " float32, 1e100 in float64)",
    ),
    "stability/power_minus_value_float_base": "second derivatives 0 or nan from x = 1e5 in float32; and"
    " near x = 0 the value's condition number in the constant 0.3 (not a binary float) is unbounded",
    "stability/sac_log_det": "second derivative nan from |x| = 1e4; gradient 0 at |x| = 50 in float32"
    " (normal there); near 0 the condition number in the constant 1e-6 (its case says so)",
    "stability/log_tanh": "float32: -inf at the subnormal x = 1e-40 (expm1 of a subnormal)",
    "stability/softclip": "from x = 1e8 in float32 (1e20 in float64) x - 1 rounds to x, and the value"
    " 1 is computed as 0",
    "stability/sigmoid_bump": "its gradient's two terms cancel near 0, where it is about -0.18*x (its case"
    " leaves |x| < 0.3 out)",
    "stability/lisht": "second derivative 0 for |x| in [10, 90], where it is a normal float",
    "stability/poincare_distance": "outside the unit ball (|x| > 1): (1 - x**2) overflows and the"
    " derivatives are nan or 0",
    "stability/softmax3": "second derivatives up to 1.3% off (float64 too) where one exponential is"
    " e**-30 of the others",
    **dict.fromkeys(
        ("stability/x_minus_root", "stability/root_minus_x_times_y"),
        "float32, |x| from 1e30: hypot_plus's 2*u overflows and the gradient is inf",
    ),
    "stability/tanhexp": "float32, x = -1e38: gradient nan",
    "stability/cloglog": "second derivative 0 or nan for x in [-90, -10], where it is a normal float",
    "stability/focal_binary": "values, gradients and second derivatives off at |x| <= 1e-20 and at"
    " large |t|",
    "stability/vae_kl": "float64: expm1(lv) - lv cancels near lv = 0 (its case and the README say so)",
    "stability/log_erfc": "second derivative 1e-3 off in float32 from x = 20; 0 from 1e8 in float64",
    "stability/skew_normal": "float64, x = -20: gradient and second derivative 2x off",
}


def _module_for(target: Target, gen_dir):
    if target.key.startswith("generated/"):
        # (As imported: a fused module runs its bodies eagerly on small CPU tensors, as for a
        # user; compiling every point's 0-d call would cost minutes of inductor.)
        return importlib.import_module(f"generated.{target.key.removeprefix('generated/')}")
    from test_stability import CASES, load

    case = next(c for c in CASES if c.name == target.key.removeprefix("stability/"))
    return load(case, gen_dir)


def computed_quantities(target: Target, module, point: tuple[float, ...], dtype) -> list[float | None]:
    """The module's quantities at ``point`` in ``dtype`` (as :func:`_quantities` orders them),
    through autograd: first derivatives by its backward, second by double backward."""
    meta = metadata_of(module)
    fn = getattr(module, meta["alias"])
    args = [torch.tensor(p, dtype=dtype, requires_grad=True) for p in point]
    inputs = [a.clone() for a in args] if meta["inplace"] else args
    outputs = fn(*inputs, *(value for _, value in target.params))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    results: list[float] = []
    for out, differentiable in zip(outputs, target.derivatives or itertools.repeat(True)):
        results.append(out.item())
        if not differentiable:
            continue
        # (An in-place Function has no double backward, by design: its second derivatives
        # are not checked.)
        second_order = not meta["inplace"]
        grads = torch.autograd.grad(out, args, create_graph=second_order, retain_graph=True, allow_unused=True)
        results += [0.0 if g is None else g.item() for g in grads]
        for i in range(len(args)):
            for j in range(i, len(args)):
                g = grads[i]
                if not second_order:
                    results.append(None)
                elif g is None or not g.requires_grad:
                    results.append(0.0)  # (a constant gradient)
                else:
                    (second,) = torch.autograd.grad(g, args[j], retain_graph=True, allow_unused=True)
                    results.append(0.0 if second is None else second.item())
    return results


def range_failures(target: Target, module, dtype) -> list[tuple]:
    """(point, quantity index, got, exact) wherever the bound fails and no exception covers it."""
    finfo = torch.finfo(dtype)
    rtol = RANGE_RTOL[dtype]
    truths = stored_truths(target)
    failures = []
    for point in range_points(len(target.inputs)):
        if not all(abs(p) <= finfo.max for p in point) or any(float(torch.tensor(p, dtype=dtype)) != p for p in point):
            continue  # (not a point of this dtype)
        exact = truths.get(point_key(point))
        if exact is None:
            raise StaleTruths(f"{target.key} has no range truth at {point}: run `{REGENERATE_RANGE}`")
        if not exact or _excepted(target, point, dtype):
            continue
        got = computed_quantities(target, module, point, dtype)
        for index, (value, want) in enumerate(zip(got, exact)):
            if want is None or value is None or abs(want) > finfo.max:
                continue  # (not a finite float of the dtype: nothing to match; or not computed)
            if not (math.isfinite(value) and abs(value - want) <= max(rtol * abs(want), finfo.tiny)):
                failures.append((point, index, value, mpmath.nstr(want, 8)))
    return failures


def _assert_right_across_the_range(target: Target, module) -> None:
    for dtype in (torch.float32, torch.float64):
        failures = range_failures(target, module, dtype)
        assert not failures, f"{target.key} ({dtype}): (point, quantity, got, exact) {failures[:12]}" + (
            f" and {len(failures) - 12} more" if len(failures) > 12 else ""
        )


GENERATED_TARGETS = [t for t in all_targets() if t.key.startswith("generated/")]
STABILITY_TARGETS = [t for t in all_targets() if t.key.startswith("stability/")]


def _marked(target: Target, *marks) -> object:
    if target.key in KNOWN_DEFECTS:
        marks += (pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[target.key]),)
    return pytest.param(target, marks=marks, id=target.key.split("/", 1)[1])


@pytest.mark.parametrize("target", [_marked(t) for t in GENERATED_TARGETS])
def test_generated_module_is_right_across_the_float_range(target):
    _assert_right_across_the_range(target, _module_for(target, None))


@pytest.mark.parametrize(
    "target",
    [
        _marked(t) if t.key.removeprefix("stability/") in DEFAULT_STABILITY else _marked(t, pytest.mark.slow)
        for t in STABILITY_TARGETS
    ],
)
def test_stability_case_is_right_across_the_float_range(target, tmp_path_factory):
    _assert_right_across_the_range(target, _module_for(target, tmp_path_factory.mktemp("range")))


def test_range_store_holds_exactly_the_targets_at_their_points():
    stale = []
    for target in all_targets():
        entry = range_store().cases.get(target.key)
        wanted = {point_key(p) for p in range_points(len(target.inputs))}
        if entry is None or entry["expr"] != target.record or set(entry["points"]) != wanted:
            stale.append(target.key)
    extra = sorted(set(range_store().cases) - {t.key for t in all_targets()})
    assert not stale and not extra, f"stale range truths {stale}, extra {extra}: run `{REGENERATE_RANGE}`"
