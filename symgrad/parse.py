"""Stage 1: untrusted text becomes SymPy expressions, through ``ast`` and a whitelist.

Nothing here evaluates user text: ``sympify``/``parse_expr`` would run arbitrary Python
(``__import__('os').system(...)``). The text is parsed by :func:`ast.parse` and every
node kind is whitelisted; SymPy objects are built directly. Sizes are bounded before
any work grows with them, so no input can hang symgrad or exhaust memory.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

import sympy

from .errors import SymgradError
from .functions import CONSTANTS, FUNCTIONS, REDUCTIONS, REJECTED_NAMES
from .spec import Spec

# Documented limits (README, "Limits"). Each is far above any real activation function.
MAX_LENGTH = 20_000  # characters of expression text
MAX_DEPTH = 100  # nesting of the expression tree
MAX_NODES = 5_000  # syntax-tree nodes
MAX_OUTPUTS = 16
MAX_INT_DIGITS = 30  # an integer literal
MAX_EXPONENT = 1_000  # |n| in x**n for a symbolic base
MAX_CONSTANT_BITS = 4_096  # a constant folded from integer powers

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_COMPARE = {
    ast.Lt: sympy.StrictLessThan,
    ast.LtE: sympy.LessThan,
    ast.Gt: sympy.StrictGreaterThan,
    ast.GtE: sympy.GreaterThan,
    ast.Eq: sympy.Eq,
    ast.NotEq: sympy.Ne,
}
# Why a construct is refused, in words a user recognises.
_REFUSED_NODES = {
    ast.Attribute: "attribute access (a.b)",
    ast.Subscript: "subscripts (a[i])",
    ast.Lambda: "lambda",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.NamedExpr: "assignment expressions (:=)",
    ast.JoinedStr: "f-strings",
    ast.FormattedValue: "f-strings",
    ast.IfExp: "conditional expressions (a if c else b); use Piecewise",
    ast.List: "lists",
    ast.Dict: "dicts",
    ast.Set: "sets",
    ast.Starred: "starred arguments",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Slice: "slices",
}
_REFUSED_OPERATORS = {
    ast.MatMult: "the @ operator",
    ast.Mod: "the % operator",
    ast.FloorDiv: "the // operator; use floor(a/b)",
    ast.BitXor: "the ^ operator; write powers as **",
    ast.BitAnd: "the & operator",
    ast.BitOr: "the | operator",
    ast.LShift: "shifts",
    ast.RShift: "shifts",
    ast.Invert: "the ~ operator",
}


@dataclass(frozen=True)
class Output:
    """One output: an elementwise expression, possibly reduced over the whole tensor."""

    expr: sympy.Expr
    reduction: str | None = None  # None, "sum" or "mean"


@dataclass(frozen=True)
class Parsed:
    """Stage-1 result: the math of a spec, with inputs and params resolved."""

    spec: Spec
    outputs: tuple[Output, ...]
    inputs: tuple[sympy.Symbol, ...]
    params: tuple[sympy.Symbol, ...]
    surrogates: tuple[tuple[sympy.Symbol, sympy.Expr], ...]


def parse_spec(spec: Spec) -> Parsed:
    """Parse a spec's expression, inputs, params and surrogate gradients."""
    outputs = parse_outputs(spec.expr)
    symbols = sorted({s for out in outputs for s in out.expr.free_symbols}, key=lambda s: s.name)
    by_name = {s.name: s for s in symbols}
    params = _resolve_names(spec.params, by_name, "--params")
    if spec.inputs is None:
        inputs = tuple(s for s in symbols if s not in params)
    else:
        inputs = _resolve_names(spec.inputs, by_name, "--inputs")
        overlap = set(inputs) & set(params)
        if overlap:
            raise SymgradError(f"{sorted(s.name for s in overlap)[0]!r} is listed in both --inputs and --params")
        stray = [s.name for s in symbols if s not in inputs and s not in params]
        if stray:
            raise SymgradError(
                f"symbol {stray[0]!r} is neither an input nor a param: add it to --inputs or --params"
            )
    if not inputs:
        raise SymgradError("the expression has no differentiable input: it depends on no symbol outside --params")
    for index, out in enumerate(outputs):
        if not out.expr.free_symbols & set(inputs):
            where = f"output {index + 1}" if len(outputs) > 1 else "the expression"
            raise SymgradError(f"{where} does not depend on any input ({out.expr}), so it has no gradient")
    surrogates = _parse_surrogates(spec, outputs, inputs, params)
    return Parsed(spec=spec, outputs=outputs, inputs=inputs, params=params, surrogates=surrogates)


def parse_outputs(text: str) -> tuple[Output, ...]:
    """Parse expression text into one or more outputs (a top-level tuple gives several)."""
    tree = _syntax_tree(text)
    body = tree.body
    elements = body.elts if isinstance(body, ast.Tuple) else [body]
    if not elements:
        raise SymgradError("the expression is empty")
    if len(elements) > MAX_OUTPUTS:
        raise SymgradError(f"too many outputs ({len(elements)}; the limit is {MAX_OUTPUTS})")
    builder = _Builder(text)
    return tuple(builder.output(node) for node in elements)


def parse_elementwise(text: str, what: str) -> sympy.Expr:
    """Parse a single elementwise expression (no tuple, no reduction), e.g. a surrogate."""
    outputs = parse_outputs(text)
    if len(outputs) != 1 or outputs[0].reduction is not None:
        raise SymgradError(f"{what} must be a single elementwise expression, got {text!r}")
    return outputs[0].expr


def _syntax_tree(text: str) -> ast.Expression:
    if not isinstance(text, str):
        raise SymgradError(f"the expression must be text, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise SymgradError(f"the expression is {len(text)} characters long; the limit is {MAX_LENGTH}")
    if not text.strip():
        raise SymgradError("the expression is empty")
    if "\n" in text.strip() or "\r" in text:
        raise SymgradError("the expression must be a single line")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        column = exc.offset or 1
        reason = (exc.msg or "invalid syntax").split("(")[0].strip()
        raise SymgradError(
            f"invalid syntax at column {column}: {reason}", caret=_caret(text.strip(), column)
        ) from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise SymgradError(f"the expression cannot be parsed: {type(exc).__name__}: too deeply nested or too large") from None
    _check_size(tree)
    return tree


def _caret(text: str, column: int) -> str:
    """Two lines: the expression and a caret under ``column`` (1-based)."""
    if len(text) > 120:
        start = max(0, column - 60)
        text, column = text[start : start + 120], column - start
    return f"    {text}\n    {' ' * (column - 1)}^"


def _check_size(tree: ast.AST) -> None:
    # Iterative, so that a pathological tree cannot exhaust Python's stack here.
    stack = [(tree, 0)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise SymgradError(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)")
        if count > MAX_NODES:
            raise SymgradError(f"the expression is too large (more than {MAX_NODES} syntax nodes)")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


class _Builder:
    """Turns whitelisted syntax nodes into SymPy objects."""

    def __init__(self, text: str) -> None:
        self._text = text.strip()
        self._symbols: dict[str, sympy.Symbol] = {}

    def fail(self, node: ast.AST, message: str) -> SymgradError:
        column = getattr(node, "col_offset", None)
        if column is None:
            return SymgradError(message)
        # ast offsets count UTF-8 bytes; users count characters.
        column = len(self._text.encode("utf-8")[:column].decode("utf-8", "replace")) + 1
        return SymgradError(f"{message} (at column {column})", caret=_caret(self._text, column))

    def output(self, node: ast.AST) -> Output:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REDUCTIONS:
            (arg,) = self._call_args(node, (1,))
            return Output(self._finite(self.expr(arg), node), node.func.id)
        return Output(self._finite(self.expr(node), node))

    def _finite(self, expr: sympy.Expr, node: ast.AST) -> sympy.Expr:
        if expr.has(sympy.I):
            raise self.fail(node, "the expression has a complex value (e.g. sqrt of a negative number)")
        if expr.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
            raise self.fail(node, "the expression has an infinite or undefined constant (e.g. 1/0 or log(0))")
        # (A Symbol is also a sympy Boolean, so test for the logical kinds themselves.)
        logical = (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanAtom, sympy.logic.boolalg.BooleanFunction)
        if not isinstance(expr, sympy.Expr) or isinstance(expr, logical):
            raise self.fail(node, "an output must be a number-valued expression")
        return expr

    def expr(self, node: ast.AST) -> sympy.Expr:
        if isinstance(node, ast.Constant):
            return self._constant(node)
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return -self.expr(node.operand)
            if isinstance(node.op, ast.UAdd):
                return self.expr(node.operand)
            if isinstance(node.op, ast.Not):
                raise self.fail(node, "'not' is only allowed inside a Piecewise condition")
            raise self.fail(node, f"{_REFUSED_OPERATORS.get(type(node.op), 'this operator')} is not supported")
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Compare):
            # A bare comparison is the 0/1 indicator of its condition.
            return sympy.Piecewise((1, self.condition(node)), (0, True))
        if isinstance(node, ast.Tuple):
            raise self.fail(node, "a tuple is only allowed at the top level (several outputs) or inside Piecewise")
        if isinstance(node, ast.BoolOp):
            raise self.fail(node, "'and'/'or' are only allowed inside a Piecewise condition")
        what = _REFUSED_NODES.get(type(node), type(node).__name__)
        raise self.fail(node, f"{what} is not allowed in an expression")

    def _constant(self, node: ast.Constant) -> sympy.Expr:
        value = node.value
        if isinstance(value, bool) or value is None:
            raise self.fail(node, f"{value!r} is only allowed as a Piecewise condition")
        if isinstance(value, int):
            if len(str(abs(value))) > MAX_INT_DIGITS:
                raise self.fail(node, f"integer literal too large (more than {MAX_INT_DIGITS} digits)")
            return sympy.Integer(value)
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise self.fail(node, "the float literal is not finite")
            return sympy.Float(repr(value))
        if isinstance(value, complex):
            raise self.fail(node, "complex numbers are not supported: symgrad works over the real numbers")
        raise self.fail(node, f"{type(value).__name__} literals are not allowed in an expression")

    def _name(self, node: ast.Name) -> sympy.Expr:
        name = node.id
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in REJECTED_NAMES:
            raise self.fail(node, REJECTED_NAMES[name])
        if name in FUNCTIONS:
            raise self.fail(node, f"{name!r} is a function: call it, e.g. {name}(x)")
        if name.startswith("__"):
            raise self.fail(node, f"names starting with '__' are not allowed ({name!r})")
        if name not in self._symbols:
            self._symbols[name] = sympy.Symbol(name, real=True)
        return self._symbols[name]

    def _binary(self, node: ast.BinOp) -> sympy.Expr:
        if type(node.op) not in _BINARY:
            raise self.fail(node, f"{_REFUSED_OPERATORS.get(type(node.op), 'this operator')} is not supported")
        left, right = self.expr(node.left), self.expr(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise self.fail(node, "division by zero")
            return left / right
        return self._power(node, left, right)

    def _power(self, node: ast.AST, base: sympy.Expr, exponent: sympy.Expr) -> sympy.Expr:
        # SymPy folds number**integer exactly: 2**10**10 would never finish. Bound it first.
        if exponent.is_Integer:
            if base.is_number and base.is_Rational:
                numer, denom = sympy.fraction(base)
                bits = max(abs(int(numer)).bit_length(), abs(int(denom)).bit_length(), 1)
                if bits * abs(int(exponent)) > MAX_CONSTANT_BITS:
                    raise self.fail(node, f"constant too large: the power would exceed {MAX_CONSTANT_BITS} bits")
            elif abs(int(exponent)) > MAX_EXPONENT:
                raise self.fail(node, f"exponent too large (|n| > {MAX_EXPONENT})")
        elif exponent.is_number and exponent.is_Rational:
            if abs(exponent) > MAX_EXPONENT:
                raise self.fail(node, f"exponent too large (|n| > {MAX_EXPONENT})")
        elif exponent.is_Float and abs(exponent) > MAX_EXPONENT and not base.is_number:
            raise self.fail(node, f"exponent too large (|n| > {MAX_EXPONENT})")
        if base == 0 and exponent.is_number and exponent.is_negative:
            raise self.fail(node, "division by zero (0 to a negative power)")
        return sympy.Pow(base, exponent)

    def _call_args(self, node: ast.Call, arity: tuple[int, ...] | None) -> list[ast.AST]:
        name = node.func.id  # type: ignore[attr-defined]
        if node.keywords:
            raise self.fail(node, f"keyword arguments are not allowed ({name})")
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            raise self.fail(node, f"starred arguments are not allowed ({name})")
        count = len(node.args)
        if (arity is None and count == 0) or (arity is not None and count not in arity):
            wanted = "one or more" if arity is None else " or ".join(map(str, arity))
            raise self.fail(node, f"{name}() takes {wanted} argument{'s' if wanted != '1' else ''}, got {count}")
        return list(node.args)

    def _call(self, node: ast.Call) -> sympy.Expr:
        if not isinstance(node.func, ast.Name):
            raise self.fail(node, "only calls of supported functions by name are allowed, e.g. exp(x)")
        name = node.func.id
        entry = FUNCTIONS.get(name)
        if entry is None:
            close = difflib.get_close_matches(name, sorted(FUNCTIONS), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise self.fail(node, f"unknown function {name!r}{hint} (symgrad --list-functions shows all)")
        if name in REDUCTIONS:
            raise self.fail(node, f"{name}() must wrap a whole output, e.g. {name}(x**2)")
        args = self._call_args(node, entry.arity)
        if name == "Piecewise":
            return self._piecewise(node, args)
        return entry.build(*(self.expr(arg) for arg in args))

    def _piecewise(self, node: ast.Call, args: list[ast.AST]) -> sympy.Expr:
        pairs = []
        for arg in args:
            if not (isinstance(arg, ast.Tuple) and len(arg.elts) == 2):
                raise self.fail(arg, "each Piecewise argument must be a pair (value, condition)")
            pairs.append((self.expr(arg.elts[0]), self.condition(arg.elts[1])))
        if pairs[-1][1] is not sympy.true:
            raise self.fail(node, "Piecewise needs a final (value, True) branch, so it is defined everywhere")
        return sympy.Piecewise(*pairs)

    def condition(self, node: ast.AST) -> sympy.logic.boolalg.Boolean:
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return sympy.true if node.value else sympy.false
        if isinstance(node, ast.Compare):
            terms = [self.expr(node.left)] + [self.expr(c) for c in node.comparators]
            parts = []
            for op, left, right in zip(node.ops, terms, terms[1:]):
                if type(op) not in _COMPARE:
                    raise self.fail(node, "only <, <=, >, >=, == and != comparisons are allowed")
                parts.append(_COMPARE[type(op)](left, right))
            return sympy.And(*parts)
        if isinstance(node, ast.BoolOp):
            combine = sympy.And if isinstance(node.op, ast.And) else sympy.Or
            return combine(*(self.condition(v) for v in node.values))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return sympy.Not(self.condition(node.operand))
        raise self.fail(node, "a Piecewise condition must be a comparison, and/or/not of comparisons, or True")


def _resolve_names(
    names: tuple[str, ...] | None, by_name: dict[str, sympy.Symbol], option: str
) -> tuple[sympy.Symbol, ...]:
    resolved = []
    for name in names or ():
        if name not in by_name:
            raise SymgradError(f"{option} names {name!r}, which the expression does not use")
        resolved.append(by_name[name])
    return tuple(resolved)


def _parse_surrogates(
    spec: Spec,
    outputs: tuple[Output, ...],
    inputs: tuple[sympy.Symbol, ...],
    params: tuple[sympy.Symbol, ...],
) -> tuple[tuple[sympy.Symbol, sympy.Expr], ...]:
    if not spec.grads:
        return ()
    if len(outputs) != 1 or outputs[0].reduction is not None:
        raise SymgradError("--grad needs a single elementwise output")
    by_name = {s.name: s for s in inputs}
    known = {s.name for s in inputs + params}
    result = []
    for name, text in spec.grads:
        if name not in by_name:
            raise SymgradError(f"--grad {name}=...: {name!r} is not a differentiable input")
        if name in {n for n, _ in result}:
            raise SymgradError(f"--grad {name}=... is given twice")
        expr = parse_elementwise(text, f"--grad {name}")
        stray = sorted(s.name for s in expr.free_symbols if s.name not in known)
        if stray:
            raise SymgradError(f"--grad {name}={text}: symbol {stray[0]!r} is not an input or param")
        # Reuse the expression's own Symbol objects so both sides share assumptions.
        expr = expr.xreplace({s: next(t for t in inputs + params if t.name == s.name) for s in expr.free_symbols})
        result.append((name, expr))
    return tuple((by_name[name], expr) for name, expr in result)
