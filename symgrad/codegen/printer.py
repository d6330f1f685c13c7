"""Our own SymPy-to-torch printer.

SymPy 1.14's ``TorchPrinter`` is wrong for us (facts.md): it prints ``Max(x, 1)`` as
``torch.max(1, x)`` (a TypeError), cannot print ``log1p``/``expm1``, prints ``gamma``
as ``torch.special.gamma`` (which does not exist) and ``Heaviside`` as a failing call.
So this printer subclasses SymPy's ``StrPrinter`` for operator precedence and term
order, and prints every function from :data:`PRINTERS`, failing loudly on anything
else. Numbers print as Python floats, which follow the tensors' dtype and device.
"""

from __future__ import annotations

import ast
from importlib import resources
from typing import Callable

import sympy
from sympy.codegen.cfunctions import expm1, log1p
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

from ..errors import SymgradError
from ..math.numbers import numbers_to_floats
from ..math.rounding import round_half_even
from ..math.functions import (
    erfcx,
    finite,
    guard,
    hypot,
    hypot_excess,
    log_ndtr,
    log_sigmoid,
    logaddexp,
    mish,
    ndtr,
    norm_ratio,
    sigmoid,
    silu,
    softplus,
    xlogy,
)

Args = list["Printed"]


def _one_call(printer: Callable[[Args], str]) -> Callable[[Args], str]:
    """Marks a PRINTERS entry that prints one call, ``f(...)``: an operand as it is (any
    other entry's code is parenthesised as an operand)."""
    printer.one_call = True  # type: ignore[attr-defined]
    return printer


def _call(torch_name: str) -> Callable[[Args], str]:
    return _one_call(lambda args: f"{torch_name}({', '.join(args)})")


def _gamma(args: Args) -> str:
    # torch has lgamma but no gamma: exp(lgamma) is |gamma|; gamma is negative exactly
    # where x < 0 and floor(x) is odd.
    (x,) = args
    magnitude = f"torch.exp(torch.lgamma({x}))"
    return f"torch.where(({x} > 0) | (torch.floor({x}) % 2 == 0), {magnitude}, -{magnitude})"


def _polygamma(args: Args) -> str:
    order = int(args[0].value)
    if order == 0:
        return f"torch.special.digamma({args[1]})"
    return f"torch.special.polygamma({order}, {args[1]})"


def _hypot_excess(a: "Printed", b: "Printed") -> str:
    # hypot(a, b) - b as a*((a/2)/(hypot(a, b)/2 + b/2)): math.functions.hypot_excess
    in_hypot = [_number_tensor(other.operand, text) if text.number else text for text, other in ((a, b), (b, a))]
    half_b = repr(float(b.value) / 2) if b.number else f"0.5 * {b.operand}"
    return f"{a.operand} * (0.5 * {a.operand} / (0.5 * torch.hypot({in_hypot[0]}, {in_hypot[1]}) + {half_b}))"


class Printed(str):
    """An argument's code, as PRINTERS' entries get it, with what the printer knows of it,
    decided on the expression, never on the code: ``value``, the SymPy argument; ``atom``,
    whether the code is a name, a plain number or one call; ``operand``, the code as an
    operand of an operator (parenthesised unless ``atom``); ``number``, whether it is a
    number literal."""

    value: sympy.Basic
    atom: bool
    operand: str
    number: bool

    @classmethod
    def of(cls, text: str, value: sympy.Basic, atom: bool, number: bool) -> "Printed":
        printed = cls(text)
        printed.value = value
        printed.atom = atom
        printed.operand = text if atom else f"({text})"
        printed.number = number
        return printed


# SymPy function class -> how to print it from its printed arguments. The single table
# the printer uses; functions.FUNCTIONS is the user-facing side of the same list.
PRINTERS: dict[type, Callable[[Args], str]] = {
    sympy.exp: _call("torch.exp"),
    sympy.log: _call("torch.log"),
    log1p: _call("torch.log1p"),
    expm1: _call("torch.expm1"),
    sympy.sin: _call("torch.sin"),
    sympy.cos: _call("torch.cos"),
    sympy.tan: _call("torch.tan"),
    sympy.asin: _call("torch.asin"),
    sympy.acos: _call("torch.acos"),
    sympy.atan: _call("torch.atan"),
    sympy.atan2: _call("torch.atan2"),
    sympy.sinh: _call("torch.sinh"),
    sympy.cosh: _call("torch.cosh"),
    sympy.tanh: _call("torch.tanh"),
    sympy.asinh: _call("torch.asinh"),
    sympy.acosh: _call("torch.acosh"),
    sympy.atanh: _call("torch.atanh"),
    sympy.Abs: _call("torch.abs"),
    sympy.sign: _call("torch.sign"),
    # Heaviside(x) with SymPy's H(0) = 1/2 is (sign(x) + 1) / 2: one op, dtype kept.
    sympy.Heaviside: lambda args: f"0.5 * (torch.sign({args[0]}) + 1)",
    sympy.floor: _call("torch.floor"),
    sympy.ceiling: _call("torch.ceil"),
    round_half_even: _call("torch.round"),
    sympy.erf: _call("torch.special.erf"),
    sympy.erfc: _call("torch.special.erfc"),
    sympy.gamma: _one_call(_gamma),
    sympy.loggamma: _call("torch.lgamma"),
    sympy.polygamma: _one_call(_polygamma),
    # symgrad.math.functions: torch's own stable kernels. softplus's threshold (where
    # it returns x itself) is raised from 20 to 40, where exp(-x) is below float64's
    # rounding of x; below it, log1p(exp(x)) cannot overflow in float32.
    softplus: _one_call(lambda args: f"torch.nn.functional.softplus({args[0]}, threshold=40.0)"),
    sigmoid: _call("torch.sigmoid"),
    # Forward bodies only (kernels.FORWARD_KERNELS): each one ATen kernel, which has no
    # integer or bool implementation, where the formula's torch.sigmoid promotes (_floating).
    mish: _one_call(lambda args: f"torch.nn.functional.mish(_floating({args[0]}))"),
    silu: _one_call(lambda args: f"torch.nn.functional.silu(_floating({args[0]}))"),
    log_sigmoid: _one_call(lambda args: f"torch.nn.functional.logsigmoid(_floating({args[0]}))"),
    # Not torch.special.ndtr: in torch 2.13 it returns 0 below about -10 (and loses all
    # accuracy near -5 in float32); erfc of the negated, scaled argument keeps both tails.
    ndtr: lambda args: f"0.5 * torch.special.erfc(-0.7071067811865476 * {args[0].operand})",
    # Module-level helpers (HELPERS): ATen has no float16 or bfloat16 CPU kernel for these.
    log_ndtr: _call("_log_ndtr"),
    erfcx: _call("_erfcx"),
    logaddexp: _call("torch.logaddexp"),
    hypot: _call("torch.hypot"),
    hypot_excess: lambda args: _hypot_excess(*args),
    finite: _one_call(lambda args: f"torch.nan_to_num({args[0]}, nan=torch.nan)"),
    # a/n kept whole (math.functions.norm_ratio), where SymPy would merge the powers
    norm_ratio: lambda args: f"{args[0].operand} / {args[1].operand}",
    xlogy: _call("torch.xlogy"),
    # guard(x, cond, safe[, earlier]): the inner where of the "double where" (rewrite.piecewise._guard_piecewise).
    guard: _one_call(lambda args: _guard(*args)),
}


# Fused modules (--fuse) print these functions as calls of module-level helpers (HELPERS):
# torch.compile's kernel for them is less accurate than ATen's on some devices.
COMPILED_CALLS: dict[type, str] = {sigmoid: "_sigmoid"}


def _helper_sources() -> dict[str, tuple[str, ...]]:
    """Each function in :mod:`symgrad.runtime.helpers`, as its source lines, in file order.

    Read as text and sliced with :mod:`ast`, never imported: the helpers import torch, and
    the generator must not (it runs where torch is slow to import, or absent).
    """
    text = (resources.files("symgrad.runtime") / "helpers.py").read_text(encoding="utf-8")
    lines = text.splitlines()
    return {
        node.name: tuple(lines[node.lineno - 1 : node.end_lineno])
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef)
    }


# Each module-level helper's source, printed in a generated module whose code calls it
# (plan.Plan.helpers): PRINTERS' and COMPILED_CALLS' helper names, and the float16 and
# in-place helpers the planner calls.
HELPERS: dict[str, tuple[str, ...]] = _helper_sources()


# Functions whose torch kernel takes no Python number (stable_functions' classes say so
# themselves, in ``tensor_args``).
_TENSOR_ARGS: dict[type, tuple[int, ...]] = {sympy.atan2: (0, 1)}


class TorchPrinter(StrPrinter):
    """Prints a SymPy expression as torch code over the given variable names."""

    # Not StrPrinter's "_sympystr": a class's own str() (math.series.Removable shows
    # its closed form) must not replace its torch spelling.
    printmethod = "_symgrad_torch"

    def __init__(
        self, names: dict[sympy.Symbol, str], reference: str | None = None, compiled: bool = False, promote: bool = False
    ) -> None:
        super().__init__({"order": "none"})
        # Code that torch.compile runs (fused bodies): COMPILED_CALLS replace PRINTERS.
        self._compiled = compiled
        # A tensor in scope, whose dtype (a floating-point one) or, with ``promote``, type
        # promotion (an input, which may be an integer tensor) and device constants follow
        # where a Python number will not do.
        self._reference = reference
        self._promote = promote
        self._names = names

    def emptyPrinter(self, expr: object) -> str:  # noqa: N802 (SymPy's name)
        raise SymgradError(f"symgrad cannot print {expr!r} as torch code")

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        try:
            return self._names[expr]
        except KeyError:
            raise SymgradError(f"internal: no name for symbol {expr}") from None

    _print_Dummy = _print_Symbol

    def _print_Integer(self, expr: sympy.Integer) -> str:
        value = int(expr)
        if abs(value) < 2**63:
            return str(value)
        # torch cannot take a Python int beyond int64 (OverflowError); SymPy can fold one
        # (10**200 from 200*log(10)). As a float it follows the dtype like any constant.
        if abs(value).bit_length() > 1024:  # float64's largest value is below 2**1024
            raise SymgradError(f"a constant of {len(str(abs(value)))} digits is beyond float64's range")
        return repr(float(value))

    def _print_Rational(self, expr: sympy.Rational) -> str:
        return repr(float(expr))

    def _print_Float(self, expr: sympy.Float) -> str:
        return repr(float(expr))

    def _print_NumberSymbol(self, expr: sympy.Expr) -> str:
        return repr(float(expr))

    _print_Pi = _print_Exp1 = _print_EulerGamma = _print_Catalan = _print_GoldenRatio = _print_NumberSymbol

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> str:
        base, exponent = expr.args
        if exponent == sympy.S.Half:
            return f"torch.sqrt({self._print(base)})"
        if exponent == -sympy.S.Half:
            return f"torch.rsqrt({self._print(base)})"
        if exponent == -1:
            return f"1 / {self.parenthesize(base, PRECEDENCE['Mul'], strict=True)}"
        # Python's ** binds tighter than unary minus and associates to the right, so
        # anything but a name, a call or a non-negative number is parenthesised, on both
        # sides: (x**y)**t, x**(1/t), (-2.0)**x; a negative number exponent need not be,
        # x**-2.0. (A float: torch refuses an integer tensor to a negative integer power, and
        # pow takes the same fast paths for -2.0 as for -2; found in review.)
        if exponent.is_Number and exponent.is_negative:
            power = repr(float(exponent)) if exponent.is_Integer else self._print(exponent)
        else:
            power = self._pow_operand(exponent)
        return f"{self._pow_operand(base)} ** {power}"

    def _print_Mul(self, expr: sympy.Mul) -> str:
        # A number over powers, 0.5/sqrt(x) or -1/x**2, as the number times negative powers,
        # 0.5*torch.rsqrt(x) and -x**-2.0: StrPrinter's division runs the power, a reciprocal
        # and a product (Python's number / tensor is reciprocal(t) * number), three kernels for
        # two (for -x**-2.0, a negation in place). Over a tensor numerator it is one division
        # either way, and a / b reads better.
        coefficient, rest = expr.as_coeff_Mul()
        factors = sympy.Mul.make_args(rest)
        powers = [f for f in factors if f.is_Pow and f.exp.is_Rational and f.exp.is_negative]
        if len(powers) < len(factors) or all(p.exp == -1 for p in powers):
            return super()._print_Mul(expr)
        numerator = [self._print(abs(coefficient))] if abs(coefficient) != 1 else []
        numerator += [self.parenthesize(p, PRECEDENCE["Mul"], strict=False) for p in powers if p.exp != -1]
        divisions = "".join(
            f" / {self.parenthesize(p.base, PRECEDENCE['Mul'], strict=True)}" for p in powers if p.exp == -1
        )
        return ("-" if coefficient < 0 else "") + " * ".join(numerator) + divisions

    def _as_ordered_terms(self, expr: sympy.Expr, order: str | None = None) -> list[sympy.Expr]:
        # A sum starts with a term that is not negated where it has one: -a + b prints as
        # b - a, one subtraction, where -a + b negates a first (a kernel more).
        terms = list(super()._as_ordered_terms(expr, order=order))
        if expr.is_Add:
            first_positive = next((i for i, term in enumerate(terms) if not _leads_with_minus(term)), 0)
            terms.insert(0, terms.pop(first_positive))
        return terms

    def _pow_operand(self, expr: sympy.Expr) -> str:
        text = self._print(expr)
        simple = expr.is_Symbol or isinstance(expr, sympy.Function) or (
            expr.is_Number and not expr.is_negative and expr.is_Integer
        )
        return text if simple else f"({text})"

    def _print_NaN(self, expr: sympy.Expr) -> str:
        return 'float("nan")'

    def _print_Infinity(self, expr: sympy.Expr) -> str:
        return 'float("inf")'

    def _print_NegativeInfinity(self, expr: sympy.Expr) -> str:
        return '(-float("inf"))'

    _print_ComplexInfinity = _print_NaN  # undefined over the reals

    def _print_ImaginaryUnit(self, expr: sympy.Expr) -> str:
        # (StrPrinter prints "I", a NameError in the generated module.) parse and derive
        # refuse complex values; this is the last guard.
        raise SymgradError("the expression has a complex value here, and symgrad works over the real numbers")

    def _print_Function(self, expr: sympy.Function) -> str:
        args = [self._printed(arg) for arg in expr.args]
        tensor_args = getattr(expr, "tensor_args", None) or _TENSOR_ARGS.get(type(expr), ())
        if tensor_args:
            # torch.hypot/logaddexp take no Python numbers: a number argument becomes a 0-d
            # tensor of another argument's dtype and device, which broadcasts like the number
            # (full_like allocated and filled a full-size tensor: one pass over memory more).
            anchor = next((args[i] for i, a in enumerate(expr.args) if not a.is_number), None)
            # (A number tensor is an operand as it is where its anchor is a name: ``x.new_full((), 2.0)``.)
            args = [
                (
                    Printed.of(_number_tensor(anchor.operand, text), a, anchor.value.is_Symbol, False)
                    if i in tensor_args and a.is_number and anchor
                    else text
                )
                for i, (a, text) in enumerate(zip(expr.args, args))
            ]
        torch_code = getattr(type(expr), "torch_code", None)
        if torch_code is not None:  # generated families (math.series.Removable)
            return self._function_code(expr, torch_code(self, args, expr.args))
        if self._compiled and type(expr) in COMPILED_CALLS:
            return f"{COMPILED_CALLS[type(expr)]}({', '.join(args)})"
        printer = PRINTERS.get(type(expr))
        if printer is None:
            raise SymgradError(f"symgrad cannot print {type(expr).__name__} as torch code")
        return self._function_code(expr, printer(args))

    def _function_code(self, expr: sympy.Function, code: str) -> str:
        """A function's ``code``, parenthesised unless it is one call (or a name or number):
        the operator printers treat a function as an atom, but some print as an expression
        (Heaviside as ``0.5 * (torch.sign(x) + 1)``, ndtr through erfc)."""
        return code if self._function_is_atom(expr) else f"({code})"

    def _function_is_atom(self, expr: sympy.Function) -> bool:
        kind = type(expr)
        if getattr(kind, "torch_code", None) is not None:
            is_atom = getattr(kind, "torch_code_is_atom", None)
            if is_atom is not None:
                return is_atom()
            return self._is_atom(numbers_to_floats(kind.expanded(*expr.args)))
        if self._compiled and kind in COMPILED_CALLS:
            return True
        return getattr(PRINTERS.get(kind), "one_call", False)

    def _printed(self, arg: sympy.Basic) -> Printed:
        """``arg`` printed, as PRINTERS' entries take it."""
        text = self._print(arg)
        number = isinstance(arg, (sympy.Integer, sympy.Rational, sympy.Float))
        return Printed.of(text, arg, self._is_atom(arg), number)

    def _is_atom(self, expr: sympy.Basic) -> bool:
        """Whether ``expr`` prints as a name, a plain number (no sign or exponent) or one call."""
        if expr.is_Symbol:
            # (a generated family's placeholder stands for its argument's code: ExpandedFunction)
            name = self._names.get(expr)
            return name.atom if isinstance(name, Printed) else True
        if isinstance(expr, (sympy.logic.boolalg.BooleanAtom, sympy.Piecewise, sympy.ITE)):
            return True
        if isinstance(expr, (sympy.Integer, sympy.Rational, sympy.Float)):
            return _plain_number(self._print(expr))
        if expr in (sympy.nan, sympy.oo, sympy.zoo):
            return True  # float("nan"), float("inf")
        if expr.is_Pow:
            return expr.exp in (sympy.S.Half, -sympy.S.Half)  # torch.sqrt(...), torch.rsqrt(...)
        if isinstance(expr, (sympy.Min, sympy.Max)):
            return True  # torch.maximum(...), torch.clamp(...)
        if isinstance(expr, sympy.Function):
            return self._function_is_atom(expr)
        return False  # sums, products, comparisons, -inf as (-float("inf"))

    # StrPrinter prints Heaviside itself (as "Heaviside(x)"); every function goes through
    # PRINTERS instead.
    _print_Heaviside = _print_Function

    def _print_MinMax(self, expr: sympy.Expr, tensor_fn: str, clamp_bound: str) -> str:
        numbers = [a for a in expr.args if a.is_number]
        tensors = [self._print(a) for a in expr.args if not a.is_number]
        text = tensors[0]
        for other in tensors[1:]:
            text = f"{tensor_fn}({text}, {other})"
        # torch.maximum needs two tensors; a number bound is a clamp. SymPy has already
        # folded several number arguments into one.
        for number in numbers:
            text = f"torch.clamp({text}, {clamp_bound}={self._print(number)})"
        return text

    def _print_Max(self, expr: sympy.Max) -> str:
        return self._print_MinMax(expr, "torch.maximum", "min")

    def _print_Min(self, expr: sympy.Min) -> str:
        return self._print_MinMax(expr, "torch.minimum", "max")

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        # Nested torch.where, from the last (otherwise) branch outwards.
        *branches, (otherwise, _) = expr.args
        text = self._print(otherwise)
        inner_is_number = otherwise.is_number
        for value, condition in reversed(branches):
            value_text = self._print(value)
            if value.is_number and inner_is_number:
                # torch.where of two Python numbers gives the default dtype, not the
                # inputs': make one branch a 0-d tensor of the reference's dtype. (The
                # condition's own tensors may be bool, e.g. a CSE temporary `t0 = x < 1`.)
                if self._reference is not None:
                    ref = self._reference
                    dtype = f"_dtype_with({ref}, {value_text})" if self._promote else f"{ref}.dtype"
                    value_text = f"torch.tensor({value_text}, dtype={dtype}, device={ref}.device)"
                else:
                    anchor = self._print(sorted(condition.free_symbols, key=str)[0])  # (a name)
                    value_text = _number_tensor(anchor, value_text)
            text = f"torch.where({self._print(condition)}, {value_text}, {text})"
            inner_is_number = False
        return text

    def _print_ITE(self, expr: sympy.Basic) -> str:
        # SymPy builds ITE when a condition compares conditions; on bool tensors it is a where.
        condition, then, otherwise = (self._print(a) for a in expr.args)
        return f"torch.where({condition}, {then}, {otherwise})"

    def _print_BooleanFunction(self, expr: sympy.Basic) -> str:
        raise SymgradError(f"symgrad cannot print the condition {type(expr).__name__} as torch code")

    def _print_Relational(self, expr: sympy.core.relational.Relational) -> str:
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        return f"{self.parenthesize(expr.lhs, PRECEDENCE['Relational'])} {op} {self.parenthesize(expr.rhs, PRECEDENCE['Relational'])}"

    def _print_And(self, expr: sympy.And) -> str:
        return " & ".join(f"({self._print(a)})" for a in sorted(expr.args, key=str))

    def _print_Or(self, expr: sympy.Or) -> str:
        return " | ".join(f"({self._print(a)})" for a in sorted(expr.args, key=str))

    def _print_Not(self, expr: sympy.Not) -> str:
        return f"~({self._print(expr.args[0])})"

    def _print_BooleanTrue(self, expr: sympy.Basic) -> str:
        return "True"

    def _print_BooleanFalse(self, expr: sympy.Basic) -> str:
        return "False"


def _number_tensor(anchor: str, number: str) -> str:
    """A 0-d tensor holding ``number``, of the dtype and device of the tensor ``anchor`` (an operand)."""
    return f"{anchor}.new_full((), {number})"


def _plain_number(literal: str) -> bool:
    """Whether a number's literal has no sign or exponent (``0.5``, ``3``, ``inf``, not
    ``-0.5`` or ``1e-05``): an operand as it is."""
    return literal.replace(".", "a").isalnum()


def _guard(x: Printed, cond: Printed, safe: Printed, earlier: Printed | None = None) -> str:
    """guard(x, cond, safe, earlier): ``earlier`` negated with ``~``, which holds where it is
    nan, as the nested torch.where that selects the branch has it (SymPy's own negation of
    log(x) > 1, log(x) <= 1, does not)."""
    if earlier is not None:
        if cond.value == sympy.true:
            # The same selection as where(~earlier, x, safe), without the negation's kernel.
            return f"torch.where({earlier}, {safe}, {x})"
        cond = f"({cond}) & ~({earlier})"
    return f"torch.where({cond}, {x}, {safe})"


def print_torch(
    expr: sympy.Basic,
    names: dict[sympy.Symbol, str],
    reference: str | None = None,
    compiled: bool = False,
    promote: bool = False,
) -> str:
    """Print ``expr`` as torch code, with symbols printed as ``names[symbol]``.

    Constants become floats first (``2*x/3`` prints as ``0.6666666666666666*x``,
    ``sqrt(10)*x`` as ``3.1622776601683795*x``), as plan.py's CSE input already does;
    exponents stay exact. ``compiled``: the code runs under torch.compile (a fused
    module's bodies), so COMPILED_CALLS apply. ``promote``: ``reference`` may be an integer
    tensor, so a number made a tensor takes the helper ``_dtype_with`` of it, not its dtype.
    """
    return TorchPrinter(names, reference, compiled, promote).doprint(numbers_to_floats(expr))


def prints_as_sum(expr: sympy.Basic) -> bool:
    """Whether ``print_torch(expr, ...)`` is a sum or difference at its top (or a comparison),
    so that as an operand of ``*`` it needs parentheses.

    Decided on the expression as the printer prints it (after :func:`numbers_to_floats`,
    which evaluates: an unevaluated ``Mul(-1, 1 + u)`` becomes the sum ``-u - 1``), by the
    printer's own rules: products, powers, calls, names and numbers never print as a sum.
    """
    return _prints_as_sum(numbers_to_floats(expr))


def _prints_as_sum(expr: sympy.Basic) -> bool:
    if expr.is_Add or expr.is_Relational:
        return True
    if isinstance(expr, sympy.Function) and getattr(type(expr), "torch_code", None) is not None:
        # A generated family prints its expansion (ExpandedFunction) or a polynomial.
        is_sum = getattr(type(expr), "torch_code_is_sum", None)
        if is_sum is not None:
            return is_sum()
        return _prints_as_sum(numbers_to_floats(type(expr).expanded(*expr.args)))
    return False


# The module-level helpers (HELPERS) that PRINTERS' entries call, by function class.
PRINTER_HELPERS: dict[type, str] = {
    mish: "_floating",
    silu: "_floating",
    log_sigmoid: "_floating",
    log_ndtr: "_log_ndtr",
    erfcx: "_erfcx",
}


def helpers_used(
    expr: sympy.Basic, reference: str | None = None, compiled: bool = False, promote: bool = False
) -> frozenset[str]:
    """The module-level helpers (HELPERS) that ``print_torch(expr, ..., reference, compiled,
    promote)`` calls, read from the SymPy tree and the printer's tables: PRINTER_HELPERS,
    COMPILED_CALLS under ``compiled``, and ``_dtype_with`` where a Piecewise of number
    branches is made a tensor beside an input (``promote``)."""
    return _helpers_in(numbers_to_floats(expr), reference, compiled, promote)


def _helpers_in(expr: sympy.Basic, reference: str | None, compiled: bool, promote: bool) -> frozenset[str]:
    found: set[str] = set()
    for node in sympy.preorder_traversal(expr):
        kind = type(node)
        if getattr(kind, "expanded", None) is not None and getattr(kind, "torch_code", None) is not None:
            # (A generated family prints its expansion: read that too.)
            try:
                expansion = kind.expanded(*node.args)
            except NotImplementedError:
                expansion = None
            if expansion is not None:
                found |= _helpers_in(numbers_to_floats(expansion), reference, compiled, promote)
        if compiled and kind in COMPILED_CALLS:
            found.add(COMPILED_CALLS[kind])
        elif kind in PRINTER_HELPERS:
            found.add(PRINTER_HELPERS[kind])
        if isinstance(node, sympy.Piecewise) and reference is not None and promote and _number_branches(node):
            found.add("_dtype_with")
    return frozenset(found)


def _number_branches(expr: sympy.Piecewise) -> bool:
    """Whether TorchPrinter._print_Piecewise makes a number branch a tensor (two number
    branches meet in one torch.where)."""
    *branches, (otherwise, _) = expr.args
    inner_is_number = otherwise.is_number
    for value, _ in reversed(branches):
        if value.is_number and inner_is_number:
            return True
        inner_is_number = False
    return False


def _leads_with_minus(term: sympy.Expr) -> bool:
    """Whether ``term`` prints with a leading minus: a negative number, or a product whose
    numeric coefficient is negative (SymPy's private ``_coeff_isneg``, in its public API)."""
    coefficient = term.as_coeff_Mul()[0]
    return bool(coefficient.is_Number and coefficient.is_extended_negative)
