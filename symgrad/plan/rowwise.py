"""The plan of a row-wise module: outputs with reductions, softmax, gather along a dim.

The elementwise planner's bodies are ``grad_output * df/dx``; here backward is the VJP that
:mod:`symgrad.derive.rowwise` builds node by node. What backward saves is chosen as the
cheapest exact set, counted in full-size tensors:

- an output where the VJP can be written in it (softmax's ``y*(g - sum(g*y))``; log_softmax
  through ``exp(y)``), else the inputs;
- each reduction the VJP reads (RMSNorm's ``mean(x**2)``, logsumexp's row value): one value
  per row, which forward computes anyway and returns beside the outputs, marked
  non-differentiable. Under ``create_graph`` backward recomputes them from the saved
  inputs, so that double backward differentiates through them.

Where torch has a backward kernel for the whole VJP (softmax and log_softmax), first-order
backward calls it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import Callable

import sympy

from ..codegen.printer import helpers_used, print_tree
from ..codegen.syntax import (
    NONE,
    Code,
    attribute,
    binop,
    call,
    compare,
    if_else,
    method,
    name,
    number,
    parens,
    string,
    subscript,
    tuple_of,
    unary,
)
from ..derive.rowwise import EVERY, FORWARD, KERNELS, KNOWN, KernelGradient, formula_of_kernels, jvp, reduced_dims, vjp
from ..math.reductions import (
    BackwardValue,
    AdjointShapedAs,
    Count,
    Gather,
    KeptShape,
    LogSoftmax,
    LogSumExp as _LSE,
    Reduction,
    ReduceMean,
    ReduceSum,
    Scatter,
    Softmax,
    SoftmaxBackward,
    WHOLE,
    dims_code,
)
from ..frontend.parse import Parsed
from ..math.functions import sigmoid, silu
from ..naming import snake_case
from ..errors import SymgradError
from .assemble import _with_helpers
from .code import sum_of
from .ir import Assign, Comment, Fused, If, Line, Method, Plan, Raise, Return, Unpack, render_statements
from .operations import eager_operations


@dataclass(frozen=True)
class _Saving:
    """One way to write backward: its expressions and the values it reads from ctx."""

    vjps: tuple[sympy.Expr, ...]
    inputs: tuple[sympy.Symbol, ...]  # inputs and params it reads
    outputs: tuple[int, ...]  # the outputs it reads, by index
    stats: tuple[tuple[sympy.Symbol, sympy.Expr], ...]  # row values it reads, with their forward formula
    shapes: tuple[sympy.Symbol, ...] = ()  # inputs whose shape it reads from ctx (KeptShape)
    assumed: frozenset = frozenset()  # (param, dims) its row sums take as constant along dims

    def full_tensors(self, inputs: tuple[sympy.Symbol, ...], reduced: list) -> int:
        full_stats = sum(1 for _, node in self.stats if isinstance(node, Softmax))
        return sum(1 for s in self.inputs if s in inputs) + sum(1 for i in self.outputs if not reduced[i]) + full_stats

    def recomputed(self) -> int:
        """How many softmax and log_softmax tensors backward computes again."""
        return sum(1 for v in self.vjps for n in sympy.preorder_traversal(v) if isinstance(n, Softmax))


def forward_outputs(parsed: Parsed) -> tuple[sympy.Expr, ...]:
    """Each output as one expression, a whole-output ``sum``/``mean`` as a node."""
    kinds = {"sum": ReduceSum, "mean": ReduceMean}
    return tuple(kinds[o.reduction](o.expr, WHOLE) if o.reduction else o.expr for o in parsed.outputs)


def make_rowwise_plan(parsed: Parsed) -> Plan:
    return _Planner(parsed).plan()


class _Planner:
    def __init__(self, parsed: Parsed) -> None:
        self.p = parsed
        # --fuse's pure functions read ctx's values as their parameters.
        self.pure = False
        # The module-level helpers the printed code calls (printer.HELPERS).
        self.helpers: frozenset[str] = frozenset()
        self.spec = parsed.spec
        self.inputs = parsed.inputs
        self.params = parsed.params
        self.outputs = tuple(stabilised(f) for f in forward_outputs(parsed))
        everything = frozenset(self.inputs + self.params)
        # dims each output has size 1 along (dropped from what it returns), EVERY for 0-d
        self.reduced = [reduced_dims(f, everything) for f in self.outputs]
        self.names = {s: s.name for s in self.inputs + self.params}
        self.alias = snake_case(self.spec.name)
        n = len(self.outputs)
        self.results = ["result"] if n == 1 else [f"result{i}" for i in range(n)]
        self.grads = ["grad_output"] if n == 1 else [f"grad_output{i}" for i in range(n)]
        self.adjoints = [sympy.Symbol(g, real=True) for g in self.grads]
        self.result_symbols = [sympy.Symbol(r, real=True) for r in self.results]
        self.tangent_symbols = {s: sympy.Symbol(f"{s.name}_tangent", real=True) for s in self.inputs}
        # Whether tensors of several shapes may meet: several inputs, or a param (a gather's
        # index has the rows' shape, and a number param none).
        indices = {n.index for f in self.outputs for n in sympy.preorder_traversal(f) if isinstance(n, Gather)}
        self.broadcasts = len(self.inputs) + len([p for p in self.params if p not in indices]) > 1
        self.norm = match_norm_kernel(self.outputs[0], self.inputs, self.params) if len(self.outputs) == 1 else None
        for symbol in self.adjoints + self.result_symbols + list(self.tangent_symbols.values()):
            self.names[symbol] = symbol.name

    # -- what backward saves ------------------------------------------------------------

    def saving(self) -> _Saving:
        # --save memory: the fewest full-size tensors. --save speed: also a softmax or
        # log_softmax forward computed (cross-entropy's log-probabilities), where backward
        # would compute it again: the fewest recomputed first, from the VJP with softmax
        # backward kernels too (they read a saved log_softmax as it is). Ties go to the
        # first option: the VJP whose softmax row sums simplify. --fuse: softmax VJPs as
        # formulas wherever forward computed their row sums too (inductor fuses them).
        full = (False, True) if self.spec.save == "speed" else (False,)
        first = FORWARD if self.spec.fuse else KNOWN
        forms = (first, KERNELS) if self.spec.save == "speed" else (first,)
        options = []
        for row_sums in forms:
            assumed: set = set()
            raw = self.raw_vjps(row_sums, assumed)
            for outputs in (False, True):
                for keep in full:
                    options.append(replace(self._with_stats(raw, outputs, keep), assumed=frozenset(assumed)))
        if self.spec.save == "speed":
            return min(options, key=lambda o: (o.recomputed(), o.full_tensors(self.inputs, self.reduced), -len(o.outputs)))
        return min(options, key=lambda o: (o.full_tensors(self.inputs, self.reduced), -len(o.outputs)))

    def raw_vjps(self, row_sums: str, assumed: set) -> tuple[sympy.Expr, ...]:
        """Each input's gradient as backward reads it, before the saved values stand in
        (``assumed`` gets the params it takes as constant along a row)."""
        derived = vjp(list(self.outputs), self.adjoints, self.inputs, row_sums, assumed)
        raw = tuple(self.adjoints_shaped_for_kernels(self.counted_by_inputs(v)) for v in derived)
        given = dict(self.p.vjps)  # --vjp: the user's whole gradients (grad_output is the adjoint)
        return tuple(given.get(x, v) for x, v in zip(self.inputs, raw))

    def adjoints_shaped_for_kernels(self, expr: sympy.Expr) -> sympy.Expr:
        """``expr`` with the adjoint of each softmax backward kernel made the softmax's shape
        wherever it may not be already: where tensors of several shapes meet, or where the
        adjoint is reduced along dims that the softmax's value is not."""
        everything = frozenset(self.inputs + self.params)
        known = dict(zip(self.adjoints, self.reduced))

        def shaped(node: SoftmaxBackward) -> sympy.Expr:
            adjoint, y, *rest = node.args
            if not self.broadcasts and reduced_dims(adjoint, everything, known) == reduced_dims(y, everything):
                return node
            return SoftmaxBackward(AdjointShapedAs(adjoint, y), y, *rest)

        return expr.replace(lambda e: isinstance(e, SoftmaxBackward) and not isinstance(e.args[0], AdjointShapedAs), shaped)

    def _with_stats(self, raw: tuple[sympy.Expr, ...], outputs: bool, full: bool = False) -> _Saving:
        replacements: dict[sympy.Expr, sympy.Expr] = {}
        if outputs:
            for i, f in enumerate(self.outputs):
                replacements[f] = self.result_symbols[i]
                if isinstance(f, LogSoftmax):
                    # softmax(u) is exp(log_softmax(u)): backward reads the output
                    replacements[Softmax(*f.args)] = sympy.exp(self.result_symbols[i])
        vjps = tuple(v.xreplace(replacements) for v in raw)
        forward = self.outputs
        if self.spec.fuse:
            # --fuse's bodies compute softmax through the row's logsumexp (compiled_form):
            # that row value is then one forward computes anyway, which backward reads
            # saved (or as the output, where the output is the logsumexp) instead of
            # recomputing it, two more passes over the input.
            vjps = tuple(through_logsumexp(v).xreplace(replacements) for v in vjps)
            forward = tuple(through_logsumexp(f) for f in self.outputs)
        stats: dict[sympy.Expr, sympy.Symbol] = {}
        if self.norm is not None:
            # The kernel's row values stand for their formulas wherever the VJP has them.
            for symbol, formula, pattern, replacement in reversed(self.norm.stats):  # (inner ones last)
                vjps = tuple(_outside_counts(v, {pattern: replacement}) for v in vjps)
            for symbol, formula, _, _ in self.norm.stats:  # (in the order the kernel returns them)
                stats[formula] = symbol
        for v in vjps:
            for node in sympy.preorder_traversal(v):
                kept = isinstance(node, Reduction) or (full and isinstance(node, Softmax))
                if kept and node.free_symbols & set(self.inputs) and _in_forward(node, forward):
                    if not (node.free_symbols & set(self.adjoints)):
                        label = type(node).torch_name if isinstance(node, Softmax) else "row"
                        taken = sum(1 for symbol in stats.values() if symbol.name.startswith(label))
                        stats.setdefault(node, sympy.Symbol(f"{label}{taken}", real=True))
        vjps = tuple(_outside_counts(v, stats) for v in vjps)
        vjps, shapes = _shapes_kept(vjps, self.inputs)
        used = set().union(*(v.free_symbols for v in vjps))
        if self.norm is not None and self.norm.backward is not None:
            used |= set(self.norm.roles)  # (the backward kernel reads x, w and b)
        for node, symbol in stats.items():
            if symbol in used or self.norm is not None:
                used |= node.free_symbols  # (recomputed from them under create_graph)
        read_inputs = tuple(s for s in self.inputs + self.params if s in used)
        read_outputs = tuple(i for i, r in enumerate(self.result_symbols) if r in used)
        kept_stats = tuple(
            (symbol, node) for node, symbol in stats.items() if symbol in used or self.norm is not None
        )
        return _Saving(vjps, read_inputs, read_outputs, kept_stats, shapes)

    def counted_by_inputs(self, expr: sympy.Expr) -> sympy.Expr:
        """``expr`` with each Count read from the inputs' shapes alone: a param may be a
        Python number, which has none (a gather's index keeps its own)."""
        indices = {node.index for node in sympy.preorder_traversal(expr) if isinstance(node, Gather)}
        numbers = {p: _NUMBER for p in self.params if p not in indices}

        def shape_only(operand: sympy.Expr) -> sympy.Expr:
            return operand.xreplace(numbers)

        return expr.replace(lambda e: isinstance(e, Count), lambda e: Count(shape_only(e.args[0]), e.args[1]))

    # -- the methods ---------------------------------------------------------------------

    def plan(self) -> Plan:
        saving = self.saving()
        self._saving = saving
        self._stats_count = len(saving.stats)
        for symbol, _ in saving.stats:
            self.names[symbol] = symbol.name
        forward = self.forward(saving)
        setup = self.setup_context(saving)
        backward = self.backward(saving)
        jvp_method, forward_ad = self.jvp()
        fused = None
        if self.spec.fuse:
            if self.spec.inplace:
                raise SymgradError("--fuse and --inplace cannot be combined: an in-place Function is not fused")
            fused, forward, backward, jvp_method = self.fused(saving, forward, backward, jvp_method)
        # (the helpers the printed bodies call, with the module's entry point's method)
        forward = replace(forward, value_helpers=forward.value_helpers | self.helpers)
        public = tuple(s.name for s in self.inputs + self.params)
        n_out = len(self.outputs)
        extra = len(saving.stats)
        return _with_helpers(Plan(
            class_name=self.spec.name,
            no_jvp_class=f"_{self.spec.name}NoJvp",
            alias=self.alias,
            public_params=public,
            call_args=public,
            public_outputs="" if not extra else ("[0]" if n_out == 1 else f"[:{n_out}]"),
            docstring=self.docstring(saving),
            saved_comment=self.saved_comment(saving),
            forward=forward,
            setup_context=setup,
            backward=backward,
            jvp=jvp_method,
            setup_forward_ad=forward_ad,
            metadata=self.metadata(saving),
            inplace=False,
            refuses_double_backward=False,
            surrogate=bool(self.p.vjps),
            fused=fused,
        ))

    # -- --fuse ---------------------------------------------------------------------------

    def fused(self, saving: _Saving, forward: Method, backward: Method, jvp_method: Method):
        """--fuse: forward, backward and jvp as pure module-level functions that the
        Function's methods run through the module's ``_fused`` runner (torch.compile)."""
        self.pure = True
        try:
            pure_forward = self.forward(saving)
            pure_backward = self.backward(saving)
            pure_jvp, _ = self.jvp()
        finally:
            self.pure = False
        names = {kind: f"_{self.alias}_{kind}" for kind in ("forward", "backward", "jvp")}

        def through_runner(kind: str, body: Method, args: list[Code]) -> Code:
            return call("_fused", names[kind], *args, operations=max(1, eager_operations(body)))

        kept = [x.name for j, x in enumerate(self.inputs) if self._keeps_shape(j)]
        shapes = [attribute("ctx", f"{x}_shape") for x in kept]
        grads = [name(g) for g in self.grads]
        saved = list(backward.unpack.names) if backward.unpack else []
        backward_args = grads + [name(n) for n in saved] + shapes + [attribute("ctx", "needs_input_grad")]
        pure_backward = replace(
            pure_backward,
            params=(*self.grads, *saved, *(f"{x}_shape" for x in kept), "needs_input_grad"),
            unpack=None,
        )
        tangents = [name(self.tangent_symbols[x].name) for x in self.inputs]
        jvp_saved = list(jvp_method.unpack.names) if jvp_method.unpack else []
        pure_jvp = replace(pure_jvp, params=(*(t.id for t in tangents), *jvp_saved), unpack=None)
        calling_forward = Method(
            params=forward.params, values=(through_runner("forward", pure_forward, [name(p) for p in forward.params]),)
        )
        calling_backward = replace(
            backward, body=(), values=(through_runner("backward", pure_backward, backward_args),), value_helpers=frozenset()
        )
        calling_jvp = replace(
            jvp_method, body=(), values=(through_runner("jvp", pure_jvp, tangents + [name(n) for n in jvp_saved]),)
        )
        fused = Fused(
            runner="_fused",
            cache="_COMPILED",
            eager_work="_EAGER_WORK_LIMIT",
            forward_name=names["forward"],
            forward=pure_forward,
            backward_name=names["backward"],
            backward=pure_backward,
            jvp_name=names["jvp"],
            jvp=pure_jvp,
            description=(
                "Forward, backward and jvp run through torch.compile (the module's `_fused`),",
                "eagerly where compiling cannot work or would not pay (small CPU tensors).",
            ),
        )
        return fused, calling_forward, calling_backward, calling_jvp

    def print(self, expr: sympy.Expr) -> Code:
        if self.pure:
            expr = compiled_call(compiled_form(expr))
            if expr.has(_OnePassLogSumExp):
                self.helpers |= {"_logsumexp"}
        else:
            # (a kept shape is on ctx; --fuse's pure bodies take it as a parameter)
            expr = expr.xreplace({k: KeptShape(f"ctx.{k.name}") for k in expr.atoms(KeptShape)})
        self.helpers |= helpers_used(expr)
        return print_tree(expr, self.names)

    def body(self, exprs: list[sympy.Expr], prefix: str = "t") -> tuple[list[Assign], list[Code]]:
        """CSE'd assignments and the printed values of ``exprs``."""
        statements, reduced = self.cse(exprs, prefix)
        return statements, [self.print(e) for e in reduced]

    def cse(self, exprs: list[sympy.Expr], prefix: str) -> tuple[list[Assign], list[sympy.Expr]]:
        # A count reads the shapes of the tensors its operand is computed from: kept out of
        # CSE, which would name a temporary there (its shape, computed for nothing).
        counts = {}
        for expr in exprs:
            for node in sympy.preorder_traversal(expr):
                if isinstance(node, Count):
                    counts.setdefault(node, sympy.Dummy(f"count{len(counts)}", positive=True, integer=True))
        back = {dummy: node for node, dummy in counts.items()}
        temporaries = sympy.numbered_symbols(prefix, real=True)
        hidden = [e.xreplace(counts) for e in exprs]
        pairs, reduced = sympy.cse(hidden, symbols=temporaries, order="canonical", ignore=tuple(self.adjoints))
        statements = []
        for symbol, value in pairs:
            self.names[symbol] = symbol.name
            statements.append(Assign(symbol.name, self.print(value.xreplace(back))))
        return statements, [e.xreplace(back) for e in reduced]

    def squeezed(self, expr: sympy.Expr, dims) -> Code:
        """``expr`` printed, with the size-1 ``dims`` of a reduced output dropped."""
        code = self.print(expr)
        if dims == EVERY or not dims:
            return code
        return method(code, "squeeze", dims_code(_tuple(dims)))

    def forward(self, saving: _Saving) -> Method:
        params = tuple(s.name for s in self.inputs + self.params)
        if self.norm is not None:
            return self.norm_forward(params)
        # (--fuse: CSE'd in the form printed, so that a row logsumexp that backward reads
        # is the outputs' own)
        outputs = [compiled_form(f) for f in self.outputs] if self.pure else list(self.outputs)
        statements, reduced = self.cse(outputs + [node for _, node in saving.stats], "t")
        values = [self.squeezed(e, self.reduced[i]) if i < len(self.outputs) else self.print(e) for i, e in enumerate(reduced)]
        for i, e in enumerate(reduced):
            if e in self.inputs or e in reduced[:i]:
                # Never return an input, or one tensor twice: forward-mode AD and
                # torch.compile need every output to be a tensor of its own.
                values[i] = method(values[i], "clone")
        return Method(params=params, body=tuple(self.row_constant_checks(saving)) + tuple(statements), values=tuple(values))

    def row_constant_checks(self, saving: _Saving) -> list:
        """A param that backward's row sums take as constant along a row (label smoothing's
        ``s``, where its row sum is then known without a pass) is refused, in one line, where
        it varies along that row: a mask of the logits' shape must be an input."""
        if not saving.assumed:
            return []
        self.helpers |= {"_row_constant"}
        checks = sorted(saving.assumed, key=lambda item: (item[0].name, item[1]))
        return [Line(call("_row_constant", name(x.name), string(x.name), tuple_of(*dims))) for x, dims in checks]

    def norm_forward(self, params: tuple[str, ...]) -> Method:
        """The kernel where the weights have its normalised shape, (H,), and eps is a
        number; the formula, with the same row values, for any other shape or a tensor eps."""
        norm = self.norm
        kernel = (Return((norm.forward,)),)
        fits = None
        for role in norm.roles[1:]:
            same = compare(attribute(role.name, "shape"), "==", _from_last(norm.roles[0]))
            fits = same if fits is None else _and(fits, same)
        if norm.eps.is_Symbol:
            # (the kernels take eps as a float: a tensor eps, 0-d under torch.compile or
            # one per row, runs the formula)
            fits = _and(fits, unary("not", call("isinstance", norm.eps.name, "torch.Tensor")))
        stats = [(symbol, formula.xreplace({p: r for _, _, p, r in norm.stats[:k]})) for k, (symbol, formula, _, _) in enumerate(norm.stats)]
        output = self.outputs[0]
        for _, _, pattern, replacement in reversed(norm.stats):
            output = output.xreplace({pattern: replacement})
        body = [If(fits, kernel)]
        for symbol, formula in stats:
            body.append(Assign(symbol.name, self.print(formula)))
        return Method(params=params, body=tuple(body), values=(self.print(output), *(name(s.name) for s, _ in stats)))

    def setup_context(self, saving: _Saving) -> Method:
        lines: list = []
        outputs_named = saving.outputs or saving.stats
        reads_inputs = bool(saving.inputs) or any(self._keeps_shape(j) for j in range(len(self.inputs)))
        if reads_inputs:
            lines += self.unpack_inputs()
        if outputs_named:
            out_names = self.results + [s.name for s, _ in saving.stats]
            if len(out_names) == 1:
                lines.append(Assign(self.results[0], name("output")))
            else:
                lines.append(Assign(", ".join(out_names), name("output")))
            if saving.stats:
                lines.append(Line(method("ctx", "mark_non_differentiable", *(s.name for s, _ in saving.stats))))
        body, saved = self.save_parts(saving.inputs, "save_for_backward")
        lines += body
        saved += [name(self.results[i]) for i in saving.outputs] + [name(s.name) for s, _ in saving.stats]
        lines.append(Line(method("ctx", "save_for_backward", *saved)))
        for j, x in enumerate(self.inputs):
            if self._keeps_shape(j):
                lines.append(Assign(f"ctx.{x.name}_shape", attribute(x.name, "shape")))
        return Method(params=("ctx", "inputs", "output"), body=tuple(lines))

    def unpack_inputs(self) -> list:
        """``x, w, eps = inputs`` in setup_context."""
        names = [s.name for s in self.inputs + self.params]
        return [Assign(f"{names[0]}," if len(names) == 1 else ", ".join(names), name("inputs"))]

    def save_parts(self, symbols, how: str) -> tuple[list, list[Code]]:
        """The statements that keep number params on ctx, and the tensors to save."""
        lines, saved = [], []
        for symbol in symbols:
            if symbol in self.params:
                # A param may be a Python number, which save_for_backward refuses: kept on ctx.
                number_attribute = f"ctx.{symbol.name}_number"
                if how == "save_for_backward":
                    is_tensor = call("isinstance", symbol.name, "torch.Tensor")
                    lines.append(Assign(number_attribute, if_else(is_tensor, NONE, symbol.name)))
                saved.append(if_else(compare(number_attribute, "is", None), symbol.name, NONE))
            else:
                saved.append(name(symbol.name))
        return lines, saved

    def _keeps_shape(self, j: int) -> bool:
        """Whether setup_context keeps input j's shape on ctx: to shape its gradient, or for
        a count backward reads (KeptShape)."""
        return self._reshapes_gradient(j) or self.inputs[j] in self._saving.shapes

    def _reshapes_gradient(self, j: int) -> bool:
        """Whether input j's gradient may need summing or expanding to its shape: several
        tensors broadcast together, or a gradient reduced along a dim."""
        return self.broadcasts or self._gradient_is_reduced(j)

    def _gradient_is_reduced(self, j: int) -> bool:
        dims = self.value_dims(self._saving.vjps[j])
        return self._saving.vjps[j] != 0 and (dims == EVERY or bool(dims))

    def value_dims(self, expr: sympy.Expr):
        """The reduced dims of a backward value: upstream gradients and saved outputs have
        their outputs' (kept), row values their reduction's."""
        known = {}
        for i, dims in enumerate(self.reduced):
            known[self.adjoints[i]] = dims
            known[self.result_symbols[i]] = dims
        everything = frozenset(self.inputs + self.params)
        for symbol, node in self._saving.stats:
            known[symbol] = reduced_dims(node, everything)
        return reduced_dims(expr, everything, known)

    def backward(self, saving: _Saving) -> Method:
        saved = [s.name for s in saving.inputs] + [self.results[i] for i in saving.outputs] + [s.name for s, _ in saving.stats]
        params = ("ctx", *self.grads) if not saving.stats else ("ctx", *self.grads, *(f"_grad_{s.name}" for s, _ in saving.stats))
        head: list = []
        for i, dims in enumerate(self.reduced):
            if dims != EVERY and dims:
                # (the output dropped the dims it reduced: put them back, to broadcast)
                head.append(Assign(self.grads[i], _unsqueezed(self.grads[i], dims)))
                if i in saving.outputs:
                    head.append(Assign(self.results[i], _unsqueezed(self.results[i], dims)))
        if saving.stats:
            recompute = []
            for symbol, node in saving.stats:
                recompute.append(Assign(symbol.name, self.print(node)))
            head.append(Comment("under create_graph, the saved forward values are recomputed so that they are differentiable"))
            head.append(If(call("torch.is_grad_enabled"), tuple(recompute)))
        kernel = _kernel_backward(self, saving)
        with_kernels = any(v.has(KernelGradient) for v in saving.vjps)
        formula_vjps = [formula_of_kernels(v) for v in saving.vjps]
        if with_kernels and kernel is None and not self.pure:
            # ATen's backward kernels (silu_backward, ...) have no derivative of their own:
            # first-order backward calls them, create_graph's the formula.
            kernel_statements, kernel_values, _ = self.gradients(list(saving.vjps), saving)
            kernel = (*kernel_statements, Return(tuple(kernel_values)))
        statements, final, helpers = self.gradients(formula_vjps, saving)
        numbers = tuple(s.name for s in saving.inputs if s in self.params)
        unpack = Unpack(tuple(saved), numbers) if saved else None
        if kernel is not None:
            condition = unary("not", call("torch.is_grad_enabled"))
            if self.norm is not None:
                for role in self.norm.roles[1:]:
                    condition = _and(condition, compare(attribute(role.name, "shape"), "==", _from_last(self.norm.roles[0])))
            head.append(If(condition, kernel))
        return Method(
            params=params, body=tuple(head) + tuple(statements), values=tuple(final), unpack=unpack, value_helpers=helpers
        )

    def gradients(self, vjps: list[sympy.Expr], saving: _Saving) -> tuple[list, list[Code], frozenset[str]]:
        """The statements and the returned gradients (shaped to their inputs) of ``vjps``."""
        groups = [self.shape_groups(v) if self.broadcasts else [v] for v in vjps]
        statements, reduced = self.cse([g for parts in groups for g in parts], "t")
        printed = iter(self.print(e) for e in reduced)
        parts_of = [[next(printed) for _ in parts] for parts in groups]
        values = [parts[0] for parts in parts_of]
        final: list[Code] = []
        helpers: frozenset[str] = frozenset()
        tensors = set(self.inputs) | set(self.adjoints) | set(self.result_symbols) | {s for s, _ in saving.stats}
        for j, (x, value) in enumerate(zip(self.inputs, values)):
            dims = self.value_dims(saving.vjps[j])
            shape = name(f"{x.name}_shape") if self.pure else attribute("ctx", f"{x.name}_shape")
            if vjps[j] != 0 and not vjps[j].free_symbols & tensors:
                # A gradient of numbers and params alone (--vjp x=1): a tensor of the upstream
                # gradient's shape, dtype and device, then shaped as any other.
                value = binop(call("torch.zeros_like", self.grads[0]), "+", value)
            if saving.vjps[j] == 0:
                final.append(NONE)
            elif self.broadcasts:
                shaped = [call("_reduced_to", part, shape) for part in [value, *parts_of[j][1:]]]
                final.append(sum_of(shaped))
                helpers = frozenset({"_reduced_to"})
            elif dims == EVERY or dims:
                final.append(method(value, "expand", shape))
            else:
                final.append(value)
        final += [NONE] * len(self.params)
        return statements, final, helpers

    def shape_groups(self, gradient: sympy.Expr) -> list[sympy.Expr]:
        """``gradient``'s terms, summed in groups of one shape (the same reduced dims): each
        group is then summed to the input's shape on its own. Summed together first, a term
        with a reduced dim would be broadcast along it and counted once per element there
        (``x*y - mean(x, -1)`` with x of shape (B, 1): the mean's term, a value per row,
        added to the (B, H) one, was summed H times)."""
        if not gradient.is_Add:
            return [gradient]
        groups: dict = {}
        for term in gradient.args:
            groups.setdefault(self.value_dims(term), []).append(term)
        if len(groups) == 1:
            return [gradient]
        ordered = sorted(groups.items(), key=lambda item: (item[0] == EVERY, sorted(item[0]) if item[0] != EVERY else []))
        return [sympy.Add(*terms) for _, terms in ordered]

    def jvp(self) -> tuple[Method, tuple[str, ...]]:
        if self.p.vjps:
            params = ("ctx", *(self.tangent_symbols[s].name for s in self.inputs), *(f"_{s.name}_tangent" for s in self.params))
            refusal = Raise(call("RuntimeError", string(_SURROGATE_REFUSAL.format(what="forward-mode AD (jvp)"))))
            return Method(params=params, body=(refusal,), values=(NONE,)), ()
        tangents = [self.counted_by_inputs(t) for t in jvp(list(self.outputs), self.tangent_symbols, self.inputs)]
        statements, reduced = self.cse(list(tangents), "u")
        values = [self.squeezed(e, self.reduced[i]) for i, e in enumerate(reduced)]
        used = set().union(*(t.free_symbols for t in tangents))
        kept = [s for s in self.inputs + self.params if s in used]
        numbers = tuple(s.name for s in kept if s in self.params)
        lines = self.unpack_inputs()
        in_backward = set(self._saving.inputs)
        for symbol in kept:
            if symbol in self.params and symbol not in in_backward:  # (backward's setup did not keep it)
                is_tensor = call("isinstance", symbol.name, "torch.Tensor")
                lines.append(Assign(f"ctx.{symbol.name}_number", if_else(is_tensor, NONE, symbol.name)))
        _, saved = self.save_parts(kept, "save_for_forward")
        lines.append(Line(method("ctx", "save_for_forward", *saved)))
        unpack = Unpack(tuple(s.name for s in kept), numbers) if kept else None
        params = ("ctx", *(self.tangent_symbols[s].name for s in self.inputs), *(f"_{s.name}_tangent" for s in self.params))
        if self._stats_count:
            values = values + [NONE] * self._stats_count
        return Method(params=params, body=tuple(statements), values=tuple(values), unpack=unpack), tuple(
            render_statements(lines)
        )

    # -- documentation ------------------------------------------------------------------

    def docstring(self, saving: _Saving) -> str:
        lines = []
        for i, f in enumerate(self.outputs):
            lines.append(f"f{i if len(self.outputs) > 1 else ''}({', '.join(s.name for s in self.inputs)}) = {f}")
        given = dict(self.p.vjps)
        for x, v in zip(self.inputs, saving.vjps):
            lines.append(f"grad_{x.name} = {v}" + ("   (surrogate, --vjp)" if x in given else ""))
        if given:
            lines += [
                "",
                "Reverse mode only: a --vjp backward gives no tangent, so jvp (torch.func.jvp, jacfwd)",
                "raises, and double backward differentiates the surrogate as written.",
            ]
        return "\n".join(lines)

    def saved_comment(self, saving: _Saving) -> tuple[str, ...]:
        parts = [s.name for s in saving.inputs] + [self.results[i] for i in saving.outputs]
        parts += [
            f"{s.name} = {node}" + ("" if isinstance(node, Softmax) else " (one value per row)") for s, node in saving.stats
        ]
        if not parts:
            return ("Saved for backward: nothing (the gradient reads no tensor).",)
        why = " (the gradient is written in the output)" if saving.outputs and not saving.inputs else ""
        return (f"Saved for backward: {', '.join(parts)}{why}.",)

    def metadata(self, saving: _Saving) -> str:
        saved = [s.name for s in saving.inputs] + [self.results[i] for i in saving.outputs] + [s.name for s, _ in saving.stats]
        data = {"expr": self.spec.expr, "inputs": [s.name for s in self.inputs], "saved": saved, "rowwise": True}
        return repr(data)


@dataclass(frozen=True)
class _NormKernel:
    """torch's fused kernel for a whole normalisation output: its forward call, the row
    values it returns (with their formulas, and the expression each stands for in the VJP)
    and, where ATen has one on every device, its backward call."""

    forward: Code  # the call, returning (output, *stats)
    stats: tuple[tuple[sympy.Symbol, sympy.Expr, sympy.Expr, sympy.Expr], ...]  # (symbol, formula, pattern, replacement)
    # the call, given the tensor of which gradients are needed; returns one gradient per
    # (x, w, b), in that order
    backward: "Callable[[Code], Code] | None"
    roles: tuple[sympy.Symbol, ...]  # x, w[, b]
    eps: sympy.Expr  # a positive number, or the param passed as the kernel's float eps


def match_norm_kernel(output: sympy.Expr, inputs: tuple, params: tuple) -> _NormKernel | None:
    """LayerNorm, ``(x - mean(x, -1))/sqrt(mean((x - mean(x, -1))**2, -1) + eps)*w + b``, and
    RMSNorm, ``x/sqrt(mean(x**2, -1) + eps)*w``, over the last dim, with inputs x, w (and b)
    and a param or number eps: torch's fused kernels (ATen's layer-norm backward too; its
    RMSNorm backward has no CPU kernel, so that backward is the formula)."""
    last = sympy.Tuple(sympy.Integer(-1))
    weight, bias, eps = sympy.Wild("w"), sympy.Wild("b"), sympy.Wild("eps")
    for x in inputs:
        mean = ReduceMean(x, last)
        variance = ReduceMean((x - mean) ** 2, last)
        found = output.match((x - mean) / sympy.sqrt(variance + eps) * weight + bias)
        if found and _roles_fit(found, x, inputs, params, bias=True):
            w, b, e = found[weight], found[bias], found[eps]
            rstd = sympy.Symbol("rstd", positive=True)
            mean_symbol = sympy.Symbol("mean", real=True)
            return _NormKernel(
                forward=call("torch.ops.aten.native_layer_norm", x.name, _last(x), w.name, b.name, _scalar(e)),
                stats=(
                    (mean_symbol, mean, mean, mean_symbol),
                    (rstd, 1 / sympy.sqrt(variance.xreplace({}) + e), variance + e, rstd**-2),
                ),
                backward=lambda needs: call(
                    "torch.ops.aten.native_layer_norm_backward",
                    "grad_output", x.name, _last(x), "mean", "rstd", w.name, b.name, _first(needs, 3),
                ),
                roles=(x, w, b),
                eps=e,
            )
        square = ReduceMean(x**2, last)
        found = output.match(x / sympy.sqrt(square + eps) * weight)
        if found and _roles_fit(found, x, inputs, params, bias=False):
            w, e = found[weight], found[eps]
            rstd = sympy.Symbol("rstd", positive=True)
            return _NormKernel(
                forward=call("torch.ops.aten._fused_rms_norm", x.name, _last(x), w.name, _scalar(e)),
                stats=((rstd, 1 / sympy.sqrt(square + e), square + e, rstd**-2),),
                backward=None,
                roles=(x, w),
                eps=e,
            )
    return None


def _last(x: sympy.Symbol) -> Code:
    """``(x.shape[-1],)``: the normalised shape, the last dim."""
    return tuple_of(subscript(attribute(x.name, "shape"), -1))


def _scalar(eps: sympy.Expr) -> Code:
    return name(eps.name) if eps.is_Symbol else number(float(eps))


def _from_last(x: sympy.Symbol) -> Code:
    """``x.shape[-1:]``."""
    return subscript(attribute(x.name, "shape"), ast.Slice(ast.UnaryOp(ast.USub(), ast.Constant(1)), None, None))


def _and(left: Code, right: Code) -> Code:
    """``left and right``, one chain where ``left`` is one already."""
    earlier = left.values if isinstance(left, ast.BoolOp) and isinstance(left.op, ast.And) else [left]
    return ast.BoolOp(ast.And(), [*earlier, right])


def _first(value: Code, stop: int) -> Code:
    """``value[:stop]``."""
    return subscript(value, ast.Slice(None, ast.Constant(stop), None))


def _roles_fit(found: dict, x: sympy.Symbol, inputs: tuple, params: tuple, bias: bool) -> bool:
    """Whether a match is the kernel's: w (and b) other inputs, eps a param or a positive number."""
    values = {w.name: v for w, v in found.items()}
    others = [values["w"]] + ([values["b"]] if bias else [])
    if any(v not in inputs or v == x for v in others) or len(set(others)) != len(others):
        return False
    if len(inputs) != 1 + len(others):
        return False
    eps = values["eps"]
    return eps in params or (eps.is_number and eps.is_positive)


_SURROGATE_REFUSAL = (
    "{what} is not defined for this Function: its backward is a --vjp surrogate, not a derivative"
)


def _kernel_backward(planner: _Planner, saving: _Saving):
    """First-order backward by torch's own kernel where one computes the whole VJP: layer
    norm's. (Softmax's and log_softmax's are the VJP's own nodes: math.reductions.SoftmaxBackward.)"""
    norm = planner.norm
    if norm is not None and norm.backward is not None:
        # (its gradients come in (x, w, b) order; the params' are None)
        gradients = {role: f"grad_{role.name}" for role in norm.roles}
        # (the kernel's output mask; --fuse's pure backward takes it as a parameter)
        needs = name("needs_input_grad") if planner.pure else attribute("ctx", "needs_input_grad")
        kernel = Assign(", ".join(gradients[r] for r in norm.roles), norm.backward(needs))
        values = [name(gradients[x]) for x in planner.inputs] + [NONE] * len(planner.params)
        return (kernel, Return(tuple(values)))
    return None


def compiled_form(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` as --fuse's bodies compute it: softmax, log_softmax and their backward
    kernels, and ATen's activation backward kernels, as their formulas (through the row's
    logsumexp), which inductor fuses with the rest of the body; a kernel call it would run
    as it is, one pass of its own."""

    def formula(node: sympy.Expr) -> sympy.Expr:
        return node.formula() if isinstance(node, SoftmaxBackward) else node

    return through_logsumexp(_bottom_up(formula_of_kernels(expr), formula))


def through_logsumexp(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with softmax ``exp(u - logsumexp(u))`` and log_softmax ``u - logsumexp(u)``:
    the row's logsumexp is then a value that backward can read saved from forward, and one
    that --fuse's bodies compute in one pass where they can (:func:`compiled_call`)."""

    def written(node: sympy.Expr) -> sympy.Expr:
        if type(node) is LogSoftmax:
            return node.operand - _LSE(node.operand, node.dims)
        if type(node) is Softmax:
            return sympy.exp(node.operand - _LSE(node.operand, node.dims))
        return node

    return _bottom_up(expr, written)


def compiled_call(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` (a compiled_form) with the calls --fuse's bodies print for inductor: each
    logsumexp along dims the module's ``_logsumexp`` (one pass over the row where no sum
    overflows: runtime.helpers), a gather's gradient a one-hot (_OneHot), an odd half
    power a square root's (_RootPower), and silu ``u*sigmoid(u)``: inductor computes a
    body's sigmoid once for both (SwiGLU's backward has each), where F.silu is an exp of
    its own."""
    expr = expr.replace(lambda e: isinstance(e, silu), lambda e: e.args[0] * sigmoid(e.args[0]))
    expr = expr.replace(lambda e: isinstance(e, _LSE) and bool(e.dims), lambda e: _OnePassLogSumExp(*e.args))
    expr = expr.replace(lambda e: isinstance(e, Scatter), lambda e: _OneHot(*e.args))
    return expr.replace(_is_odd_half_power, lambda e: _RootPower(e.base, 2 * e.exp))


class _OnePassLogSumExp(BackwardValue):
    """logsumexp(e, dims) printed as the module's ``_logsumexp(e, dims)``. Args as LogSumExp's."""

    def _symgrad_torch(self, printer) -> Code:
        operand, dims = self.args
        return call("_logsumexp", printer._print(operand), dims_code(dims))

    def _sympystr(self, printer) -> str:
        return printer._print(_LSE(*self.args))


class _OneHot(BackwardValue):
    """A gather's gradient as --fuse's bodies print it: ``where(class == t, a, 0)``, one
    elementwise value that inductor computes inside the loop that reads it. (Scatter's
    ``zeros_like(x).scatter(...)`` is a tensor inductor writes out in full, and reads back.)
    Args as Scatter's: a, t and the tensor whose shape it has."""

    def _symgrad_torch(self, printer) -> Code:
        values, index, like = self.args
        anchor = printer._print(sorted(like.free_symbols, key=str)[0])
        classes = call("torch.arange", subscript(attribute(anchor, "shape"), -1), device=attribute(anchor, "device"))
        picked = compare(classes, "==", method(printer._print(index), "unsqueeze", -1))
        return call("torch.where", picked, printer._print(values), 0)

    def _sympystr(self, printer) -> str:
        return f"scatter({printer._print(self.args[0])}, {printer._print(self.args[1])})"


def _is_odd_half_power(node: sympy.Basic) -> bool:
    """``b**(n/2)`` for an odd n other than 1 and -1 (cosine similarity's ``(a*b)**-1.5``)."""
    return node.is_Pow and node.exp.is_Rational and node.exp.q == 2 and abs(node.exp.p) > 1


class _RootPower(BackwardValue):
    """``b**(n/2)`` for an odd n as --fuse's bodies print it, ``rsqrt(b)**3`` for n = -3: a
    square root and multiplications. Inductor's CPU code computes a fractional power as a
    scalar ``std::pow`` for every element, even of a per-row value (a third of cosine
    similarity's backward). Args: b and n."""

    def _symgrad_torch(self, printer) -> Code:
        base, twice = self.args
        root = call("torch.rsqrt" if twice < 0 else "torch.sqrt", printer._print(base))
        return parens(binop(root, "**", number(abs(int(twice)))))

    def _sympystr(self, printer) -> str:
        return printer._print(sympy.Pow(self.args[0], self.args[1] / 2))


def stabilised(expr: sympy.Expr) -> sympy.Expr:
    """Textbook row-wise formulas as torch's stable kernels: ``exp(e)/sum(exp(e), d)`` is
    softmax, ``log(sum(exp(e), d))`` logsumexp, ``e - logsumexp(e, d)`` log_softmax,
    ``exp(e - logsumexp(e, d))`` softmax."""

    def rewrite(node: sympy.Expr) -> sympy.Expr:
        if node.is_Mul:
            # u*sigmoid(u) is torch's silu kernel (SwiGLU's gate): one pass, not two
            for factor in node.args:
                if isinstance(factor, sigmoid) and factor.args[0] in node.args:
                    u = factor.args[0]
                    rest = list(node.args)
                    rest.remove(factor)
                    rest.remove(u)
                    return sympy.Mul(*rest) * silu(u)
        if isinstance(node, sympy.log) and type(node.args[0]) is Softmax:
            return LogSoftmax(*node.args[0].args)
        if isinstance(node, sympy.log) and isinstance(node.args[0], ReduceSum):
            inner = node.args[0].operand
            if isinstance(inner, sympy.exp):
                return _lse(inner.args[0], node.args[0].dims)
        if node.is_Mul:
            sums = [a for a in node.args if a.is_Pow and a.exp == -1 and isinstance(a.base, ReduceSum)]
            for power in sums:
                inner = power.base.operand
                if isinstance(inner, sympy.exp) and inner in node.args and len(power.base.dims) == 1:
                    rest = [a for a in node.args if a is not power and a != inner]
                    return sympy.Mul(*rest) * Softmax(inner.args[0], power.base.dims)
        if isinstance(node, sympy.exp) and node.args[0].is_Add:
            for term in node.args[0].args:
                lse = -term
                if isinstance(lse, _LSE) and len(lse.dims) == 1 and node.args[0] - term == lse.operand:
                    return Softmax(lse.operand, lse.dims)
        if node.is_Add:
            for term in node.args:
                lse = -term
                if isinstance(lse, _LSE) and len(lse.dims) == 1 and (node - term) == lse.operand:
                    return LogSoftmax(lse.operand, lse.dims)
        return node

    # (softmax and log_softmax stay torch's kernels inside an expression too: one fused pass
    # each, where x - logsumexp(x) is a reduction and two more passes)
    return _bottom_up(expr, rewrite)




def _lse(operand: sympy.Expr, dims: sympy.Tuple) -> sympy.Expr:
    return _LSE(operand, dims)


# A param in a Count's operand: it may be a Python number, which has no shape (Count's
# printer skips it); a symbol, not 1, so that no term cancels ((1 - s)*gather(...)).
_NUMBER = sympy.Dummy("number", positive=True)


def _bottom_up(expr: sympy.Expr, rewrite) -> sympy.Expr:
    if not expr.args or isinstance(expr, (sympy.Tuple,)):
        return expr
    args = [_bottom_up(a, rewrite) if isinstance(a, sympy.Basic) else a for a in expr.args]
    node = expr.func(*args) if any(a is not b for a, b in zip(args, expr.args)) else expr
    return rewrite(node)


def _shapes_kept(vjps: tuple[sympy.Expr, ...], inputs) -> tuple[tuple[sympy.Expr, ...], tuple[sympy.Symbol, ...]]:
    """``vjps`` with each input they read only inside Counts (for a size: ``mean(x, -1)``'s
    ``1/H``) replaced there by its kept shape, and those inputs: backward then saves the
    shape, not the tensor."""
    counts = [node for v in vjps for node in sympy.preorder_traversal(v) if isinstance(node, Count)]
    outside = set().union(*(_counts_hidden(v).free_symbols for v in vjps))
    inside = set().union(*(c.free_symbols for c in counts))
    only = tuple(x for x in inputs if x in inside and x not in outside)
    if not only:
        return vjps, ()
    kept = {x: KeptShape(f"{x.name}_shape") for x in only}
    shaped = {c: c.xreplace(kept) for c in counts}
    return tuple(v.xreplace(shaped) for v in vjps), only


def _counts_hidden(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with each Count a Dummy: what it reads for its values, not for sizes."""
    return expr.xreplace({node: sympy.Dummy("count") for node in sympy.preorder_traversal(expr) if isinstance(node, Count)})


def _outside_counts(expr: sympy.Expr, replacements: dict) -> sympy.Expr:
    """``expr.xreplace(replacements)``, but not inside a Count: a count reads the shapes of
    the tensors its operand is computed from, which a saved row value does not have."""
    counts = {node: sympy.Dummy("count") for node in sympy.preorder_traversal(expr) if isinstance(node, Count)}
    hidden = expr.xreplace(counts)
    return hidden.xreplace(replacements).xreplace({v: k for k, v in counts.items()})


def _in_forward(node: sympy.Expr, outputs) -> bool:
    return any(node in set(sympy.preorder_traversal(f)) for f in outputs)


def _tuple(dims) -> sympy.Tuple:
    return sympy.Tuple(*(sympy.Integer(d) for d in sorted(dims)))


def _unsqueezed(value: str, dims) -> Code:
    """``value`` with the size-1 ``dims`` a reduced output dropped put back (ascending
    non-negative dims first, then negative ones from -1 down, so each lands in place)."""
    positive = sorted(d for d in dims if d >= 0)
    negative = sorted((d for d in dims if d < 0), reverse=True)
    code: Code = name(value)
    for d in positive + negative:
        code = method(code, "unsqueeze", d)
    return code
