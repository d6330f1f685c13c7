"""Our own SymPy-to-torch printer.

SymPy 1.14's ``TorchPrinter`` is wrong for us (facts.md): it prints ``Max(x, 1)`` as
``torch.max(1, x)`` (a TypeError), cannot print ``log1p``/``expm1``, prints ``gamma``
as ``torch.special.gamma`` (which does not exist) and ``Heaviside`` as a failing call.
So this printer subclasses SymPy's ``StrPrinter`` for operator precedence and term
order, and prints every function from :data:`PRINTERS`, failing loudly on anything
else. Numbers print as Python floats, which follow the tensors' dtype and device.
"""

from __future__ import annotations

from typing import Callable

import sympy
from sympy.codegen.cfunctions import expm1, log1p
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

from .errors import SymgradError

Args = list[str]


def _call(torch_name: str) -> Callable[[Args], str]:
    return lambda args: f"{torch_name}({', '.join(args)})"


def _gamma(args: Args) -> str:
    # torch has lgamma but no gamma: exp(lgamma) is |gamma|; gamma is negative exactly
    # where x < 0 and floor(x) is odd.
    (x,) = args
    magnitude = f"torch.exp(torch.lgamma({x}))"
    return f"torch.where(({x} > 0) | (torch.floor({x}) % 2 == 0), {magnitude}, -{magnitude})"


def _polygamma(args: Args) -> str:
    order = int(float(args[0]))
    if order == 0:
        return f"torch.special.digamma({args[1]})"
    return f"torch.special.polygamma({order}, {args[1]})"


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
    sympy.erf: _call("torch.special.erf"),
    sympy.erfc: _call("torch.special.erfc"),
    sympy.gamma: _gamma,
    sympy.loggamma: _call("torch.lgamma"),
    sympy.polygamma: _polygamma,
}


class TorchPrinter(StrPrinter):
    """Prints a SymPy expression as torch code over the given variable names."""

    def __init__(self, names: dict[sympy.Symbol, str]) -> None:
        super().__init__({"order": "none"})
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
        return str(int(expr))

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
            return f"1 / {self.parenthesize(base, PRECEDENCE['Mul'], strict=False)}"
        power = PRECEDENCE["Pow"]
        base_text = self.parenthesize(base, power, strict=True)
        if base.is_number and not base.is_Integer:
            base_text = f"({self._print(base)})"
        exp_text = self._print(exponent) if exponent.is_Integer and exponent >= 0 else self.parenthesize(exponent, power, strict=True)
        if exponent.is_number and exponent.is_negative:
            exp_text = f"({self._print(exponent)})"
        return f"{base_text} ** {exp_text}"

    def _print_Function(self, expr: sympy.Function) -> str:
        printer = PRINTERS.get(type(expr))
        if printer is None:
            raise SymgradError(f"symgrad cannot print {type(expr).__name__} as torch code")
        return printer([self._print(arg) for arg in expr.args])

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
                # inputs': anchor one branch to a tensor from the condition.
                anchor = self._print(sorted(condition.free_symbols, key=str)[0])
                value_text = f"torch.full_like({anchor}, {value_text})"
            text = f"torch.where({self._print(condition)}, {value_text}, {text})"
            inner_is_number = False
        return text

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


def print_torch(expr: sympy.Basic, names: dict[sympy.Symbol, str]) -> str:
    """Print ``expr`` as torch code, with symbols printed as ``names[symbol]``."""
    return TorchPrinter(names).doprint(expr)


