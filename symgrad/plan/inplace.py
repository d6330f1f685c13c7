"""Eager bodies reuse the buffers of their own temporaries, ``(a * b).mul_(c)``, and add a
sum's product and quotient terms with one kernel each, ``a.addcmul(l, r, value=c)``
(:meth:`_Rewriter.multiply_add`).

On CPU an out-of-place elementwise op writes a buffer that is not in cache, so each line
of it is first read from memory (write-allocate) and then written back, and with glibc's
default allocator a new 40 MB buffer is also page-faulted in; an in-place op on a buffer
it has just read pays neither. Measured with benchmarks/ab.py at 1e7 float32, expressions
with chains of arithmetic ran 4-15% faster (up to 2x with glibc's default allocator).
Eager autograd cannot do this: every op's result may be saved by the next.

The rewrite walks a method's statements in the order they run (:func:`reuse_buffers_in`)
and rewrites each assignment's expression: the syntax tree the printer built (after SymPy,
so it sees exactly the ops that run), as Python's parser would give it
(:func:`symgrad.codegen.syntax.plain`). It mutates only a *fresh* tensor: the result of an
op inside the same expression, never a name. ``t.op_(u)`` must also behave as ``t op u`` everywhere a
generated Function runs:

- double backward records the body: the fresh tensor's producer must not save its own
  output for its backward (``exp``, ``sqrt`` and ``sigmoid`` do; arithmetic and ``sin``
  do not), or autograd refuses the modified tensor. Autograd keeps the original value
  itself where an in-place op's own backward needs it.
- shapes and ``vmap``: ``t.op_(u)`` fails if ``u`` does not broadcast to ``t``'s shape, or
  if ``u`` is batched and ``t`` is not. Neither can happen when every name ``u`` depends
  on is one ``t`` depends on, as the shape and batching of an elementwise result are those
  of all its tensors together: that is the rule. So a gradient times the upstream gradient
  stays out of place: under ``jacrev`` only the upstream gradient is batched.
- dtypes: ``t.op_(u)`` keeps ``t``'s dtype, where ``t op u`` promotes. The target must be
  known to be floating (an integer or bool input times 2 is not), and then ``u``, built
  from a subset of ``t``'s tensors, promotes to no wider dtype than ``t``'s, unless ``u``
  made an integer tensor floating (``0.5 * y``, ``torch.exp(y)``: torch's default dtype,
  wider than float16) and ``t`` has another tensor that could be narrower: then ``u`` is
  not absorbed. From one tensor alone, both are of the default dtype, or of its own.
- values whose shape or dtype do not follow their tensors are never a target or an
  operand, nor is anything computed from them: reductions, method results such as
  ``.expand()``, comparisons, and a ``torch.where`` whose condition depends on a name its
  branches do not (its shape comes from the condition too, its dtype only from the
  branches: ``where(x > 0, y, 0)`` has x's shape and y's dtype).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, replace

from ..codegen.syntax import Code, Parenthesized, dotted_name, plain, tuple_of
from .ir import Assign, CreateGraphBranch, FirstOrderBranch, If, Method, Statement

# torch.<name>(t) for a fresh floating t becomes t.<name>_() ...
_UNARY_INPLACE = {
    "torch.exp": "exp_",
    "torch.log": "log_",
    "torch.log1p": "log1p_",
    "torch.expm1": "expm1_",
    "torch.sin": "sin_",
    "torch.cos": "cos_",
    "torch.tan": "tan_",
    "torch.asin": "asin_",
    "torch.acos": "acos_",
    "torch.atan": "atan_",
    "torch.sinh": "sinh_",
    "torch.cosh": "cosh_",
    "torch.tanh": "tanh_",
    "torch.sqrt": "sqrt_",
    "torch.rsqrt": "rsqrt_",
    "torch.abs": "abs_",
    "torch.sigmoid": "sigmoid_",
    "torch.special.erf": "erf_",
    "torch.special.erfc": "erfc_",
    "torch.lgamma": "lgamma_",
    "torch.special.digamma": "digamma_",
}
# (atanh_, asinh_ and acosh_ have no derivative in torch 2.13: NotImplementedError.)
# ... and these save their output for backward, so it must not be modified afterwards.
_SAVES_OUTPUT = {"torch.exp", "torch.expm1", "torch.tan", "torch.tanh", "torch.sqrt", "torch.rsqrt", "torch.sigmoid"}
# Calls whose result is a new floating tensor whatever the inputs' dtype (abs keeps it).
_FLOATING = (set(_UNARY_INPLACE) - {"torch.abs"}) | {
    "torch.atan2",
    "torch.hypot",
    "torch.logaddexp",
    "torch.xlogy",
    "torch.nn.functional.softplus",
    "torch.special.polygamma",
}
# Methods multiply_add calls: out of place, but links of a chain like the in-place ones.
_FUSED_METHODS = {"add", "addcmul", "addcdiv"}
_BINARY_INPLACE = {ast.Add: "add_", ast.Sub: "sub_", ast.Mult: "mul_", ast.Div: "div_"}
_COMMUTATIVE = (ast.Add, ast.Mult)


@dataclass(frozen=True)
class _Value:
    """What the rewrite knows of an expression's value."""

    deps: frozenset[str]  # the names it is computed from
    tensor: bool = False  # certainly a tensor (not a Python number)
    floating: bool = False  # certainly of a floating dtype
    # Made floating from a tensor that may be an integer one (0.5 * t, torch.exp(t)): then
    # its dtype is torch's default, which may be wider than a float16 tensor's.
    promoted: bool = False
    fresh: bool = False  # a new tensor no one else refers to, whose producer keeps no reference
    irregular: bool = False  # shape or dtype not that of its tensors together (see above)


# Calls whose result has their first argument's dtype.
_KEEPS_DTYPE = {"torch.abs", "torch.sign", "torch.floor", "torch.ceil", "torch.round", "torch.clamp", "torch.full_like"}
# Calls whose result is not elementwise in its arguments.
_IRREGULAR = {"torch.where", "torch.sum", "torch.mean"}  # (where: see _Rewriter.where)


@dataclass(frozen=True)
class Reuse:
    """A method after the rewrite, and what the rewrite wrote (the docstring says so)."""

    method: Method
    in_place: bool  # a rewritten statement calls an in-place method, ``t.mul_(u)``
    fused_terms: bool  # ... or adds a sum's term by one kernel (addcmul, addcdiv, alpha=)


def reuse_buffers_in(method: Method, tensors: frozenset[str], floating: frozenset[str], params: frozenset[str]) -> Reuse:
    """``method`` with in-place ops on its own fresh temporaries where that is safe, rewriting
    each assignment's value and the returned values, in the order they run.

    ``tensors`` names the tensors in scope, ``floating`` those certainly floating (upstream
    gradients and tangents) and ``params`` the values that may be tensors or numbers.
    """
    rewriter = _Rewriter(_environment(tensors, floating, params))
    written: list[ast.AST] = []
    body = _rewritten(method.body, rewriter, written)
    if method.values:
        # (The return is one expression, a tuple where it returns several values.)
        returned = method.values[0] if len(method.values) == 1 else tuple_of(*method.values)
        tree = rewriter.expression(returned)
        if tree is not None:
            written.append(tree)
            # (A tuple prints in parentheses; its values are printed one by one.)
            elements = tree.elts if isinstance(tree, ast.Tuple) else [tree]
            method = replace(method, values=tuple(elements), parenthesised=isinstance(tree, ast.Tuple))
    nodes = [node for tree in written for node in ast.walk(tree) if isinstance(node, ast.Call)]
    in_place = any(isinstance(n.func, ast.Attribute) and _is_in_place(n.func.attr) for n in nodes)
    fused = any(
        isinstance(n.func, ast.Attribute) and n.func.attr in ("addcmul", "addcdiv") or any(k.arg == "alpha" for k in n.keywords)
        for n in nodes
    )
    return Reuse(replace(method, body=body), in_place, fused)


def _is_in_place(method: str) -> bool:
    """Whether ``method`` is torch's in-place spelling, ``mul_`` (not a dunder, ``__add__``)."""
    return method.endswith("_") and method[:1].isalpha()


def _environment(tensors: frozenset[str], floating: frozenset[str], params: frozenset[str]) -> dict[str, _Value]:
    env = {name: _Value(frozenset({name})) for name in params}
    env.update({name: _Value(frozenset({name}), tensor=True, floating=name in floating) for name in tensors})
    return env


def _rewritten(statements: tuple[Statement, ...], rewriter: "_Rewriter", written: list[ast.AST]) -> tuple[Statement, ...]:
    """``statements`` rewritten in the order they run; the trees of what changed go to ``written``."""
    result: list[Statement] = []
    for statement in statements:
        if isinstance(statement, Assign):
            tree = rewriter.statement(statement.target, statement.value)
            if tree is not None:
                written.append(tree)
                statement = replace(statement, value=tree)
            result.append(statement)
        elif isinstance(statement, If):
            body = _rewritten(statement.body, rewriter, written)
            result.append(replace(statement, body=body, orelse=_rewritten(statement.orelse, rewriter, written)))
        elif isinstance(statement, FirstOrderBranch):
            kernel = _rewritten(statement.kernel, rewriter, written)
            result.append(replace(statement, kernel=kernel, formula=_rewritten(statement.formula, rewriter, written)))
        elif isinstance(statement, CreateGraphBranch):
            result.append(replace(statement, body=_rewritten(statement.body, rewriter, written)))
        else:
            result.append(statement)  # (comments, calls on ctx, early returns: nothing to reuse)
    return tuple(result)


class _Rewriter:
    def __init__(self, env: dict[str, _Value]) -> None:
        self.env = env
        # multiply_add's visits of a term's factors, by the factor node's id, for one line
        # (env is the same throughout it; the entries keep their nodes alive, so no id is
        # reused). Where no fused op fits, the term is visited whole and its factors are
        # found here: visited again, each nested term doubled the work, and Horner's
        # scheme nests one a degree (2**18 visits for a degree-36 series).
        self.factors: dict[int, tuple[ast.AST, _Value, ast.AST]] = {}

    def statement(self, target: str, code: Code) -> Code | None:
        """The value of the assignment ``target = code`` rewritten, or None where nothing
        changed. ``target`` is the plan's: a name (whose value the rewrite then knows),
        ``ctx.<attribute>``, names to unpack, or ``a = b`` (both set to None)."""
        self.factors.clear()
        tree = plain(code)
        before = ast.dump(tree)
        value, tree = self.visit(tree)
        if target.isidentifier():
            old = self.env.get(target)
            if old is not None:
                # A name assigned again (a param replaced by ctx's number when it was not a
                # tensor, or made a tensor) keeps what both say: either may hold at run time.
                value = _Value(
                    old.deps | value.deps,
                    tensor=old.tensor and value.tensor,
                    floating=old.floating and value.floating,
                    promoted=old.promoted or value.promoted,
                    irregular=old.irregular or value.irregular,
                )
            self.env[target] = replace(value, fresh=False)
        if ast.dump(tree) == before:
            return None  # nothing in place: the printer's own spelling
        return tree

    def expression(self, code: Code) -> Code | None:
        """The expression ``code`` rewritten, or None where nothing changed."""
        self.factors.clear()
        tree = plain(code)
        before = ast.dump(tree)
        _, node = self.visit(tree)
        return None if ast.dump(node) == before else node

    def visit(self, node: ast.AST) -> tuple[_Value, ast.AST]:
        """``node``'s value and the node rewritten (``node`` itself may be changed)."""
        known = self.factors.get(id(node))
        if known is not None:
            _, value, rewritten = known
            return value, copy.deepcopy(rewritten)
        if isinstance(node, ast.Constant):
            return _Value(frozenset(), floating=isinstance(node.value, float)), node
        if isinstance(node, ast.Name):
            return self.env.get(node.id, _Value(frozenset({node.id}))), node
        if isinstance(node, ast.Attribute):
            return _Value(frozenset()), node  # ctx.x_shape, x.dtype: not tensors
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        if isinstance(node, ast.UnaryOp):
            return self.unary(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, Parenthesized):
            value, node.value = self.visit(node.value)
            return _Value(value.deps), node
        return self.opaque(node)

    def opaque(self, node: ast.AST) -> tuple[_Value, ast.AST]:
        """A node not rewritten (a tuple, a comparison, a conditional expression): its
        sub-expressions still are; its value takes part in no in-place op."""
        deps: set[str] = set()
        for field, old in ast.iter_fields(node):
            if isinstance(old, ast.expr):
                value, new = self.visit(old)
                deps |= value.deps
                setattr(node, field, new)
            elif isinstance(old, list):
                new_items = []
                for item in old:
                    if isinstance(item, ast.expr):
                        value, item = self.visit(item)
                        deps |= value.deps
                    new_items.append(item)
                setattr(node, field, new_items)
        return _Value(frozenset(deps), irregular=True), node

    def binary(self, node: ast.BinOp) -> tuple[_Value, ast.AST]:
        if isinstance(node.op, (ast.Add, ast.Sub)):
            fused = self.multiply_add(node)
            if fused is not None:
                return fused
        left, node.left = self.visit(node.left)
        right, node.right = self.visit(node.right)
        return self.binary_of(node, left, right)

    def binary_of(self, node: ast.BinOp, left: _Value, right: _Value) -> tuple[_Value, ast.AST]:
        """``node``, whose operands are visited already (``left`` and ``right``)."""
        tensor = left.tensor or right.tensor
        irregular = left.irregular or right.irregular
        result = _Value(
            left.deps | right.deps,
            tensor=tensor,
            floating=left.floating or right.floating or (tensor and isinstance(node.op, ast.Div)),
            promoted=_promotes(node.op, left, right),
            fresh=tensor and not irregular,
            irregular=irregular,
        )
        method = _BINARY_INPLACE.get(type(node.op))
        if method is None:
            # x ** n: pow keeps its input, not its output, for backward: the result is fresh.
            # (scalar ** tensor and tensor ** tensor keep their output.)
            keeps_output = bool(right.deps) or not isinstance(node.right, (ast.Constant, ast.UnaryOp))
            return replace(result, fresh=result.fresh and not keeps_output), node
        if _can_absorb(left, right):
            return result, _method_call(node.left, method, node.right)
        if isinstance(node.op, _COMMUTATIVE) and _can_absorb(right, left):
            return result, _method_call(node.right, method, node.left)
        if isinstance(node.op, ast.Div) and _is_one(node.left) and right.tensor and not right.irregular:
            # 1 / t: reciprocal keeps its output for backward. (Python's 1 / t is
            # reciprocal(t) * 1, two kernels; reciprocal gives an integer t the same floating
            # dtype.)
            if right.fresh and right.floating:
                return replace(result, fresh=False), _method_call(node.right, "reciprocal_")
            return (
                replace(result, fresh=False, floating=True, promoted=right.promoted or not right.floating),
                _torch_call("reciprocal", node.right),
            )
        # A chain as an operand is parenthesised: black then puts one call on each line.
        node.left, node.right = _parenthesised(node.left), _parenthesised(node.right)
        return result, node

    def multiply_add(self, node: ast.BinOp) -> tuple[_Value, ast.AST] | None:
        """``a + c*l*r``, ``a + c*l/r`` and ``a + c*r`` (``-`` likewise, ``c`` a number) as one
        kernel: ``a.addcmul(l, r, value=c)``, ``a.addcdiv(l, r, value=c)`` and
        ``a.add_(r, alpha=c)`` (``a.add`` where ``a`` may not be written); else None.

        Each reads its three (two) operands once and writes once, where the product, its
        scaling and the sum are a kernel each (at 1e7 float32: 6.0 ms against 9.3 for
        ``a.add_((3*l).mul_(r))``, 2.9 against 6.0 for ``a.add_(3*r)``). addcmul and addcdiv
        stay out of place: their in-place forms have no vmap batching rule in torch 2.13 (a
        per-example loop, with a warning), and they keep their operands, not their output,
        for backward, so the result is fresh. Where the operands are not all floating, the
        sum must be floating and built from their tensors, as for an in-place op: then the
        fused op's dtype is the sum's. Where both the sum and a factor are fresh, the term
        is ``a.add_(l.mul_(r), alpha=c)`` instead: two passes, but no new buffer.
        """
        if (term_on_right := _product_term(node.right)) is not None:
            sum_node, term = node.left, term_on_right
        elif isinstance(node.op, ast.Add) and (term_on_left := _product_term(node.left)) is not None:
            sum_node, term = node.right, term_on_left
        else:
            return None
        kind, coefficient, first, second = term
        if isinstance(node.op, ast.Sub):
            coefficient = -coefficient
        # The term's factors are tried on copies: if no fused op fits, the term is visited
        # whole, as usual (and finds its factors' visits in self.factors).
        first_value, first_node = self.visit_factor(first)
        second_value, second_node = self.visit_factor(second) if second is not None else (None, None)
        operands = [v for v in (first_value, second_value) if v is not None]
        if any(not v.tensor or v.irregular for v in operands):
            return None
        if kind == "addcdiv" and not any(v.floating for v in operands):
            return None  # addcdiv refuses two integer tensors
        all_deps = frozenset().union(*(v.deps for v in operands))
        if isinstance(coefficient, float) and not first_value.floating and len(all_deps | self.deps(sum_node)) > 1:
            # 0.5 * l for an integer l is of the default dtype; addcmul's product, of l's and
            # r's, a float16 one's with r's (found in review). From one tensor alone both
            # are of the default dtype, or of its own.
            return None
        sum_value, sum_ast = self.visit(sum_node)
        promoted = any(v.promoted for v in (sum_value, *operands)) or (
            isinstance(coefficient, float) and not first_value.floating
        )
        result = _Value(sum_value.deps | all_deps, tensor=True, floating=True, promoted=promoted, fresh=True)
        fits = sum_value.tensor and not sum_value.irregular and (
            all(v.floating for v in operands)
            or (sum_value.floating and all(v.deps <= sum_value.deps for v in operands))
        )
        if kind == "alpha" and _can_absorb(sum_value, first_value):
            return result, _method_call(sum_ast, "add_", first_node, alpha=coefficient)
        in_place = self.in_place_term(kind, first_value, first_node, second_value, second_node)
        if in_place is not None and _can_absorb(sum_value, in_place[0]):
            # A fresh factor takes the product in place, and the sum takes the term in place:
            # two passes that allocate nothing, where addcmul allocates its result (with
            # glibc's default allocator a new 40 MB buffer page-faults: the 20-op expression
            # ran 1.13x slower at 1e7 all out of place, 0.98x with buffers kept).
            if coefficient == -1:
                return result, _method_call(sum_ast, "sub_", in_place[1])
            alpha = {} if coefficient == 1 else {"alpha": coefficient}
            return result, _method_call(sum_ast, "add_", in_place[1], **alpha)
        if not fits:
            # The usual binary op, its operands visited already: the term as a whole.
            if sum_node is node.left:
                right, node.right = self.visit(node.right)
                node.left = sum_ast
                return self.binary_of(node, sum_value, right)
            left, node.left = self.visit(node.left)
            node.right = sum_ast
            return self.binary_of(node, left, sum_value)
        # (Methods, not torch.addcmul(a, l, r): a long sum reads as one chain, a.addcmul(...)
        # .addcmul(...), where the functions nest one level per term.)
        if kind == "alpha":
            return result, _method_call(sum_ast, "add", first_node, alpha=coefficient)
        value = {} if coefficient == 1 else {"value": coefficient}
        return result, _method_call(sum_ast, kind, first_node, second_node, **value)

    def visit_factor(self, node: ast.AST) -> tuple[_Value, ast.AST]:
        """:meth:`visit` of a copy of ``node``, remembered for a later visit of ``node``."""
        value, rewritten = self.visit(copy.deepcopy(node))
        self.factors[id(node)] = (node, value, copy.deepcopy(rewritten))
        return value, rewritten

    @staticmethod
    def in_place_term(
        kind: str, first: _Value, first_node: ast.expr, second: _Value | None, second_node: ast.expr | None
    ) -> tuple[_Value, ast.expr] | None:
        """A product (quotient) term computed in place in a fresh factor, ``l.mul_(r)``
        (``l.div_(r)``); else None."""
        if kind == "alpha" or second is None or second_node is None:
            return None
        pairs = [(first, first_node, second, second_node)]
        if kind == "addcmul":
            pairs.append((second, second_node, first, first_node))
        for target, target_node, operand, operand_node in pairs:
            if _can_absorb(target, operand):
                value = _Value(
                    target.deps | operand.deps,
                    tensor=True,
                    floating=True,
                    promoted=target.promoted or operand.promoted,
                    fresh=True,
                )
                method = "mul_" if kind == "addcmul" else "div_"
                return value, _method_call(target_node, method, operand_node)
        return None

    def deps(self, node: ast.AST) -> frozenset[str]:
        """The names ``node`` is computed from, without visiting it."""
        found = [self.env[n.id].deps for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in self.env]
        return frozenset().union(*found)

    def unary(self, node: ast.UnaryOp) -> tuple[_Value, ast.AST]:
        operand, node.operand = self.visit(node.operand)
        if not isinstance(node.op, ast.USub):
            return _Value(operand.deps, irregular=True), node  # ~ on a condition: bool
        if isinstance(node.operand, ast.Constant):
            return operand, node
        result = replace(operand, fresh=operand.tensor and not operand.irregular)
        if operand.fresh and operand.floating:
            return result, _method_call(node.operand, "neg_")
        return result, node

    def call(self, node: ast.Call) -> tuple[_Value, ast.AST]:
        name = dotted_name(node.func) or ""  # ("": a method of an expression's value)
        if isinstance(node.func, ast.Attribute) and not name.startswith("torch."):
            value, node.func.value = self.visit(node.func.value)
            node.args = [self.visit(a)[1] for a in node.args]
            if _is_number_tensor(node):
                # t.new_full((), c), the printer's number as a 0-d tensor: it broadcasts and
                # promotes like the number (a 0-d tensor never widens a dimensioned one of
                # its kind), so it may be an operand; never a target, being 0-d.
                return _Value(value.deps, tensor=True, floating=value.floating, promoted=value.promoted), node
            # Other methods: .expand() is a view of another shape, .sum() a reduction.
            return _Value(value.deps, tensor=value.tensor, irregular=True), node
        values = []
        for index, arg in enumerate(node.args):
            value, node.args[index] = self.visit(arg)
            values.append(value)
        for keyword in node.keywords:
            _, keyword.value = self.visit(keyword.value)
        deps = frozenset().union(*(v.deps for v in values)) if values else frozenset()
        if not name.startswith("torch."):
            return _Value(deps, floating=name == "float"), node  # float("nan")
        if name == "torch.where" and len(values) == 3 and not node.keywords:
            return self.where(*values), node
        irregular = name in _IRREGULAR or any(v.irregular for v in values)
        floating = name in _FLOATING or (name in _KEEPS_DTYPE and bool(values) and values[0].floating)
        promoted = any(v.promoted or (name in _FLOATING and v.tensor and not v.floating) for v in values)
        result = _Value(deps, tensor=True, floating=floating, promoted=promoted, irregular=irregular)
        if name in _UNARY_INPLACE and len(values) == 1 and not node.keywords:
            result = replace(result, fresh=not irregular and name not in _SAVES_OUTPUT)
            if values[0].fresh and values[0].floating:
                return result, _method_call(node.args[0], _UNARY_INPLACE[name])
        return result, node


    @staticmethod
    def where(condition: _Value, then: _Value, otherwise: _Value) -> _Value:
        """torch.where's dtype is its branches', its shape also the condition's: regular (and
        fresh: where keeps only the condition) when the branches depend on every name the
        condition does, ``torch.where(abs(x) < 0.125, 0.125, x)``; not ``where(x > 0, y, 0)``."""
        branches = then.deps | otherwise.deps
        regular = condition.deps <= branches and not (then.irregular or otherwise.irregular)
        return _Value(
            condition.deps | branches,
            tensor=True,
            floating=then.floating or otherwise.floating,
            promoted=then.promoted or otherwise.promoted,
            fresh=regular,
            irregular=not regular,
        )


def _is_number_tensor(node: ast.Call) -> bool:
    """Whether ``node`` is ``t.new_full((), number)`` (printer._number_tensor)."""
    return (
        node.func.attr == "new_full"
        and len(node.args) == 2
        and isinstance(node.args[0], ast.Tuple)
        and not node.args[0].elts
        and not node.keywords
    )


def _can_absorb(target: _Value, operand: _Value) -> bool:
    """Whether ``target.op_(operand)`` is safe: see the module docstring."""
    if operand.promoted and len(target.deps) > 1:
        # 0.5 * y for an integer y is of the default dtype, wider than a float16 target made
        # with another tensor: sin(x * y).add_(0.5 * y) would narrow it (found in review).
        # Made from one tensor alone, both are of the default dtype, or of its own.
        return False
    return target.fresh and target.floating and not operand.irregular and operand.deps <= target.deps


def _promotes(op: ast.operator, left: _Value, right: _Value) -> bool:
    """Whether ``left op right`` may be floating only through an integer tensor made
    floating: a Python float times it, or a true division of two of them."""
    if left.promoted or right.promoted:
        return True
    number_side = [v for v in (left, right) if not v.tensor and not v.deps]
    tensor_sides = [v for v in (left, right) if v.tensor]
    if any(v.floating for v in number_side) and any(not v.floating for v in tensor_sides):
        return True
    return isinstance(op, ast.Div) and bool(tensor_sides) and not (left.floating or right.floating)


def _parenthesised(node: ast.expr) -> ast.expr:
    """A chain of in-place (or fused) calls as an operand, in parentheses that Python's
    precedence does not need: black then puts one call on each line."""
    chain = (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (node.func.attr.endswith("_") or node.func.attr in _FUSED_METHODS)
    )
    return Parenthesized(node) if chain else node


def _method_call(receiver: ast.expr, method: str, *args: ast.expr, **numbers: float) -> ast.Call:
    return ast.Call(ast.Attribute(receiver, method, ast.Load()), list(args), _keywords(numbers))


def _torch_call(function: str, *args: ast.expr, **numbers: float) -> ast.Call:
    torch = ast.Attribute(ast.Name("torch", ast.Load()), function, ast.Load())
    return ast.Call(torch, list(args), _keywords(numbers))


def _keywords(numbers: dict[str, float]) -> list[ast.keyword]:
    return [ast.keyword(name, ast.Constant(value)) for name, value in numbers.items()]


def _number(node: ast.AST) -> float | None:
    """The value of a number literal, ``2``, ``0.5`` or ``-0.5``; else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    return None


def _split_coefficient(node: ast.AST) -> tuple[float, ast.AST | None]:
    """A product as its leading number and the rest: ``2 * t * y`` is (2, ``t * y``), ``2``
    is (2, None), and ``t * y`` is (1, itself)."""
    number = _number(node)
    if number is not None:
        return number, None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        number, rest = _split_coefficient(node.left)
        if rest is None:
            return number, node.right
        if number != 1:
            return number, ast.BinOp(rest, ast.Mult(), node.right)
    return 1, node


def _product_term(node: ast.AST) -> tuple[str, float, ast.AST, ast.AST | None] | None:
    """A term of a sum that one fused op adds: ("addcmul", c, l, r) for ``c * l * r``,
    ("addcdiv", c, l, r) for ``c * l / r``, ("alpha", c, r, None) for ``c * r`` (c a number
    other than 1); else None."""
    if not isinstance(node, ast.BinOp):
        return None
    if isinstance(node.op, ast.Div):
        coefficient, numerator = _split_coefficient(node.left)
        return None if numerator is None else ("addcdiv", coefficient, numerator, node.right)
    if not isinstance(node.op, ast.Mult):
        return None
    coefficient, rest = _split_coefficient(node)
    if rest is None:
        return None  # a number
    if isinstance(rest, ast.BinOp) and isinstance(rest.op, ast.Mult):
        return "addcmul", coefficient, rest.left, rest.right
    if isinstance(rest, ast.BinOp) and isinstance(rest.op, ast.Div):
        coefficient_inside, numerator = _split_coefficient(rest.left)
        if numerator is not None:
            return "addcdiv", coefficient * coefficient_inside, numerator, rest.right
        return None
    return ("alpha", coefficient, rest, None) if coefficient != 1 else None


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 1
