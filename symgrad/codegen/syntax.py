"""Python expressions as syntax trees: what the printer builds, and what the plan's passes read.

A tree is made of the standard :mod:`ast` expression nodes, plus one marker,
:class:`Parenthesized`, for parentheses the code shows on purpose (an operand kept whole,
``0.5 * (torch.sign(x) + 1)``, or a chain the buffer-reuse rewrite wrote). Passes decide on
trees, never on printed text:

- :func:`source` prints a tree: a :class:`Parenthesized` node with its parentheses, any other
  node with parentheses only where Python's precedence needs them;
- :func:`plain` gives the tree without markers, exactly what :func:`ast.parse` of its source
  gives (so a negative number literal becomes a negation of a positive one). Counting
  operations and the buffer reuse run on it.

The builders below (:func:`name`, :func:`number`, :func:`call`, ...) keep the plan's code
short to write and to read.
"""

from __future__ import annotations

import ast
import math
from typing import Union

__all__ = [
    "Code",
    "NONE",
    "Parenthesized",
    "attribute",
    "binop",
    "call",
    "compare",
    "dotted",
    "dotted_name",
    "first_present",
    "generator",
    "if_else",
    "is_negative_number",
    "joined",
    "keyword",
    "method",
    "name",
    "negate",
    "number",
    "parens",
    "plain",
    "source",
    "starred",
    "string",
    "subscript",
    "tuple_of",
    "unary",
    "where",
    "without_leading_minus",
]


class Parenthesized(ast.expr):
    """Parentheses printed around ``value`` even where Python's precedence does not need them."""

    _fields = ("value",)


# A piece of code: an expression tree (an ast.expr, possibly with Parenthesized markers).
Code = ast.expr
Operand = Union[ast.expr, str, int, float, None]

_BINARY = {
    "+": ast.Add,
    "-": ast.Sub,
    "*": ast.Mult,
    "/": ast.Div,
    "//": ast.FloorDiv,
    "%": ast.Mod,
    "**": ast.Pow,
    "&": ast.BitAnd,
    "|": ast.BitOr,
    "^": ast.BitXor,
    "@": ast.MatMult,
}
_UNARY = {"-": ast.USub, "+": ast.UAdd, "~": ast.Invert, "not": ast.Not}
_COMPARE = {
    "==": ast.Eq,
    "!=": ast.NotEq,
    "<": ast.Lt,
    "<=": ast.LtE,
    ">": ast.Gt,
    ">=": ast.GtE,
    "is": ast.Is,
    "is not": ast.IsNot,
}
_SYMBOL = {kind: symbol for table in (_BINARY, _UNARY, _COMPARE) for symbol, kind in table.items()}

# Python's precedence levels, lowest first (as in the grammar; ast's unparser has the same).
_TUPLE, _TEST, _OR, _AND, _NOT, _CMP, _BOR, _BXOR, _BAND, _SHIFT, _ARITH, _TERM, _FACTOR, _POWER, _ATOM = range(1, 16)
_BINARY_LEVEL = {
    ast.BitOr: _BOR,
    ast.BitXor: _BXOR,
    ast.BitAnd: _BAND,
    ast.LShift: _SHIFT,
    ast.RShift: _SHIFT,
    ast.Add: _ARITH,
    ast.Sub: _ARITH,
    ast.Mult: _TERM,
    ast.Div: _TERM,
    ast.FloorDiv: _TERM,
    ast.Mod: _TERM,
    ast.MatMult: _TERM,
    ast.Pow: _POWER,
}


# -- builders ---------------------------------------------------------------------------


def _expr(value: Operand) -> ast.expr:
    """A builder's operand: a tree as it is, a string as a (dotted) name, a number (or None)
    as a literal."""
    if isinstance(value, ast.expr):
        return value
    if isinstance(value, str):
        return dotted(value)
    return ast.Constant(value)


def name(identifier: str) -> ast.Name:
    return ast.Name(identifier, ast.Load())


def dotted(path: str) -> ast.expr:
    """``torch.special.erf`` as a name and its attributes."""
    first, *rest = path.split(".")
    node: ast.expr = name(first)
    for part in rest:
        node = ast.Attribute(node, part, ast.Load())
    return node


def attribute(value: Operand, attr: str) -> ast.Attribute:
    return ast.Attribute(_expr(value), attr, ast.Load())


def number(value: int | float) -> ast.Constant:
    """A number literal; a negative one prints with its sign (see :func:`plain`)."""
    return ast.Constant(value)


def string(text: str) -> ast.Constant:
    return ast.Constant(text)


NONE = ast.Constant(None)


def subscript(value: Operand, index: Operand) -> ast.Subscript:
    """``value[index]``."""
    return ast.Subscript(_expr(value), _expr(index), ast.Load())


def if_else(test: Operand, body: Operand, orelse: Operand) -> ast.IfExp:
    """``body if test else orelse``."""
    return ast.IfExp(_expr(test), _expr(body), _expr(orelse))


def generator(element: Operand, variable: str, iterable: Operand, condition: Operand | None = None) -> ast.GeneratorExp:
    """``(element for variable in iterable if condition)``."""
    ifs = [] if condition is None else [_expr(condition)]
    loop = ast.comprehension(ast.Name(variable, ast.Store()), _expr(iterable), ifs, 0)
    return ast.GeneratorExp(_expr(element), [loop])


def first_present(variable: str, values: Operand) -> ast.Call:
    """``next(variable for variable in values if variable is not None)``."""
    return call("next", generator(variable, variable, values, compare(variable, "is not", None)))


def keyword(arg: str | None, value: Operand) -> ast.keyword:
    return ast.keyword(arg, _expr(value))


def call(function: Operand, *args: Operand, **keywords: Operand) -> ast.Call:
    """``function(*args, **keywords)``; ``function`` a tree or a dotted name."""
    return ast.Call(_expr(function), [_expr(a) for a in args], [keyword(k, v) for k, v in keywords.items()])


def method(receiver: Operand, method_name: str, *args: Operand, **keywords: Operand) -> ast.Call:
    """``receiver.method_name(*args, **keywords)``."""
    return call(attribute(receiver, method_name), *args, **keywords)


def binop(left: Operand, op: str, right: Operand) -> ast.BinOp:
    return ast.BinOp(_expr(left), _BINARY[op](), _expr(right))


def unary(op: str, operand: Operand) -> ast.UnaryOp:
    return ast.UnaryOp(_UNARY[op](), _expr(operand))


def compare(left: Operand, op: str, right: Operand) -> ast.Compare:
    return ast.Compare(_expr(left), [_COMPARE[op]()], [_expr(right)])


def where(condition: Operand, then: Operand, otherwise: Operand) -> ast.Call:
    return call("torch.where", condition, then, otherwise)


def parens(node: Operand) -> Parenthesized:
    return Parenthesized(_expr(node))


def tuple_of(*elements: Operand) -> ast.Tuple:
    return ast.Tuple([_expr(e) for e in elements], ast.Load())


def starred(value: Operand) -> ast.Starred:
    return ast.Starred(_expr(value), ast.Load())


def joined(left: Operand, op: str, right: Operand) -> ast.expr:
    """The tree Python's parser gives ``source(left) + f" {op} " + source(right)``: where
    ``right`` prints without parentheses at this precedence or below, ``left`` joins its
    leftmost operand (``g * 3 * x ** 2`` is ``(g * 3) * x ** 2``), and likewise on the left
    side. Code written as ``grad * factor`` reads so, and multiplies in that order."""
    left, right = _expr(left), _expr(right)
    level = _BINARY_LEVEL[_BINARY[op]]
    if op != "**" and isinstance(right, ast.BinOp) and _BINARY_LEVEL[type(right.op)] <= level and _shows_left(right):
        return ast.BinOp(joined(left, op, right.left), right.op, right.right)
    if isinstance(left, ast.BinOp) and _BINARY_LEVEL[type(left.op)] < level:
        return ast.BinOp(left.left, left.op, joined(left.right, op, right))
    return binop(left, op, right)


def dotted_name(node: ast.AST) -> str | None:
    """The dotted name ``node`` is, ``torch.special.erf`` (a name and its attributes); else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = dotted_name(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def is_negative_number(node: ast.AST) -> bool:
    """Whether ``node`` is a number literal that prints with a minus sign (``-0.5``, ``-0.0``)."""
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return False
    value = node.value
    return isinstance(value, (int, float)) and (value < 0 or (value == 0 and math.copysign(1.0, value) < 0))


def negate(node: ast.expr) -> ast.expr:
    """The tree of ``"-" + source(node)``: the minus binds to ``node``'s leftmost operand at
    its precedence (``-`` before ``a * b`` negates ``a``; before ``x ** 2``, the power)."""
    if isinstance(node, ast.BinOp) and _BINARY_LEVEL[type(node.op)] < _FACTOR and _shows_left(node):
        return ast.BinOp(negate(node.left), node.op, node.right)
    if isinstance(node, ast.Compare) and _shows_left(node):
        return ast.Compare(negate(node.left), node.ops, node.comparators)
    return unary("-", node)


def without_leading_minus(node: ast.expr) -> ast.expr | None:
    """The tree of ``source(node)[1:]`` where ``source(node)`` starts with a minus; else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return node.operand
    if is_negative_number(node):
        return number(-node.value)
    if isinstance(node, (ast.BinOp, ast.Compare)) and _shows_left(node):
        left = without_leading_minus(node.left)
        if left is None:
            return None
        if isinstance(node, ast.BinOp):
            return ast.BinOp(left, node.op, node.right)
        return ast.Compare(left, node.ops, node.comparators)
    return None


def _shows_left(node: ast.BinOp | ast.Compare) -> bool:
    """Whether ``source(node)`` starts with its left operand's source (not a parenthesis)."""
    if isinstance(node, ast.Compare):
        return _level(node.left) >= _CMP + 1
    if isinstance(node.op, ast.Pow):
        return _level(node.left) >= _POWER + 1
    return _level(node.left) >= _BINARY_LEVEL[type(node.op)]


# -- printing ---------------------------------------------------------------------------


def source(node: ast.AST) -> str:
    """``node`` as Python source: :class:`Parenthesized` nodes with their parentheses, any
    other node with parentheses only where precedence needs them. A tuple at the top prints
    without parentheses, as a return statement writes it."""
    if isinstance(node, ast.Tuple) and node.elts:
        return _tuple_text(node)
    return _text(node, _TEST)


def _level(node: ast.AST) -> int:
    if isinstance(node, ast.BinOp):
        return _BINARY_LEVEL[type(node.op)]
    if isinstance(node, ast.UnaryOp):
        return _NOT if isinstance(node.op, ast.Not) else _FACTOR
    if isinstance(node, ast.Compare):
        return _CMP
    if isinstance(node, ast.BoolOp):
        return _AND if isinstance(node.op, ast.And) else _OR
    if isinstance(node, ast.IfExp):
        return _TEST
    if isinstance(node, ast.Tuple):
        return _TUPLE if node.elts else _ATOM
    if is_negative_number(node):
        return _FACTOR
    return _ATOM


def _text(node: ast.AST, needed: int) -> str:
    """``node``'s source where its context needs at least precedence ``needed``."""
    text = _bare(node)
    return f"({text})" if _level(node) < needed else text


def _tuple_text(node: ast.Tuple) -> str:
    items = [_text(e, _TEST) for e in node.elts]
    return items[0] + "," if len(items) == 1 else ", ".join(items)


def _bare(node: ast.AST) -> str:
    if isinstance(node, Parenthesized):
        return f"({_text(node.value, _TUPLE)})"
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return '"' + node.value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if node.value is Ellipsis:
            return "..."
        return repr(node.value)
    if isinstance(node, ast.Attribute):
        return f"{_text(node.value, _ATOM)}.{node.attr}"
    if isinstance(node, ast.Call):
        if len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.GeneratorExp):
            return f"{_text(node.func, _ATOM)}({_generator(node.args[0])})"  # (its own parentheses)
        args = [_text(a, _TEST) for a in node.args]
        args += [f"{k.arg}={_text(k.value, _TEST)}" if k.arg else f"**{_text(k.value, _ATOM)}" for k in node.keywords]
        return f"{_text(node.func, _ATOM)}({', '.join(args)})"
    if isinstance(node, ast.Starred):
        return "*" + _text(node.value, _BOR)
    if isinstance(node, ast.Subscript):
        index = node.slice
        if isinstance(index, ast.Tuple) and index.elts:  # (x[..., 0, :]: slices among the elements)
            inside = ", ".join(_bare_slice(e) for e in index.elts) + ("," if len(index.elts) == 1 else "")
        else:
            inside = _bare_slice(index)
        return f"{_text(node.value, _ATOM)}[{inside}]"
    if isinstance(node, ast.BinOp):
        level = _BINARY_LEVEL[type(node.op)]
        if isinstance(node.op, ast.Pow):
            # Right-associative. A negative number exponent prints bare, x ** -2.0 (as the
            # printer and black write it); any other negation in parentheses, x ** (-y).
            left = _text(node.left, _POWER + 1)
            right = _text(node.right, _FACTOR if _is_number_negation(node.right) else _POWER)
        else:
            left, right = _text(node.left, level), _text(node.right, level + 1)
        return f"{left} {_SYMBOL[type(node.op)]} {right}"
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            return f"not {_text(node.operand, _NOT)}"
        return _SYMBOL[type(node.op)] + _text(node.operand, _FACTOR)
    if isinstance(node, ast.Compare):
        parts = [_text(node.left, _CMP + 1)]
        for op, right in zip(node.ops, node.comparators):
            parts += [_SYMBOL[type(op)], _text(right, _CMP + 1)]
        return " ".join(parts)
    if isinstance(node, ast.BoolOp):
        level = _level(node)
        word = " and " if isinstance(node.op, ast.And) else " or "
        return word.join(_text(v, level + 1) for v in node.values)
    if isinstance(node, ast.IfExp):
        return f"{_text(node.body, _TEST + 1)} if {_text(node.test, _TEST + 1)} else {_text(node.orelse, _TEST)}"
    if isinstance(node, ast.Tuple):
        return _tuple_text(node) if node.elts else "()"  # (_text parenthesises it by its level)
    if isinstance(node, ast.GeneratorExp):
        return f"({_generator(node)})"
    raise TypeError(f"syntax.source cannot print {type(node).__name__}")


def _is_number_negation(node: ast.AST) -> bool:
    """A negative number literal, or the negation of a number literal."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)
    return is_negative_number(node)


def _generator(node: ast.GeneratorExp) -> str:
    parts = [_text(node.elt, _TEST)]
    for loop in node.generators:
        parts.append(f"for {_text(loop.target, _TUPLE)} in {_text(loop.iter, _TEST + 1)}")
        parts += [f"if {_text(test, _TEST + 1)}" for test in loop.ifs]
    return " ".join(parts)


def _bare_slice(node: ast.AST) -> str:
    if isinstance(node, ast.Slice):
        lower = _text(node.lower, _TEST) if node.lower else ""
        upper = _text(node.upper, _TEST) if node.upper else ""
        return f"{lower}:{upper}" + (f":{_text(node.step, _TEST)}" if node.step else "")
    return _text(node, _TEST)


# -- the tree the parser would give -----------------------------------------------------


def plain(node: ast.AST) -> ast.AST:
    """``node`` without markers: what ``ast.parse(source(node))`` gives (a negative number
    literal as the negation of a positive one). A new tree, every node its own (a builder
    may use one subtree twice; the parser never does, and the passes change nodes in place)."""
    if isinstance(node, Parenthesized):
        return plain(node.value)
    if is_negative_number(node):
        return ast.UnaryOp(ast.USub(), ast.Constant(-node.value))
    fresh = type(node)()
    for field, value in ast.iter_fields(node):
        if isinstance(value, ast.AST):
            value = plain(value)
        elif isinstance(value, list):
            value = [plain(item) if isinstance(item, ast.AST) else item for item in value]
        setattr(fresh, field, value)
    return fresh
