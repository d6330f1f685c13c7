"""Stage 1: untrusted text becomes SymPy expressions, through ``ast`` and a whitelist.

Nothing here evaluates user text: ``sympify``/``parse_expr`` would run arbitrary Python
(``__import__('os').system(...)``). The text is parsed by :func:`ast.parse` and every
node kind is whitelisted; SymPy objects are built directly. Sizes are bounded before
any work grows with them, so no input can hang symgrad or exhaust memory.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import keyword
import re
import unicodedata
from dataclasses import dataclass

import mpmath
import sympy

from ..errors import SymgradError
from ..spec import Spec
from .grammar import CONSTANTS, FUNCTIONS, REDUCTIONS, REJECTED_NAMES, ROW_FUNCTIONS
from ..math import reductions


# Documented limits (README, "Limits"). Each is far above any real activation function.

MAX_LENGTH = 20_000  # characters of expression text
MAX_DEPTH = 100  # nesting of the expression tree
MAX_NODES = 5_000  # syntax-tree nodes
MAX_OUTPUTS = 16
MAX_INT_DIGITS = 30  # an integer literal
MAX_EXPONENT = 1_000  # |n| in x**n, and any rational or integer exponent
MAX_CONSTANT_BITS = 2_048  # an exact integer power a**n is only computed below this size
MAX_CONSTANT = 1e300  # |c| for every constant subexpression, evaluated in bounded precision
MIN_CONSTANT = 1e-300  # ... and a nonzero constant below this would vanish in float64
MAX_EXACT_SPECIAL = 100  # gamma/loggamma/digamma of a larger constant is evaluated numerically
MAX_CONDITION_COMPARISONS = 256  # a Piecewise condition, once its Piecewise values are expanded

# SymPy evaluates these exactly at integer arguments (gamma(10**9) is a factorial that
# never finishes), so a large constant argument is evaluated numerically instead.

_EXACT_AT_INTEGERS = ("gamma", "loggamma", "digamma")
# Hints for names users coming from SymPy or Python may try.

_UNKNOWN_HINTS = {
    "Integral": "unevaluated integrals are not supported; write the integrand's closed form",
    "integrate": "integration is not supported; write the closed form",
    "Derivative": "unevaluated derivatives are not supported; symgrad differentiates for you",
    "diff": "symgrad differentiates for you; write the function itself",
    "factorial": "use gamma(n + 1)",
    "ln": "use log(x)",
    "arctan": "use atan(x)",
    "pow": "use a**b",
    "ceil": "use ceiling(x)",
}

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_COMPARE = {
    ast.Lt: sympy.StrictLessThan,
    ast.LtE: sympy.LessThan,
    ast.Gt: sympy.StrictGreaterThan,
    ast.GtE: sympy.GreaterThan,
    ast.Eq: sympy.Eq,
    ast.NotEq: sympy.Ne,
}
_COMPARE_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
# & and | combine conditions (as torch users write them), beside and/or.
_LOGIC_OPERATORS = {ast.BitAnd: sympy.And, ast.BitOr: sympy.Or}
_LOGIC_TEXT = {ast.BitAnd: "&", ast.BitOr: "|"}
_CONDITION_PLACES = "Piecewise or where condition"
# Why a construct is refused, in words a user recognises.

_REFUSED_NODES = {
    ast.Attribute: "attribute access (a.b) is not allowed",
    ast.Subscript: "subscripts (a[i]) are not allowed",
    ast.Lambda: "lambda is not allowed",
    ast.ListComp: "comprehensions are not allowed",
    ast.SetComp: "comprehensions are not allowed",
    ast.DictComp: "comprehensions are not allowed",
    ast.GeneratorExp: "comprehensions are not allowed",
    ast.NamedExpr: "assignment expressions (:=) are not allowed",
    ast.JoinedStr: "f-strings are not allowed",
    ast.FormattedValue: "f-strings are not allowed",
    ast.IfExp: "conditional expressions (a if c else b) are not allowed; use Piecewise((a, c), (b, True))",
    ast.List: "lists are not allowed",
    ast.Dict: "dicts are not allowed",
    ast.Set: "sets are not allowed",
    ast.Starred: "starred arguments are not allowed",
    ast.Await: "await is not allowed",
    ast.Yield: "yield is not allowed",
    ast.YieldFrom: "yield is not allowed",
    ast.Slice: "slices are not allowed",
}
_SUPPORTED = "an expression has numbers, names, + - * / **, and calls of supported functions"

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
    # --vjp: whole input gradients, in the upstream gradient GRAD_OUTPUT and the inputs and params
    vjps: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()


def parse_spec(spec: Spec) -> Parsed:
    """Parse a spec's expression, inputs, params and surrogate gradients."""
    domain_names = [name for name, _, _ in spec.domain]
    twice = sorted({name for name in domain_names if domain_names.count(name) > 1})
    if twice:
        raise SymgradError(f"--domain {twice[0]}=... is given twice")
    outputs, written = _parse(spec.expr)
    # --inputs/--params may name any symbol the text names, even one that cancels (x*y - x*y);
    # the default inputs are the symbols the outputs still depend on.
    by_name = {s.name: s for s in written}
    if any(name not in by_name for name in spec.params):
        # A param may appear in a surrogate gradient alone: --grad "x=-lam" with the output x
        # is the scaled gradient reversal of domain-adversarial training. (Only then are the
        # surrogates parsed here too; _parse_surrogates parses and checks them.)
        for name, text, option in [(n, t, "--grad") for n, t in spec.grads] + [(n, t, "--vjp") for n, t in spec.vjps]:
            for symbol in parse_elementwise(text, f"{option} {name}").free_symbols:
                if symbol.name in spec.params:  # (an input must be in the expression)
                    by_name.setdefault(symbol.name, symbol)
    symbols = sorted({s for out in outputs for s in out.expr.free_symbols}, key=lambda s: s.name)
    indices = {node.index for out in outputs for node in sympy.preorder_traversal(out.expr) if isinstance(node, reductions.Gather)}
    params = _resolve_names(spec.params, by_name, "--params")
    for index in sorted(indices, key=lambda s: s.name):
        # gather's class index is an integer tensor: a param, never differentiated.
        if spec.inputs is not None and index.name in spec.inputs:
            raise SymgradError(f"{index.name!r} indexes a gather, so it is an integer param, not an input")
        if index not in params:
            params = params + (index,)
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
    vjps = _parse_vjps(spec, outputs, inputs, params)
    _refuse_rowwise_options(spec, outputs, vjps)
    return Parsed(spec=spec, outputs=outputs, inputs=inputs, params=params, surrogates=surrogates, vjps=vjps)


def _refuse_rowwise_options(spec: Spec, outputs, vjps) -> None:
    """Refuse the options the row-wise planner (which also plans every --vjp module) does
    not implement, rather than write a module that silently ignores them."""
    if vjps and spec.grads:
        raise SymgradError("--grad cannot be combined with --vjp: write that input's whole gradient with --vjp too")
    if not any(reductions.is_rowwise(out.expr) for out in outputs):
        return
    for option, on in (("--grad", bool(spec.grads)), ("--inplace", spec.inplace)):
        if on:
            raise SymgradError(f"{option} does not apply to row-wise expressions (reductions along a dim, softmax, gather, chunk)")


# The upstream gradient's symbol in a --vjp expression.
GRAD_OUTPUT = sympy.Symbol("grad_output", real=True)


def _parse_vjps(spec: Spec, outputs, inputs, params) -> tuple[tuple[sympy.Symbol, sympy.Expr], ...]:
    """--vjp INPUT=EXPR: INPUT's whole gradient, written with ``grad_output``."""
    if not spec.vjps:
        return ()
    if len(outputs) != 1:
        raise SymgradError("--vjp needs a single output (its expression names the upstream gradient grad_output)")
    for option, on in (("--fuse", spec.fuse), ("--inplace", spec.inplace), ("--save speed", spec.save == "speed")):
        if on:
            raise SymgradError(f"--vjp cannot be combined with {option}")
    by_name = {s.name: s for s in inputs + params}
    grads = {name for name, _ in spec.grads}
    found = []
    for name, text in spec.vjps:
        if name not in by_name or by_name[name] not in inputs:
            raise SymgradError(f"--vjp {name}=...: {name!r} is not a differentiable input")
        if name in grads:
            raise SymgradError(f"--vjp {name}=... and --grad {name}=... both replace {name}'s gradient: give one")
        if [n for n, _ in spec.vjps].count(name) > 1:
            raise SymgradError(f"--vjp {name}=... is given twice")
        outputs_of_text = parse_outputs(text)
        if len(outputs_of_text) != 1 or outputs_of_text[0].reduction is not None:
            raise SymgradError(f"--vjp {name} must be a single expression, got {text!r}")
        expr = outputs_of_text[0].expr
        stray = sorted(s.name for s in expr.free_symbols if s.name not in by_name and s.name != GRAD_OUTPUT.name)
        if stray:
            raise SymgradError(f"--vjp {name}=...: {stray[0]!r} is not an input, a param or grad_output")
        expr = expr.xreplace({s: by_name.get(s.name, GRAD_OUTPUT) for s in expr.free_symbols})
        found.append((by_name[name], expr))
    return tuple(found)


def parse_outputs(text: str) -> tuple[Output, ...]:
    """Parse expression text into one or more outputs (a top-level tuple gives several)."""
    return _parse(text)[0]


def _parse(text: str) -> tuple[tuple[Output, ...], tuple[sympy.Symbol, ...]]:
    """The outputs, and every symbol the text names (even one that cancels, as in x - x)."""
    tree, lead = _syntax_tree(text)
    body = tree.body
    elements = body.elts if isinstance(body, ast.Tuple) else [body]
    if not elements:
        raise SymgradError("the expression is empty")
    if len(elements) > MAX_OUTPUTS:
        raise SymgradError(f"too many outputs ({len(elements)}; the limit is {MAX_OUTPUTS})")
    builder = _Builder(text, lead)
    outputs = tuple(builder.output(node) for node in elements)
    return outputs, tuple(sorted(builder.symbols.values(), key=lambda s: s.name))


def parse_elementwise(text: str, what: str) -> sympy.Expr:
    """Parse a single elementwise expression (no tuple, no reduction), e.g. a surrogate."""
    outputs = parse_outputs(text)
    if len(outputs) != 1 or outputs[0].reduction is not None:
        raise SymgradError(f"{what} must be a single elementwise expression, got {text!r}")
    return outputs[0].expr


def _syntax_tree(text: str) -> tuple[ast.Expression, int]:
    """The checked syntax tree of ``text`` and the number of leading blanks stripped."""
    if not isinstance(text, str):
        raise SymgradError(f"the expression must be text, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise SymgradError(f"the expression is {len(text)} characters long; the limit is {MAX_LENGTH}")
    if not text.strip():
        raise SymgradError("the expression is empty")
    lead = len(text) - len(text.lstrip())
    end = len(text.rstrip())
    for index, char in enumerate(text):
        if char in "\n\r":
            if lead < index < end:
                raise SymgradError(
                    f"invalid syntax at column {index + 1}: a line break; the expression must be a single line",
                    caret=_caret(text[:index], index + 1),
                )
        elif char != "\t" and unicodedata.category(char) in ("Cc", "Cs"):
            raise SymgradError(
                f"invalid syntax at column {index + 1}: invalid character U+{ord(char):04X}",
                caret=_caret(text, index + 1),
            )
    stripped = text.strip()
    try:
        tree = ast.parse(stripped, mode="eval")
    except SyntaxError as exc:
        # For text (not bytes) CPython reports character offsets, 1-based.
        column = min(max(exc.offset or 1, 1), len(stripped) + 1)
        column, reason = _explain_syntax_error(stripped, column, (exc.msg or "invalid syntax").strip())
        raise SymgradError(
            f"invalid syntax at column {column + lead}: {reason}", caret=_caret(text.rstrip(), column + lead)
        ) from None
    except (RecursionError, MemoryError):
        raise SymgradError(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)") from None
    _check_size(tree)
    return tree, lead


def _explain_syntax_error(text: str, column: int, reason: str) -> tuple[int, str]:
    """A clearer reason (and column) than CPython's bare "invalid syntax" where we can tell."""
    first = text.split(maxsplit=1)[0] if text.split() else ""
    char = text[column - 1] if column <= len(text) else ""
    if "invalid character" in reason or "non-printable" in reason:
        return column, f"{reason}; write operators in ASCII (names may use any Unicode letter)"
    if "nested parentheses" in reason:
        return column, f"{reason}; expressions may nest at most {MAX_DEPTH} levels"
    if reason != "invalid syntax":
        return column, reason
    if char == ";":
        return column, "';' starts a second statement; symgrad takes a single expression"
    if keyword.iskeyword(first) and first not in ("not", "lambda", "True", "False", "None", "await"):
        return 1, f"'{first}' statements are not allowed; symgrad takes a single expression"
    assignment = re.search(r"(?<![<>!=])=(?!=)", text)  # a lone "=", not == <= >= !=
    if assignment:
        return assignment.start() + 1, "assignment is not allowed; symgrad takes a single expression"
    try:
        ast.parse(text + " x", mode="eval")
    except SyntaxError:
        return column, "invalid syntax"
    return len(text) + 1, "the expression ends too early (an operand is missing)"


def _width(char: str) -> int:
    """Terminal columns a character takes: 0 for combining and format characters, 2 for wide ones."""
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _caret(text: str, column: int) -> str:
    """Two lines: the expression and a caret under ``column`` (1-based, in characters).

    The caret is placed by display width, so it stays under the right character after
    wide (full-width, CJK) and zero-width characters.
    """
    text = "".join(" " if c == "\t" or unicodedata.category(c) in ("Cc", "Cs") else c for c in text)
    if len(text) > 120:
        start = max(0, column - 60)
        text, column = text[start : start + 120], column - start
    pad = sum(_width(c) for c in text[: column - 1])
    return f"    {text}\n    {' ' * pad}^"


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

    def __init__(self, text: str, lead: int = 0) -> None:
        self._text = text.rstrip()
        self._stripped = text.strip()
        self._encoded = self._stripped.encode("utf-8")
        self._lead = lead
        self.symbols: dict[str, sympy.Symbol] = {}

    def column(self, node: ast.AST) -> int | None:
        """The 1-based character column of ``node`` in the user's text."""
        offset = getattr(node, "col_offset", None)
        if offset is None:
            return None
        # ast offsets count UTF-8 bytes; users count characters.
        return self._lead + len(self._encoded[:offset].decode("utf-8", "replace")) + 1

    def source(self, node: ast.AST, limit: int = 40) -> str:
        """The user's text of ``node``, shortened for a message."""
        segment = ast.get_source_segment(self._stripped, node) or "?"
        return segment if len(segment) <= limit else segment[: limit - 3] + "..."

    def fail(self, node: ast.AST, message: str) -> SymgradError:
        column = self.column(node)
        if column is None:
            return SymgradError(message)
        # One line (the CLI contract); only syntax errors carry a caret block.
        return SymgradError(f"{message} (at column {column})")

    def output(self, node: ast.AST) -> Output:
        whole = isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords
        if whole and isinstance(node.func, ast.Name) and node.func.id in REDUCTIONS:
            (arg,) = self._call_args(node, (1,))
            return Output(self._finite(self.expr(arg), node), node.func.id)
        return Output(self._finite(self.expr(node), node))

    def _finite(self, expr: sympy.Expr, node: ast.AST) -> sympy.Expr:
        if expr.has(sympy.I):
            raise self.fail(node, "the expression has a complex value (e.g. sqrt of a negative number)")
        for part in sympy.preorder_traversal(expr):
            root = isinstance(part, sympy.Pow) and part.exp.is_number and part.exp.is_integer is False
            if (isinstance(part, sympy.log) or root) and part.args[0].is_nonpositive and not part.args[0].is_zero:
                # Complex for every input (but where the base is 0), which SymPy keeps symbolic:
                # log(-exp(x)) is x + I*pi, and printing (-x**2)**(1/2 + E)**3 splits off the
                # complex constant (-1)**(1/2 + E)**3. Refused here, before simplify's cancel()
                # runs for minutes on it.
                raise self.fail(node, f"{part} is complex for every input: its argument is never positive")
        if expr.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
            raise self.fail(node, "the expression has an infinite or undefined constant (e.g. 1/0 or log(0))")
        # (A Symbol is also a sympy Boolean, so test for the logical kinds themselves.)
        logical = (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanAtom, sympy.logic.boolalg.BooleanFunction)
        if not isinstance(expr, sympy.Expr) or isinstance(expr, logical):
            raise self.fail(node, "an output must be a number-valued expression")
        return expr

    def expr(self, node: ast.AST) -> sympy.Expr:
        """The SymPy expression of ``node``; every constant subexpression is checked as it is built."""
        value = self._expr(node)
        if isinstance(value, sympy.Expr):
            if not value.free_symbols:
                self._check_constant(node, value)
                if value.has(sympy.Float) and not value.is_Float:
                    # Arithmetic on a float literal is float64 arithmetic: log(0.5, 1/2) is the
                    # float 1.0, not 1 + 3e-17, whose derivative's exponent 3e-17 would make
                    # a negative base NaN.
                    value = sympy.Float(float(value.evalf(17)))
            elif value.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
                # e.g. log of a 0/1 indicator: Piecewise((0, x > 1), (zoo, True))
                raise self.fail(node, f"{self.source(node)} is infinite or undefined for some inputs")
        return value

    def _check_constant(self, node: ast.AST, value: sympy.Expr) -> None:
        """A constant must be real, finite and within float64's range.

        The check evaluates in bounded precision (mpmath under ``evalf``), never exactly,
        so ``exp(10**20)`` is refused at once instead of hanging later stages.
        """
        if value.is_Integer or value.is_Rational:
            magnitude = abs(value)
            if magnitude > MAX_CONSTANT or (magnitude != 0 and magnitude < MIN_CONSTANT):
                raise self._range_error(node, value)
            return
        if value.has(sympy.zoo, sympy.oo, -sympy.oo, sympy.nan):
            raise self.fail(node, f"the constant {self.source(node)} is infinite or undefined (like 1/0 or log(0))")
        try:
            approx = value.evalf(17, maxn=200)
            real, imag = approx.as_real_imag()
            real, imag = sympy.Float(real, 17), sympy.Float(imag, 17)
        except (TypeError, ValueError, ArithmeticError, RecursionError, AttributeError):
            raise self.fail(node, f"the constant {self.source(node)} cannot be evaluated") from None
        if not (real.is_finite and imag.is_finite):
            # a pole that SymPy does not fold to zoo: digamma(-2) evaluates to nan
            raise self.fail(node, f"the constant {self.source(node)} is infinite or undefined (like 1/0 or log(0))")
        # (abs: a Float 0.0 is != 0 in SymPy 1.14)
        if abs(imag) > 0 and (abs(imag) > 1e-12 * max(abs(real), 1) or self._complex_at_higher_precision(value, imag)):
            raise self.fail(
                node, f"the constant {self.source(node)} is complex; symgrad works over the real numbers"
            )
        if not real.is_finite or abs(real) > MAX_CONSTANT or (real != 0 and abs(real) < MIN_CONSTANT):
            raise self._range_error(node, real)

    @staticmethod
    def _complex_at_higher_precision(value: sympy.Expr, imag: sympy.Float) -> bool:
        """Whether a tiny imaginary part is the value's own, not rounding noise: noise shrinks
        as the precision grows, a true one stays. (-1e-3)**(pi + 2.5) is 5e-18 - 1.1e-17*I,
        which passed as real and then failed to convert."""
        try:
            precise = sympy.Float(sympy.im(value.evalf(40, maxn=400)), 40)
        except (TypeError, ValueError, ArithmeticError, RecursionError, AttributeError):
            return False
        return abs(precise - imag) <= 1e-6 * abs(imag)

    def _range_error(self, node: ast.AST, value: sympy.Expr) -> SymgradError:
        size = "too large" if abs(value) > 1 else "too small (it would round to 0 in float64)"
        return self.fail(
            node,
            f"the constant {self.source(node)} is {size}: constants must lie within"
            f" {MIN_CONSTANT:g} <= |c| <= {MAX_CONSTANT:g}",
        )

    def _expr(self, node: ast.AST) -> sympy.Expr:
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
            if isinstance(node.op, ast.Invert):
                raise self.fail(node, f"the ~ operator is only allowed inside a {_CONDITION_PLACES}, e.g. ~(a > b)")
            raise self.fail(node, f"{_REFUSED_OPERATORS.get(type(node.op), 'this operator')} is not supported")
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Compare):
            # A bare comparison is the 0/1 indicator of its condition.
            return self._build_piecewise(node, [(sympy.Integer(1), self.condition(node)), (sympy.Integer(0), sympy.true)])
        if isinstance(node, ast.Tuple):
            raise self.fail(node, "a tuple is only allowed at the top level (several outputs) or inside Piecewise")
        if isinstance(node, ast.BoolOp):
            raise self.fail(node, "'and'/'or' are only allowed inside a Piecewise condition")
        what = _REFUSED_NODES.get(type(node), f"{type(node).__name__} is not allowed")
        raise self.fail(node, f"{what} ({_SUPPORTED})")

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
                raise self.fail(node, f"the float literal {self.source(node)} is not finite (above float64's range)")
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
        if name in FUNCTIONS and not hasattr(builtins, name):
            # (A Python builtin such as sum or abs may name a symbol: issue 2, section 5.)
            raise self.fail(node, f"{name!r} is a function: call it, e.g. {name}(x)")
        if name.startswith("__"):
            raise self.fail(node, f"names starting with '__' are not allowed ({name!r})")
        if name not in self.symbols:
            self.symbols[name] = sympy.Symbol(name, real=True)
        return self.symbols[name]

    def _binary(self, node: ast.BinOp) -> sympy.Expr:
        if type(node.op) in _LOGIC_OPERATORS:
            join = _LOGIC_TEXT[type(node.op)]
            raise self.fail(
                node,
                f"the {join} operator is only allowed between comparisons inside a {_CONDITION_PLACES},"
                f" e.g. (a > b) {join} (c < d)",
            )
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
                    raise self.fail(
                        node,
                        f"the constant {self.source(node)} is too large: constants must lie within"
                        f" {MIN_CONSTANT:g} <= |c| <= {MAX_CONSTANT:g}",
                    )
            elif abs(int(exponent)) > MAX_EXPONENT:
                raise self._exponent_error(node)
        elif exponent.is_number and exponent.is_Rational:
            if abs(exponent) > MAX_EXPONENT:
                raise self._exponent_error(node)
        elif exponent.is_Float and abs(exponent) > MAX_EXPONENT:
            raise self._exponent_error(node)
        if base == 0 and exponent.is_number and exponent.is_negative:
            raise self.fail(node, "division by zero (0 to a negative power)")
        if not base.free_symbols and exponent.free_symbols and base.is_negative:
            raise self.fail(
                node, f"{self.source(node)} is complex for most values: a negative constant to a variable power"
            )
        return sympy.Pow(base, exponent)

    def _exponent_error(self, node: ast.AST) -> SymgradError:
        return self.fail(node, f"the exponent in {self.source(node)} is too large (the limit is |n| <= {MAX_EXPONENT})")

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
            if name.startswith("__"):
                raise self.fail(node, f"names starting with '__' are not allowed ({name!r})")
            close = difflib.get_close_matches(name, sorted(FUNCTIONS), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            if name in _UNKNOWN_HINTS:
                hint = f"; {_UNKNOWN_HINTS[name]}"
            raise self.fail(node, f"unknown function {name!r}{hint} (symgrad --list-functions shows all)")
        args = self._call_args(node, entry.arity)
        if name in ROW_FUNCTIONS:
            return self._row_function(node, name, args)
        if name == "Piecewise":
            return self._piecewise(node, args)
        if name == "where":
            condition = self.condition(args[0])
            value, otherwise = self.expr(args[1]), self.expr(args[2])
            return self._build_piecewise(node, [(value, condition), (otherwise, sympy.true)])
        values = [self.expr(arg) for arg in args]
        if name == "log" and len(values) == 2:
            base = values[1]
            if not base.free_symbols and (base.is_positive is False or base == 1):
                raise self.fail(args[1], f"the base of log(x, b) must be positive and not 1, got {self.source(args[1])}")
        if name in _EXACT_AT_INTEGERS and not values[0].free_symbols:
            argument = values[0].evalf(17)
            if argument.is_real and abs(argument) > MAX_EXACT_SPECIAL:
                # Exact evaluation would not finish: evaluate numerically (checked by expr()).
                try:
                    with mpmath.workprec(64):
                        value = getattr(mpmath, name)(argument._to_mpmath(64))
                except (ValueError, ZeroDivisionError, ArithmeticError):
                    value = mpmath.nan  # a pole
                if isinstance(value, mpmath.mpc):
                    raise self.fail(node, f"the constant {self.source(node)} is complex; symgrad works over the real numbers")
                return sympy.Float(value, 17) if mpmath.isfinite(value) else sympy.nan
        try:
            return entry.build(*values)
        except (ValueError, TypeError, ArithmeticError) as exc:
            # e.g. SymPy's Max/Min refuse arguments they cannot compare
            raise self.fail(node, f"cannot build {self.source(node)}: {exc}") from None
        except RecursionError:
            # Comparing arguments can recurse without end in SymPy, as folding Piecewise
            # conditions does (_build_piecewise)
            raise self.fail(node, f"cannot build {self.source(node)}: SymPy recursed without end") from None

    def _row_function(self, node: ast.Call, name: str, args: list[ast.AST]) -> sympy.Expr:
        """A row-wise function (symgrad.math.reductions): its dim is a literal int or tuple of ints."""
        operand = self.expr(args[0])
        if name == "gather":
            if not isinstance(args[1], ast.Name) or args[1].id in CONSTANTS or args[1].id in FUNCTIONS:
                raise self.fail(args[1], "gather(e, t) needs t, the integer class-index tensor, by its name")
            index = self._name(args[1])
            return reductions.Gather(operand, index)
        if name == "chunk":
            return self._chunk(node, operand, args)
        dims = self._dims(args[1], name) if len(args) == 2 else reductions.WHOLE
        if name in ("softmax", "log_softmax") and len(dims) != 1:
            raise self.fail(args[1], f"{name}(e, dim) takes one dim, got {self.source(args[1])}")
        kind = {
            "sum": reductions.ReduceSum,
            "mean": reductions.ReduceMean,
            "amax": reductions.ReduceMax,
            "amin": reductions.ReduceMin,
            "logsumexp": reductions.LogSumExp,
            "norm": reductions.Norm,
            "softmax": reductions.Softmax,
            "log_softmax": reductions.LogSoftmax,
        }[name]
        if not operand.free_symbols:
            raise self.fail(node, f"{name}() of a constant has no shape to reduce; write the constant")
        return kind(operand, dims)

    def _chunk(self, node: ast.Call, operand: sympy.Expr, args: list[ast.AST]) -> sympy.Expr:
        """chunk(x, n, i): the i-th of n equal chunks of the input x along its last dim."""
        if not isinstance(operand, sympy.Symbol):
            raise self.fail(args[0], "chunk(x, n, i) cuts an input: its first argument must be a name")
        count, index = (self._literal_int(arg, "chunk") for arg in args[1:])
        if count < 1:
            raise self.fail(args[1], f"chunk(x, n, i) needs n >= 1, got {count}")
        if not 0 <= index < count:
            raise self.fail(args[2], f"chunk(x, {count}, i) needs 0 <= i < {count}, got {index}")
        return reductions.Chunk(operand, sympy.Integer(count), sympy.Integer(index))

    def _literal_int(self, node: ast.AST, name: str) -> int:
        value, sign = node, 1
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
            value, sign = value.operand, -1
        if not (isinstance(value, ast.Constant) and type(value.value) is int):
            raise self.fail(node, f"{name}() takes a literal int here, got {self.source(node)}")
        if abs(value.value) > 2**16:
            raise self.fail(node, f"{name}() takes at most {2**16} chunks")
        return sign * value.value

    def _dims(self, node: ast.AST, name: str) -> sympy.Tuple:
        """A dim argument: an int literal (negative counts from the end) or a tuple of them."""
        elements = node.elts if isinstance(node, ast.Tuple) else [node]
        dims = []
        for element in elements:
            value = element
            sign = 1
            if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
                sign = -1 if isinstance(value.op, ast.USub) else 1
                value = value.operand
            if not (isinstance(value, ast.Constant) and type(value.value) is int):
                raise self.fail(node, f"the dim of {name}() must be an int or a tuple of ints, got {self.source(node)}")
            dims.append(sign * value.value)
        if not dims:
            raise self.fail(node, f"the dim of {name}() is an empty tuple; write {name}(e) for the whole tensor")
        if len(set(dims)) != len(dims):
            raise self.fail(node, f"{name}() names a dim twice: {self.source(node)}")
        if any(abs(d) > 64 for d in dims):
            raise self.fail(node, f"the dim of {name}() is out of range for any tensor (at most 64 dims): {self.source(node)}")
        if any(d < 0 for d in dims) and any(d >= 0 for d in dims):
            raise self.fail(node, f"{name}() mixes negative and non-negative dims; count them one way: {self.source(node)}")
        return reductions.dims_tuple(tuple(sorted(dims)))

    def _piecewise(self, node: ast.Call, args: list[ast.AST]) -> sympy.Expr:
        pairs = []
        for arg in args:
            if not (isinstance(arg, ast.Tuple) and len(arg.elts) == 2):
                raise self.fail(arg, "each Piecewise argument must be a pair (value, condition)")
            pairs.append((self.expr(arg.elts[0]), self.condition(arg.elts[1])))
        if pairs[-1][1] is not sympy.true:
            raise self.fail(node, "Piecewise needs a final (value, True) branch, so it is defined everywhere")
        return self._build_piecewise(node, pairs)

    def _build_piecewise(self, node: ast.AST, pairs: list) -> sympy.Expr:
        try:
            budget = [MAX_CONDITION_COMPARISONS]
            pairs = [(value, _without_piecewise(condition, budget)) for value, condition in pairs]
            undefined = _undefined_comparison([condition for _, condition in pairs])
            if undefined is None:
                return sympy.Piecewise(*pairs)
        except _ConditionTooLarge:
            raise self.fail(
                node,
                f"a condition in {self.source(node)} compares Piecewise values with more than "
                f"{MAX_CONDITION_COMPARISONS} branch combinations",
            ) from None
        except (TypeError, ValueError) as exc:
            # Expanding (or SymPy folding) a condition may compare with a value such as zoo
            raise self.fail(node, f"cannot build {self.source(node)}: {exc}") from None
        except RecursionError:
            # SymPy 1.14 recurses without end folding some conditions, e.g.
            # (z - y <= 10) & (z - E <= z - y)
            raise self.fail(
                node, f"cannot build {self.source(node)}: SymPy recursed without end on its conditions"
            ) from None
        # SymPy 1.14 folding such a condition into the Piecewise ran for minutes:
        # (1 >= gamma(zoo)) & (x >= 3), from 1 >= gamma(gamma(x < 3)).
        raise self.fail(
            node,
            f"cannot build {self.source(node)}: on one of its branches a condition compares an"
            f" undefined value ({undefined})",
        )

    def condition(self, node: ast.AST) -> sympy.logic.boolalg.Boolean:
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return sympy.true if node.value else sympy.false
        if isinstance(node, ast.Compare):
            self._check_logic_precedence(node)
            terms = [self.expr(node.left)] + [self.expr(c) for c in node.comparators]
            parts = []
            for op, left, right in zip(node.ops, terms, terms[1:]):
                if type(op) not in _COMPARE:
                    raise self.fail(node, "only <, <=, >, >=, == and != comparisons are allowed")
                try:
                    parts.append(_COMPARE[type(op)](left, right))
                except TypeError as exc:  # SymPy refuses to compare a complex or undefined value
                    raise self.fail(node, f"cannot compare in {self.source(node)}: {exc}") from None
            return sympy.And(*parts)
        if isinstance(node, ast.BoolOp):
            combine = sympy.And if isinstance(node.op, ast.And) else sympy.Or
            return combine(*(self.condition(v) for v in node.values))
        if isinstance(node, ast.BinOp) and type(node.op) in _LOGIC_OPERATORS:
            return _LOGIC_OPERATORS[type(node.op)](self.condition(node.left), self.condition(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.Invert)):
            return sympy.Not(self.condition(node.operand))
        raise self.fail(
            node, "a Piecewise condition must be a comparison, and/or/not (&, |, ~) of comparisons, or True"
            " (so must where's first argument)"
        )

    def _check_logic_precedence(self, node: ast.Compare) -> None:
        """Refuses ``x > 0 & x < 1``: & and | bind tighter than comparisons, so Python reads it
        as the chain ``x > (0 & x) < 1``, never what was meant; suggests the parentheses."""
        operands = [node.left, *node.comparators]
        if not any(isinstance(o, ast.BinOp) and type(o.op) in _LOGIC_OPERATORS for o in operands):
            return
        # Split each operand at its &/| and re-join the pieces around the comparisons.
        pieces, joins = _split_logic(node.left)
        groups, current = pieces[:-1], [pieces[-1]]
        for op, operand in zip(node.ops, node.comparators):
            pieces, between = _split_logic(operand)
            current.append(f"{_COMPARE_TEXT.get(type(op), '?')} {pieces[0]}")
            for join, piece in zip(between, pieces[1:]):
                groups.append(" ".join(current))
                joins.append(join)
                current = [piece]
        groups.append(" ".join(current))
        suggestion = " ".join(
            [f"({groups[0]})"] + [f"{join} ({group})" for join, group in zip(joins, groups[1:])]
        )
        raise self.fail(
            node,
            f"& and | bind tighter than comparisons, so {self.source(node)} compares the result of & or |"
            f" (x > 0 & x < 1 is x > (0 & x) < 1); put each comparison in parentheses: {suggestion}",
        )


def _split_logic(node: ast.AST) -> tuple[list[str], list[str]]:
    """The operands of a chain of & and | (as source text) and the operators between them."""
    if isinstance(node, ast.BinOp) and type(node.op) in _LOGIC_OPERATORS:
        left, left_joins = _split_logic(node.left)
        right, right_joins = _split_logic(node.right)
        return left + right, left_joins + [_LOGIC_TEXT[type(node.op)]] + right_joins
    return [ast.unparse(node)], []


class _ConditionTooLarge(Exception):
    pass


def _undefined_comparison(conditions: list[sympy.logic.boolalg.Boolean]) -> sympy.Basic | None:
    """The first comparison in ``conditions`` with an undefined value (zoo, nan) in it."""
    for condition in conditions:
        for comparison in sorted(condition.atoms(sympy.core.relational.Relational), key=sympy.default_sort_key):
            if comparison.has(sympy.zoo, sympy.nan):
                return comparison
    return None


def _without_piecewise(condition: sympy.logic.boolalg.Boolean, budget: list[int]) -> sympy.logic.boolalg.Boolean:
    """``condition`` with every Piecewise value in it expanded into and/or of its branches.

    ``Piecewise((a, c), (b, True)) > t`` becomes ``(c & (a > t)) | (~c & (b > t))``.
    SymPy folds a condition holding a Piecewise itself when it builds the pair, and its
    fold simplifies the resulting ITE with ``simplify_logic``, which tests relationals for
    equality at random points: on some hash seeds a power of random rationals ran for
    minutes. The expansion is plain boolean logic, so it costs only
    its size, which ``budget`` (comparisons left to build) bounds.
    """
    if not condition.has(sympy.Piecewise):
        return condition
    if not isinstance(condition, sympy.core.relational.Relational):
        return condition.func(*(_without_piecewise(arg, budget) for arg in condition.args))
    # The innermost Piecewise first: its values hold no Piecewise, and its conditions,
    # built through this function too, hold none either (any that SymPy made are expanded).
    innermost = min(
        (p for p in condition.atoms(sympy.Piecewise) if not any(v.has(sympy.Piecewise) for v, _ in p.args)),
        key=sympy.default_sort_key,
    )
    branches = []
    earlier: list[sympy.logic.boolalg.Boolean] = []
    for value, branch_condition in innermost.args:
        budget[0] -= 1
        if budget[0] < 0:
            raise _ConditionTooLarge
        branch_condition = _without_piecewise(branch_condition, budget)
        compared = _without_piecewise(condition.xreplace({innermost: value}), budget)
        branches.append(sympy.And(branch_condition, *(sympy.Not(c) for c in earlier), compared))
        earlier.append(branch_condition)
    return sympy.Or(*branches)


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
