"""An independent evaluation of a spec's expression, for checking generated forwards.

It deliberately shares no code with symgrad: SymPy's own ``parse_expr`` reads the
(trusted, checked-in) expression text, and mpmath evaluates it element by element.
"""

from __future__ import annotations

import ast

import mpmath
import numpy as np
import sympy
from sympy.codegen.cfunctions import expm1, log1p
from sympy.parsing.sympy_parser import parse_expr

_SUM = sympy.Function("REFERENCE_SUM")
_MEAN = sympy.Function("REFERENCE_MEAN")


def _log(arg, base=None):
    return sympy.log(arg) if base is None else sympy.log(arg) / sympy.log(base)


class _Indicators(ast.NodeTransformer):
    """A comparison used as a number is its 0/1 indicator: wrap it in Piecewise."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == "Piecewise":
            # comparisons in Piecewise conditions stay conditions; their operands are numbers
            for pair in node.args:
                if isinstance(pair, ast.Tuple) and len(pair.elts) == 2:
                    pair.elts[0] = self.visit(pair.elts[0])
                    pair.elts[1] = self._condition(pair.elts[1])
            return node
        return self.generic_visit(node)

    def _condition(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.Compare):
            node.left = self.visit(node.left)
            node.comparators = [self.visit(c) for c in node.comparators]
        elif isinstance(node, ast.BoolOp):
            # Python's and/or/not would ask a SymPy relational for its truth value
            combine = "And" if isinstance(node.op, ast.And) else "Or"
            return ast.Call(ast.Name(combine, ast.Load()), [self._condition(v) for v in node.values], [])
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ast.Call(ast.Name("Not", ast.Load()), [self._condition(node.operand)], [])
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        text = ast.unparse(self._condition(node))
        return ast.parse(f"Piecewise((1, {text}), (0, True))", mode="eval").body


def parse_reference(text: str, names: list[str]) -> list[sympy.Expr]:
    local = {name: sympy.Symbol(name, real=True) for name in names}
    local.update(sum=_SUM, mean=_MEAN, log1p=log1p, expm1=expm1, log=_log, abs=sympy.Abs)
    text = ast.unparse(_Indicators().visit(ast.parse(text, mode="eval")))
    parsed = parse_expr(text, local_dict=local)
    return list(parsed) if isinstance(parsed, tuple) else [parsed]


def evaluate(text: str, values: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Evaluate every output of ``text`` at ``values`` (broadcast), in float64 via mpmath."""
    names = sorted(values)
    symbols = [sympy.Symbol(n, real=True) for n in names]
    arrays = np.broadcast_arrays(*[np.asarray(values[n], dtype=np.float64) for n in names])
    results = []
    for expr in parse_reference(text, names):
        reduction = None
        if isinstance(expr, (_SUM, _MEAN)):
            reduction = np.sum if isinstance(expr, _SUM) else np.mean
            expr = expr.args[0]
        function = sympy.lambdify(symbols, expr, modules="mpmath")
        with mpmath.workdps(30):
            flat = [float(mpmath.re(function(*(mpmath.mpf(float(a.flat[k])) for a in arrays))))
                    for k in range(arrays[0].size)]
        value = np.array(flat, dtype=np.float64).reshape(arrays[0].shape)
        results.append(reduction(value) if reduction else value)
    return results
