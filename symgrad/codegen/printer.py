"""Our own SymPy-to-torch printer.

SymPy 1.14's ``TorchPrinter`` is wrong for us (facts.md): it prints ``Max(x, 1)`` as
``torch.max(1, x)`` (a TypeError), cannot print ``log1p``/``expm1``, prints ``gamma``
as ``torch.special.gamma`` (which does not exist) and ``Heaviside`` as a failing call.
So this printer subclasses SymPy's ``StrPrinter`` for operator precedence and term
order, and prints every function from :data:`PRINTERS`, failing loudly on anything
else. Numbers print as Python floats, which follow the tensors' dtype and device.

It builds syntax trees (:mod:`symgrad.codegen.syntax`), not text: the plan's passes
(operation counts, the --fast buffer reuse) read the trees, and :func:`print_torch` prints
them. Where StrPrinter writes parentheses, the tree holds a ``Parenthesized`` marker, so
the printed code keeps exactly StrPrinter's parentheses.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from importlib import resources
from typing import Callable

import sympy
from sympy.codegen.cfunctions import expm1, log1p
from sympy.core.mul import _keep_coeff
from sympy.printing.precedence import PRECEDENCE, precedence
from sympy.printing.str import StrPrinter
from sympy.utilities.iterables import sift

from . import syntax
from .syntax import Code, binop, call, compare, method, negate, number, parens, unary, where

from ..errors import SymgradError
from ..math.numbers import numbers_to_floats
from ..math.reductions import AdjointShapedAs, Gather, ScatterAdd
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


def _one_call(printer: Callable[[Args], Code]) -> Callable[[Args], Code]:
    """Marks a PRINTERS entry that prints one call, ``f(...)``: an operand as it is (any
    other entry's code is parenthesised as an operand)."""
    printer.one_call = True  # type: ignore[attr-defined]
    return printer


def _call(torch_name: str) -> Callable[[Args], Code]:
    return _one_call(lambda args: call(torch_name, *(a.code for a in args)))


def _gamma(args: Args) -> Code:
    # torch has lgamma but no gamma: exp(lgamma) is |gamma|; gamma is negative exactly
    # where x < 0 and floor(x) is odd.
    x = args[0].code
    magnitude = call("torch.exp", call("torch.lgamma", x))
    even = compare(binop(call("torch.floor", x), "%", 2), "==", 0)
    return where(binop(parens(compare(x, ">", 0)), "|", parens(even)), magnitude, unary("-", magnitude))


def _polygamma(args: Args) -> Code:
    order = int(args[0].value)
    if order == 0:
        return call("torch.special.digamma", args[1].code)
    return call("torch.special.polygamma", order, args[1].code)


def _hypot_excess(a: "Printed", b: "Printed") -> Code:
    # hypot(a, b) - b as a*((a/2)/(hypot(a, b)/2 + b/2)): math.functions.hypot_excess
    in_hypot = [_number_tensor(other.operand, p.code) if p.number else p.code for p, other in ((a, b), (b, a))]
    half_b = number(float(b.value) / 2) if b.number else binop(0.5, "*", b.operand)
    denominator = parens(binop(binop(0.5, "*", call("torch.hypot", *in_hypot)), "+", half_b))
    return binop(a.operand, "*", parens(binop(binop(0.5, "*", a.operand), "/", denominator)))


@dataclass(frozen=True)
class Printed:
    """An argument's code, as PRINTERS' entries get it, with what the printer knows of it,
    decided on the expression, never on the code: ``value``, the SymPy argument; ``atom``,
    whether the code is a name, a plain number or one call; ``number``, whether it is a
    number literal."""

    code: Code
    value: sympy.Basic
    atom: bool
    number: bool

    @property
    def operand(self) -> Code:
        """The code as an operand of an operator: parenthesised unless ``atom``."""
        return self.code if self.atom else parens(self.code)


# SymPy function class -> how to print it from its printed arguments. The single table
# the printer uses; functions.FUNCTIONS is the user-facing side of the same list.
PRINTERS: dict[type, Callable[[Args], Code]] = {
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
    sympy.Heaviside: lambda args: binop(0.5, "*", parens(binop(call("torch.sign", args[0].code), "+", 1))),
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
    softplus: _one_call(lambda args: call("torch.nn.functional.softplus", args[0].code, threshold=40.0)),
    sigmoid: _call("torch.sigmoid"),
    # Forward bodies only (kernels.FORWARD_KERNELS): each one ATen kernel, which has no
    # integer or bool implementation, where the formula's torch.sigmoid promotes (_floating).
    mish: _one_call(lambda args: call("torch.nn.functional.mish", call("_floating", args[0].code))),
    silu: _one_call(lambda args: call("torch.nn.functional.silu", call("_floating", args[0].code))),
    log_sigmoid: _one_call(lambda args: call("torch.nn.functional.logsigmoid", call("_floating", args[0].code))),
    # Not torch.special.ndtr: in torch 2.13 it returns 0 below about -10 (and loses all
    # accuracy near -5 in float32); erfc of the negated, scaled argument keeps both tails.
    ndtr: lambda args: binop(0.5, "*", call("torch.special.erfc", binop(-0.7071067811865476, "*", args[0].operand))),
    # Module-level helpers (HELPERS): ATen has no float16 or bfloat16 CPU kernel for these.
    log_ndtr: _call("_log_ndtr"),
    erfcx: _call("_erfcx"),
    logaddexp: _call("torch.logaddexp"),
    hypot: _call("torch.hypot"),
    hypot_excess: lambda args: _hypot_excess(*args),
    finite: _one_call(lambda args: call("torch.nan_to_num", args[0].code, nan="torch.nan")),
    # a/n kept whole (math.functions.norm_ratio), where SymPy would merge the powers
    norm_ratio: lambda args: binop(args[0].operand, "/", args[1].operand),
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
    """Prints a SymPy expression as torch code over the given variable names, as a syntax tree."""

    # Not StrPrinter's "_sympystr": a class's own str() (math.series.Removable shows
    # its closed form) must not replace its torch spelling.
    printmethod = "_symgrad_torch"

    def __init__(
        self,
        names: dict[sympy.Symbol, "str | Printed"],
        reference: str | None = None,
        compiled: bool = False,
        promote: bool = False,
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

    def doprint(self, expr: sympy.Basic) -> Code:  # (StrPrinter's makes a str of it)
        return self._print(expr)

    def emptyPrinter(self, expr: object) -> Code:  # noqa: N802 (SymPy's name)
        raise SymgradError(f"symgrad cannot print {expr!r} as torch code")

    def parenthesize(self, item: sympy.Basic, level: int, strict: bool = False) -> Code:
        # StrPrinter's, on trees.
        if precedence(item) < level or (not strict and precedence(item) <= level):
            return parens(self._print(item))
        return self._print(item)

    def _print_Symbol(self, expr: sympy.Symbol) -> Code:
        try:
            bound = self._names[expr]
        except KeyError:
            raise SymgradError(f"internal: no name for symbol {expr}") from None
        # (a generated family's placeholder stands for its argument's code: ExpandedFunction)
        return bound.code if isinstance(bound, Printed) else syntax.dotted(bound)

    _print_Dummy = _print_Symbol

    def _print_Integer(self, expr: sympy.Integer) -> Code:
        value = int(expr)
        if abs(value) < 2**63:
            return number(value)
        # torch cannot take a Python int beyond int64 (OverflowError); SymPy can fold one
        # (10**200 from 200*log(10)). As a float it follows the dtype like any constant.
        if abs(value).bit_length() > 1024:  # float64's largest value is below 2**1024
            raise SymgradError(f"a constant of {len(str(abs(value)))} digits is beyond float64's range")
        return number(float(value))

    def _print_Rational(self, expr: sympy.Rational) -> Code:
        return number(float(expr))

    def _print_Float(self, expr: sympy.Float) -> Code:
        return number(float(expr))

    def _print_NumberSymbol(self, expr: sympy.Expr) -> Code:
        return number(float(expr))

    _print_Pi = _print_Exp1 = _print_EulerGamma = _print_Catalan = _print_GoldenRatio = _print_NumberSymbol

    def _print_Pow(self, expr: sympy.Pow, rational: bool = False) -> Code:
        base, exponent = expr.args
        if exponent == sympy.S.Half:
            return call("torch.sqrt", self._print(base))
        if exponent == -sympy.S.Half:
            return call("torch.rsqrt", self._print(base))
        if exponent == -1:
            return binop(1, "/", self.parenthesize(base, PRECEDENCE["Mul"], strict=True))
        # Python's ** binds tighter than unary minus and associates to the right, so
        # anything but a name, a call or a non-negative number is parenthesised, on both
        # sides: (x**y)**t, x**(1/t), (-2.0)**x; a negative number exponent need not be,
        # x**-2.0. (A float: torch refuses an integer tensor to a negative integer power, and
        # pow takes the same fast paths for -2.0 as for -2.)
        if exponent.is_Number and exponent.is_negative:
            power = number(float(exponent)) if exponent.is_Integer else self._print(exponent)
        else:
            power = self._pow_operand(exponent)
        return binop(self._pow_operand(base), "**", power)

    def _print_Add(self, expr: sympy.Add, order: str | None = None) -> Code:
        # StrPrinter's, on trees: a term printed with a leading minus is subtracted.
        terms = self._as_ordered_terms(expr, order=order)
        level = precedence(expr)
        tree: Code | None = None
        for term in terms:
            code = self._print(term)
            unsigned = None if term.is_Add else syntax.without_leading_minus(code)
            sign = "+" if unsigned is None else "-"
            if unsigned is not None:
                code = unsigned
            if precedence(term) < level or term.is_Add:
                code = parens(code)
            if tree is None:
                tree = code if sign == "+" else negate(code)
            else:
                tree = binop(tree, sign, code)
        return tree

    def _print_Mul(self, expr: sympy.Mul) -> Code:
        # A number over powers, 0.5/sqrt(x) or -1/x**2, as the number times negative powers,
        # 0.5*torch.rsqrt(x) and -x**-2.0: StrPrinter's division runs the power, a reciprocal
        # and a product (Python's number / tensor is reciprocal(t) * number), three kernels for
        # two (for -x**-2.0, a negation in place). Over a tensor numerator it is one division
        # either way, and a / b reads better.
        coefficient, rest = expr.as_coeff_Mul()
        factors = sympy.Mul.make_args(rest)
        powers = [f for f in factors if f.is_Pow and f.exp.is_Rational and f.exp.is_negative]
        if len(powers) < len(factors) or all(p.exp == -1 for p in powers):
            return self._str_printer_mul(expr)
        numerator = [self._print(abs(coefficient))] if abs(coefficient) != 1 else []
        numerator += [self.parenthesize(p, PRECEDENCE["Mul"], strict=False) for p in powers if p.exp != -1]
        tree = _product(numerator)
        for p in powers:
            if p.exp == -1:
                tree = binop(tree, "/", self.parenthesize(p.base, PRECEDENCE["Mul"], strict=True))
        return negate(tree) if coefficient < 0 else tree

    def _str_printer_mul(self, expr: sympy.Mul) -> Code:
        """StrPrinter._print_Mul (SymPy 1.14), on trees, for the orders this printer uses
        ("none"): the same factors, order and parentheses."""
        level = precedence(expr)
        args = expr.args
        if args[0] is sympy.S.One or any(
            isinstance(a, sympy.Number) or a.is_Pow and all(ai.is_Integer for ai in a.args) for a in args[1:]
        ):
            # An unevaluated product, printed with every factor as it is.
            d, n = sift(args, lambda x: isinstance(x, sympy.Pow) and bool(x.exp.as_coeff_Mul()[0] < 0), binary=True)
            for i, di in enumerate(d):
                if di.exp.is_Number:
                    e = -di.exp
                else:
                    dargs = list(di.exp.args)
                    dargs[0] = -dargs[0]
                    e = sympy.Mul._from_args(dargs)
                d[i] = sympy.Pow(di.base, e, evaluate=False) if e - 1 else di.base
            pre = [self._print(n.pop(0))] if n and not n[0].is_Add and n[0].could_extract_minus_sign() else []
            nfactors = pre + [self.parenthesize(a, level, strict=False) for a in n] or [number(1)]
            pre = [self._print(d.pop(0))] if len(d) > 1 and d[0].could_extract_minus_sign() else []
            dfactors = pre + [self.parenthesize(a, level, strict=False) for a in d]
            if len(dfactors) > 1:
                return binop(_product(nfactors), "/", parens(_product(dfactors)))
            if dfactors:
                return binop(_product(nfactors), "/", dfactors[0])
            return _product(nfactors)

        c, e = expr.as_coeff_Mul()
        negative = c < 0
        if negative:
            expr = _keep_coeff(-c, e)
        numerator: list[sympy.Expr] = []
        denominator: list[sympy.Expr] = []
        pow_paren = []  # powers with exponent -1 of a product or power: parenthesised whole
        for item in sympy.Mul.make_args(expr):
            if item.is_commutative and isinstance(item, sympy.Pow) and bool(item.exp.as_coeff_Mul()[0] < 0):
                if item.exp is not sympy.S.NegativeOne:
                    denominator.append(_reciprocal_power(item))
                else:
                    if len(item.args[0].args) != 1 and isinstance(item.base, (sympy.Mul, sympy.Pow)):
                        pow_paren.append(item)
                    denominator.append(item.base)
            elif item.is_Rational and item is not sympy.S.Infinity:
                if item.p != 1:
                    numerator.append(sympy.Rational(item.p))
                if item.q != 1:
                    denominator.append(sympy.Rational(item.q))
            else:
                numerator.append(item)
        numerator = numerator or [sympy.S.One]
        a_code = [self.parenthesize(x, level, strict=False) for x in numerator]
        b_code = [self.parenthesize(x, level, strict=False) for x in denominator]
        for item in pow_paren:
            if item.base in denominator:
                b_code[denominator.index(item.base)] = parens(b_code[denominator.index(item.base)])
        if not denominator:
            tree = _product(a_code)
        elif len(denominator) == 1:
            tree = binop(_product(a_code), "/", b_code[0])
        else:
            tree = binop(_product(a_code), "/", parens(_product(b_code)))
        return negate(tree) if negative else tree

    def _as_ordered_terms(self, expr: sympy.Expr, order: str | None = None) -> list[sympy.Expr]:
        # A sum starts with a term that is not negated where it has one: -a + b prints as
        # b - a, one subtraction, where -a + b negates a first (a kernel more).
        terms = list(super()._as_ordered_terms(expr, order=order))
        if expr.is_Add:
            first_positive = next((i for i, term in enumerate(terms) if not _leads_with_minus(term)), 0)
            terms.insert(0, terms.pop(first_positive))
        return terms

    def _pow_operand(self, expr: sympy.Expr) -> Code:
        code = self._print(expr)
        simple = expr.is_Symbol or isinstance(expr, sympy.Function) or (
            expr.is_Number and not expr.is_negative and expr.is_Integer
        )
        return code if simple else parens(code)

    def _print_NaN(self, expr: sympy.Expr) -> Code:
        return call("float", syntax.string("nan"))

    def _print_Infinity(self, expr: sympy.Expr) -> Code:
        return call("float", syntax.string("inf"))

    def _print_NegativeInfinity(self, expr: sympy.Expr) -> Code:
        return parens(unary("-", call("float", syntax.string("inf"))))

    _print_ComplexInfinity = _print_NaN  # undefined over the reals

    def _print_ImaginaryUnit(self, expr: sympy.Expr) -> Code:
        # (StrPrinter prints "I", a NameError in the generated module.) parse and derive
        # refuse complex values; this is the last guard.
        raise SymgradError("the expression has a complex value here, and symgrad works over the real numbers")

    def _print_Function(self, expr: sympy.Function) -> Code:
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
                    Printed(_number_tensor(anchor.operand, printed.code), a, anchor.value.is_Symbol, False)
                    if i in tensor_args and a.is_number and anchor
                    else printed
                )
                for i, (a, printed) in enumerate(zip(expr.args, args))
            ]
        torch_code = getattr(type(expr), "torch_code", None)
        if torch_code is not None:  # generated families (math.series.Removable)
            return self._function_code(expr, torch_code(self, args, expr.args))
        if self._compiled and type(expr) in COMPILED_CALLS:
            return call(COMPILED_CALLS[type(expr)], *(a.code for a in args))
        printer = PRINTERS.get(type(expr))
        if printer is None:
            raise SymgradError(f"symgrad cannot print {type(expr).__name__} as torch code")
        return self._function_code(expr, printer(args))

    def _function_code(self, expr: sympy.Function, code: Code) -> Code:
        """A function's ``code``, parenthesised unless it is one call (or a name or number):
        the operator printers treat a function as an atom, but some print as an expression
        (Heaviside as ``0.5 * (torch.sign(x) + 1)``, ndtr through erfc)."""
        return code if self._function_is_atom(expr) else parens(code)

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
        is_number = isinstance(arg, (sympy.Integer, sympy.Rational, sympy.Float))
        return Printed(self._print(arg), arg, self._is_atom(arg), is_number)

    def _is_atom(self, expr: sympy.Basic) -> bool:
        """Whether ``expr`` prints as a name, a plain number (no sign or exponent) or one call."""
        if expr.is_Symbol:
            # (a generated family's placeholder stands for its argument's code: ExpandedFunction)
            bound = self._names.get(expr)
            return bound.atom if isinstance(bound, Printed) else True
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

    def _print_MinMax(self, expr: sympy.Expr, tensor_fn: str, clamp_bound: str) -> Code:
        numbers = [a for a in expr.args if a.is_number]
        tensors = [self._print(a) for a in expr.args if not a.is_number]
        tree = tensors[0]
        for other in tensors[1:]:
            tree = call(tensor_fn, tree, other)
        # torch.maximum needs two tensors; a number bound is a clamp. SymPy has already
        # folded several number arguments into one.
        for bound in numbers:
            tree = call("torch.clamp", tree, **{clamp_bound: self._print(bound)})
        return tree

    def _print_Max(self, expr: sympy.Max) -> Code:
        return self._print_MinMax(expr, "torch.maximum", "min")

    def _print_Min(self, expr: sympy.Min) -> Code:
        return self._print_MinMax(expr, "torch.minimum", "max")

    def _print_Piecewise(self, expr: sympy.Piecewise) -> Code:
        # Nested torch.where, from the last (otherwise) branch outwards.
        *branches, (otherwise, _) = expr.args
        tree = self._print(otherwise)
        inner_is_number = otherwise.is_number
        for value, condition in reversed(branches):
            value_code = self._print(value)
            if value.is_number and inner_is_number:
                # torch.where of two Python numbers gives the default dtype, not the
                # inputs': make one branch a 0-d tensor of the reference's dtype. (The
                # condition's own tensors may be bool, e.g. a CSE temporary `t0 = x < 1`.)
                if self._reference is not None:
                    ref = syntax.dotted(self._reference)
                    dtype = call("_dtype_with", ref, value_code) if self._promote else syntax.attribute(ref, "dtype")
                    value_code = call("torch.tensor", value_code, dtype=dtype, device=syntax.attribute(ref, "device"))
                else:
                    anchor = self._print(sorted(condition.free_symbols, key=str)[0])  # (a name)
                    value_code = _number_tensor(anchor, value_code)
            tree = where(self._print(condition), value_code, tree)
            inner_is_number = False
        return tree

    def _print_ITE(self, expr: sympy.Basic) -> Code:
        # SymPy builds ITE when a condition compares conditions; on bool tensors it is a where.
        return where(*(self._print(a) for a in expr.args))

    def _print_BooleanFunction(self, expr: sympy.Basic) -> Code:
        raise SymgradError(f"symgrad cannot print the condition {type(expr).__name__} as torch code")

    def _print_Relational(self, expr: sympy.core.relational.Relational) -> Code:
        if expr.rel_op not in ("==", "!=", "<", "<=", ">", ">="):
            raise SymgradError(f"symgrad cannot print the relation {expr.rel_op} as torch code")
        level = PRECEDENCE["Relational"]
        return compare(self.parenthesize(expr.lhs, level), expr.rel_op, self.parenthesize(expr.rhs, level))

    def _print_And(self, expr: sympy.And) -> Code:
        return _joined("&", [parens(self._print(a)) for a in sorted(expr.args, key=str)])

    def _print_Or(self, expr: sympy.Or) -> Code:
        return _joined("|", [parens(self._print(a)) for a in sorted(expr.args, key=str)])

    def _print_Not(self, expr: sympy.Not) -> Code:
        return unary("~", parens(self._print(expr.args[0])))

    def _print_BooleanTrue(self, expr: sympy.Basic) -> Code:
        return ast.Constant(True)

    def _print_BooleanFalse(self, expr: sympy.Basic) -> Code:
        return ast.Constant(False)


def _joined(op: str, operands: list[Code]) -> Code:
    """``a op b op c``, left to right."""
    tree = operands[0]
    for operand in operands[1:]:
        tree = binop(tree, op, operand)
    return tree


def _product(factors: list[Code]) -> Code:
    return _joined("*", factors)


def _reciprocal_power(power: sympy.Expr) -> sympy.Expr:
    """``b**-e`` as ``b**e``, unevaluated (StrPrinter's ``apow``)."""
    base, exponent = power.as_base_exp()
    eargs = list(sympy.Mul.make_args(exponent))
    if eargs[0] is sympy.S.NegativeOne:
        eargs = eargs[1:]
    else:
        eargs[0] = -eargs[0]
    exponent = sympy.Mul._from_args(eargs)
    if isinstance(power, sympy.Pow):
        return power.func(base, exponent, evaluate=False)
    return power.func(exponent, evaluate=False)


def _number_tensor(anchor: Code, value: Code) -> Code:
    """A 0-d tensor holding the number ``value``, of the dtype and device of the tensor ``anchor`` (an operand)."""
    return method(anchor, "new_full", syntax.tuple_of(), value)


def _plain_number(literal: Code) -> bool:
    """Whether a number literal is written without sign or exponent (``0.5``, ``3``, not
    ``-0.5`` or ``1e-05``): an operand as it is."""
    return repr(literal.value).replace(".", "a").isalnum()


def _guard(x: Printed, cond: Printed, safe: Printed, earlier: Printed | None = None) -> Code:
    """guard(x, cond, safe, earlier): ``earlier`` negated with ``~``, which holds where it is
    nan, as the nested torch.where that selects the branch has it (SymPy's own negation of
    log(x) > 1, log(x) <= 1, does not)."""
    if earlier is not None:
        if cond.value == sympy.true:
            # The same selection as where(~earlier, x, safe), without the negation's kernel.
            return where(earlier.code, safe.code, x.code)
        return where(binop(parens(cond.code), "&", unary("~", parens(earlier.code))), x.code, safe.code)
    return where(cond.code, x.code, safe.code)


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
    return syntax.source(print_tree(expr, names, reference, compiled, promote))


def print_tree(
    expr: sympy.Basic,
    names: dict[sympy.Symbol, str],
    reference: str | None = None,
    compiled: bool = False,
    promote: bool = False,
) -> Code:
    """:func:`print_torch`'s code as a syntax tree (:mod:`symgrad.codegen.syntax`)."""
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
    AdjointShapedAs: "_reduced_to",
    Gather: "_gather_last",
    ScatterAdd: "_scatter_added",
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
