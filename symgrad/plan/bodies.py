"""The method bodies: forward, backward and jvp, as statements over syntax trees (codegen.syntax).

:class:`Builder` holds one plan's state (names, gradient rows, the tensor the printer
follows); its collaborators build what saving, second derivatives, fused mode and the
docstring need (:mod:`.saved`, :mod:`.second_derivative`, :mod:`.fused`, :mod:`.docs`).
"""

from __future__ import annotations

import sympy

from ..derive import Derivation, differentiable_form
from ..rewrite.kernels import whole_gradient_kernel
from ..errors import SymgradError
from ..codegen.printer import helpers_used, print_tree
from ..codegen.syntax import (
    NONE,
    Code,
    attribute,
    binop,
    call,
    compare,
    first_present,
    method,
    name,
    parens,
    subscript,
    tuple_of,
)
from ..math.numbers import numbers_to_floats
from ..math.functions import expand_functions
from ..math.series import TaylorPolynomial
from .code import accumulate, sum_of, sum_of_present, times_upstream, with_helpers
from .inplace import reuse_buffers_in
from .ir import Assign, Comment, FirstOrderBranch, If, Line, Method, SecondDerivative, Statement
from .names import Names, SymbolStream
from .saved import Saving
from .second_derivative import SecondDerivatives

# Functions whose arguments must be tensors: a param passed as a Python number is
# converted once, with the inputs' dtype and device, before any of them sees it.
_TENSOR_CONTEXTS = (sympy.Function, sympy.Piecewise, sympy.Min, sympy.Max, sympy.core.relational.Relational)


class Builder:
    """Builds one plan's method bodies."""

    def __init__(self, derivation: Derivation, names: Names, rows, alias: str) -> None:
        # A float tensor in scope in the method being built (see TorchPrinter).
        self.reference: str | None = None
        self.d = derivation
        self.p = derivation.parsed
        self.names = names
        self.rows = rows
        self.alias = alias
        self.inputs = self.p.inputs
        self.params = self.p.params
        self.outputs = self.p.outputs
        self.n_out = len(self.outputs)
        self.live = [not nd for nd in derivation.nondifferentiable]
        # --save speed: the outputs past the user's are derivatives (derive.save_speed.with_derivatives_as_outputs).
        self.n_user = self.n_out - len(derivation.derivatives)
        self.speed = bool(derivation.derivatives)
        # Where several outputs have gradients, one the caller leaves unused gets None, not
        # zeros (setup_context: set_materialize_grads(False)), and its terms are skipped: a
        # materialised zero times that output's inf derivative would be nan (d(x*y)/dy of
        # "exp(y), x*y" where exp(y) overflows and only x*y is used). --save speed does so too.
        self.upstream_may_be_none = self.speed or sum(self.live[: self.n_user]) > 1
        # Names claimed on first use, and per-input counts of the terms speed_backward adds.
        self.term_name: str | None = None
        self.contributions = [0] * len(self.inputs)
        # Shapes are needed to un-broadcast gradients only when tensors can broadcast.
        self.broadcasts = len(self.inputs) + len(self.params) > 1
        # In fused mode the bodies are built as pure functions: every ``ctx`` attribute
        # they read becomes a parameter (see ``ctx_ref``).
        self.pure = False
        self.pure_params: dict[str, str] = {}  # ctx attribute -> parameter name
        self.pure_used: list[str] = []
        # Whether an eager body updates a temporary in place, or adds a sum's term by one
        # kernel (said in the docstring).
        self.reused = False
        self.fused_terms = False
        # Set by backward where double backward needs a Function of its own.
        self.second: SecondDerivative | None = None
        self.second_symbols: dict[tuple[int, int], sympy.Dummy] = {}  # its derivatives, by entry
        self.second_identities: set[str] = set()
        # Set where double backward needs its own Function but backward saved the output in
        # place of an input the Function takes (make_plan then tries the inputs).
        self.second_derivative_needs_inputs = False
        # The methods ("backward", "jvp") that multiply the upstream gradient or tangent
        # first, where only that order keeps the float16 contract (code.times_upstream);
        # set by the assembler before the bodies are built.
        self.upstream_first: frozenset[str] = frozenset()
        self.saving = Saving(self)
        self.second_derivatives = SecondDerivatives(self)

    def ctx_ref(self, ctx_attribute: str) -> Code:
        """``ctx.<attribute>`` in a method; a parameter of the same meaning in a pure function."""
        if not self.pure:
            return attribute("ctx", ctx_attribute)
        if ctx_attribute not in self.pure_params:
            self.pure_params[ctx_attribute] = self.names.namer.claim(ctx_attribute)
        if ctx_attribute not in self.pure_used:
            self.pure_used.append(ctx_attribute)
        return name(self.pure_params[ctx_attribute])

    # -- printing ---------------------------------------------------------------------
    def term(self) -> str:
        """The name of a term being added to a sum that may still be None (accumulate):
        one name for every method, each of which uses it locally."""
        if self.term_name is None:
            self.term_name = self.names.namer.claim("term")
        return self.term_name

    def name(self, symbol: sympy.Symbol) -> str:
        return self.names.symbols[symbol]

    def code(self, expr: sympy.Expr) -> Code:
        # A fused module's code runs under torch.compile (its bodies, and the value function
        # of --save speed); printer.COMPILED_CALLS keep inductor's kernels accurate there.
        return print_tree(
            expr, self.names.symbols, self.reference, compiled=self.p.spec.fuse, promote=self.promotes(self.reference)
        )

    def helpers(self, *exprs: sympy.Expr) -> frozenset[str]:
        """The module-level helpers that printing ``exprs`` (as :meth:`code` now would) calls."""
        found: set[str] = set()
        for expr in exprs:
            found |= helpers_used(
                expr, self.reference, compiled=self.p.spec.fuse, promote=self.promotes(self.reference)
            )
        return frozenset(found)

    def assign(self, symbol: sympy.Symbol, expr: sympy.Expr) -> Assign:
        """``name = expr``, printed."""
        return Assign(self.name(symbol), self.code(expr), self.helpers(expr))

    def cse(self, exprs: list[sympy.Expr]) -> tuple[list[tuple[sympy.Symbol, sympy.Expr]], list[sympy.Expr]]:
        exprs = [numbers_to_floats(expand_functions(e)) for e in exprs]
        stream = SymbolStream(self.names)
        temps, reduced = sympy.cse(exprs, symbols=stream, order="canonical")
        return _name_series_arguments(temps, reduced, stream)

    def promotes(self, reference: str | None) -> bool:
        """Whether ``reference`` is an input, which may be an integer tensor: a number made a
        tensor then takes the dtype torch's type promotion gives it with the input, as a
        Python number would (0.5 with an int64 input is float32; cast to int64 it was 0).
        Gradients and tangents are floating-point tensors."""
        return reference in {self.name(s) for s in self.inputs}

    def tensorize(self, exprs: list[sympy.Expr], reference: str) -> list[Statement]:
        """Statements converting number params to tensors where a torch function needs one."""
        statements: list[Statement] = []
        for param in self.params:
            if any(
                param in node.free_symbols
                for expr in exprs
                for node in sympy.preorder_traversal(expr)
                if isinstance(node, _TENSOR_CONTEXTS)
            ):
                param_name = self.name(param)
                promotes = self.promotes(reference)
                dtype = call("_dtype_with", reference, param_name) if promotes else attribute(reference, "dtype")
                helpers = frozenset({"_dtype_with"}) if promotes else frozenset()
                as_tensor = call("torch.as_tensor", param_name, dtype=dtype, device=attribute(reference, "device"))
                statements.append(Assign(param_name, as_tensor, helpers))
        return statements

    def live_rows(self):
        return [row for row, live in zip(self.rows, self.live) if live]

    def forward_params(self) -> tuple[str, ...]:
        return tuple(self.name(s) for s in self.inputs + self.params)

    def gradient_entries(self) -> list[tuple[int, int]]:
        """(output i, input j) of each gradient that is not zero."""
        return [
            (i, j) for i in range(self.n_out) for j in range(len(self.inputs)) if self.live[i] and self.rows[i][j] != 0
        ]

    # -- buffer reuse -----------------------------------------------------------------
    def eager(self, method: Method, differentiating: bool = False, gradients: tuple[str, ...] = ()) -> Method:
        """Under --fast, an eager body reuses its temporaries' buffers (symgrad.plan.inplace);
        by default it stays plain out-of-place arithmetic. Not --inplace, whose forward
        writes its input, and not fused bodies: inductor plans its own buffers.

        ``differentiating``: backward and jvp run only when an input is differentiated, so
        with a single input that input is floating (only floating tensors have gradients and
        tangents), and so is every output computed from it. ``gradients``: more parameters
        that hold gradients (SecondDerivative's backward's).
        """
        if self.p.spec.inplace or not self.p.spec.fast:
            return method
        gradients = frozenset(self.names.grad_outputs + self.names.tangents + gradients)
        tensors = frozenset(self.name(s) for s in self.inputs + self.names.results) | gradients
        floating = gradients
        if differentiating and len(self.inputs) == 1 and not self.params:
            floating = tensors
        params = frozenset(self.name(s) for s in self.params)
        reuse = reuse_buffers_in(method, tensors, floating, params)
        self.reused = self.reused or reuse.in_place
        self.fused_terms = self.fused_terms or reuse.fused_terms
        return reuse.method

    # -- forward ----------------------------------------------------------------------
    def forward(self, outputs: int | None = None) -> Method:
        """The forward body; with ``outputs``, only the first that many outputs."""
        exprs = list(self.d.forward[:outputs])
        temps, reduced = self.cse(exprs)
        reference = self.reference = self.name(self.inputs[0])
        body: list[Statement] = self.tensorize(exprs, reference)
        body += [self.assign(t, e) for t, e in temps]
        values = []
        returned = set()
        for index, (out, expr) in enumerate(zip(self.outputs[:outputs], reduced)):
            if not numbers_to_floats(expr).free_symbols:
                # CSE folded it: (x - 0.5)/(0.5 - x) is -1 once x - 0.5 is one temporary.
                # Printed, forward returned a number, which mark_non_differentiable refused;
                # derive refuses the constants it can see.
                where = f"output {index + 1}" if len(self.d.forward) > 1 else "the expression"
                shown = f"{float(expr):g}" if expr.is_real and expr.is_finite else expr
                raise SymgradError(f"{where} is constant ({shown}) wherever it is defined, so it has no gradient")
            code = self.code(expr)
            if out.reduction is None and (expr in returned or expr.is_Symbol and expr in self.inputs):
                # Never return an input, or one tensor twice (sin(x)*x, sin(x)*x): forward-mode
                # AD and torch.compile need every output to be a tensor of its own.
                code = method(code, "clone")
            returned.add(expr)
            if out.reduction is not None:
                code = method(parens(code), out.reduction)
            values.append(code)
        helpers = self.helpers(*reduced)
        if self.p.spec.inplace:
            return self.inplace_forward(body, values[0], helpers)
        return Method(self.forward_params(), tuple(body), tuple(values), value_helpers=helpers)

    def inplace_forward(self, body: list[Statement], value: Code, helpers: frozenset[str]) -> Method:
        target = self.name(self.inputs[0])
        result = self.name(self.names.results[0])
        saved = self.saving.saved()
        body.append(Assign(result, value, helpers))
        body += self.saving.shape_lines()
        save_names = []
        for symbol in saved:
            if symbol == self.inputs[0]:
                before = self.names.namer.claim(f"{target}_before")
                body.append(Assign(before, method(target, "clone")))
                save_names.append(before)
            else:
                save_names.append(target if symbol in self.names.results else self.name(symbol))
        param_lines, tensors = self.saving.save_parts("save_for_backward", save_names)
        body += param_lines
        # The other inputs and params backward reads: the write may change them (mul_(a, a)).
        kept = {k: name(k) for k in self.saving.inplace_readers()}
        overwrite = frozenset({"_overwrite"})
        if kept:
            body.append(Assign("ctx.overwritten", call("_overwrite", target, result, **kept), overwrite))
        else:
            body.append(Line(call("_overwrite", target, result), overwrite))
        body.append(Line(method("ctx", "mark_dirty", target)))
        if tensors:
            body.append(Line(method("ctx", "save_for_backward", *tensors)))
        return Method(self.forward_params(), tuple(body), (name(target),))

    # -- backward ---------------------------------------------------------------------
    def backward(self, saved: list[sympy.Symbol], with_unpack: bool = True) -> Method:
        if self.speed:
            return self.speed_backward(saved, with_unpack)
        unpack = self.saving.unpack_saved(saved) if with_unpack else None
        # All gradients share one CSE, so work common to several inputs is done once.
        entries = self.gradient_entries()
        kernels = [self.first_order_kernel(j) for j in range(len(self.inputs))]
        # Where a kernel computes the first-order gradient, the formula runs only for double
        # backward, so it takes the form whose autograd derivative is finite.
        exprs = [differentiable_form(self.rows[i][j]) if kernels[j] else self.rows[i][j] for i, j in entries]
        create_graph = None if self.pure else self.second_derivatives.create_graph_branch(entries, exprs)
        body: list[Statement] = [create_graph] if create_graph else []
        if create_graph:
            exprs = [self.rows[i][j] for i, j in entries]  # first order only from here
        rewritten = {j for (i, j), expr in zip(entries, exprs) if expr != self.rows[i][j]}
        temps, reduced = self.cse(exprs)
        reference = self.reference = self.names.grad_outputs[self.live.index(True)]
        body += self.tensorize(exprs, reference)
        users = _temp_users(temps, reduced, [j for _, j in entries])
        body += [self.assign(t, e) for t, e in temps if len(users[t]) > 1]
        grads = []
        # Backward runs only when some input needs a gradient: with one input, that one.
        only_input = self.single_tangent() and not self.p.spec.fast and not self.pure
        for j, symbol in enumerate(self.inputs):
            grad = self.names.grads[j]
            terms = [(self.backward_term(i, expr), expr) for (i, jj), expr in zip(entries, reduced) if jj == j]
            if not (only_input and terms):
                body.append(Assign(grad, NONE))
            grads.append(grad)
            if not terms:
                continue
            condition = None if only_input else subscript(self.ctx_ref("needs_input_grad"), j)
            branch: list[Statement] = [self.assign(t, e) for t, e in temps if users[t] == {j}]
            codes = [code for code, _ in terms]
            if self.broadcasts:
                # Each term is reduced on its own: outputs can have different shapes (exp(y) and
                # x*y), and a smaller term broadcast into a sum first would be counted repeatedly.
                shape = self.ctx_ref(self.name(symbol) + "_shape")
                codes = [method(parens(code), "sum_to_size", shape) for code in codes]
            helpers = self.helpers(*(e for _, e in terms))
            if self.upstream_may_be_none:
                outputs = [i for (i, jj) in entries if jj == j]
                branch += self.sum_of_present_terms(grad, outputs, codes, helpers)
            else:
                branch.append(Assign(grad, sum_of(codes), helpers))
            kernel = kernels[j]
            if kernel is not None and create_graph:
                branch = [
                    Comment("First order: ATen's backward kernel, fewer passes over memory."),
                    Assign(grad, *kernel),
                ]
            elif kernel is not None:
                branch = [_first_order_branch(grad, kernel, branch, sech_as_sigmoids=j in rewritten)]
            last = branch[-1]
            if condition is None and isinstance(last, Assign) and last.target == grad:
                if all(isinstance(s, Comment) for s in branch[:-1]):
                    # (returned as it is computed)
                    return Method(
                        ("ctx",) + self.names.grad_outputs,
                        (*body, *branch[:-1]),
                        (last.value,),
                        unpack=unpack,
                        value_helpers=last.helpers,
                    )
            body += branch if condition is None else [If(condition, tuple(branch))]
        values = tuple(name(g) for g in grads) + (NONE,) * len(self.params)
        return Method(("ctx",) + self.names.grad_outputs, tuple(body), values, unpack=unpack)

    def sum_of_present_terms(
        self, grad: str, outputs: list[int], codes: list[Code], helpers: frozenset[str]
    ) -> list[Statement]:
        """Statements adding to ``grad`` (None until then) each term whose output got a
        gradient: ``codes[n]`` is output ``outputs[n]``'s term."""
        grad_outputs = [self.names.grad_outputs[i] for i in outputs]
        term_name = self.term() if len(codes) > 1 else None
        statements = sum_of_present(grad, list(zip(grad_outputs, codes)), term_name)[1:]  # (grad is None already)
        return with_helpers(statements, helpers)

    def first_order_kernel(self, j: int) -> tuple[Code, frozenset[str]] | None:
        """The call of an ATen backward kernel (symgrad.rewrite.kernels) that computes input ``j``'s
        whole gradient, and the helpers it calls; or None (always in fused bodies:
        whole_gradient_kernel refuses --fuse)."""
        live = [i for i in range(self.n_out) if self.live[i] and self.rows[i][j] != 0]
        if self.upstream_may_be_none:
            return None  # (its gradient is a sum of terms that may be absent)
        terms = [(self.rows[i][j], self.outputs[i].reduction) for i in live]
        found = whole_gradient_kernel(self.p.spec, self.inputs, self.params, terms)
        if found is None:
            return None
        code = found.code(self.names.grad_outputs[live[0]], lambda e: self.code(numbers_to_floats(e)))
        return code, self.helpers(found.argument)

    def speed_backward(self, saved: list[sympy.Symbol], with_unpack: bool) -> Method:
        """--save speed: multiply by the derivatives forward returned; differentiate them again
        only when they received a gradient themselves (double backward).

        Gradients are not materialised (setup_context), so an output that got none has
        ``None`` here and costs nothing.
        """
        unpack = self.saving.unpack_saved(saved) if with_unpack else None
        grads = list(self.names.grads)
        body: list[Statement] = [Assign(" = ".join(grads), NONE)]
        self.contributions = [0] * len(self.inputs)
        first = [i for i in range(self.n_user) if self.live[i]]
        second = [i for i in range(self.n_user, self.n_out) if self.live[i]]
        self.reference = self.name(self.names.results[self.n_user])
        # Number params that torch functions take (in recomputed entries and second derivatives).
        body += self.tensorize([g for i in first + second for g in self.rows[i]], self.reference)
        for i in first:
            branch: list[Statement] = []
            for j in range(len(self.inputs)):
                if self.rows[i][j] != 0:
                    expr = self.rows[i][j]
                    condition = subscript(self.ctx_ref("needs_input_grad"), j)
                    added = self.accumulate(j, self.backward_term(i, expr), self.helpers(expr))
                    branch.append(If(condition, tuple(added)))
            body.append(If(compare(self.names.grad_outputs[i], "is not", None), tuple(branch)))
        for m in second:
            entries = [j for j in range(len(self.inputs)) if self.rows[m][j] != 0]
            branch = []
            if m == second[0]:
                branch.append(
                    Comment("Double backward: the derivative is an output too, so it is differentiated again.")
                )
            exprs = [self.rows[m][j] for j in entries]
            temps, reduced = self.cse(exprs)
            branch += [self.assign(t, e) for t, e in temps]
            for j, expr in zip(entries, reduced):
                condition = subscript(self.ctx_ref("needs_input_grad"), j)
                added = self.accumulate(j, self.backward_term(m, expr), self.helpers(expr))
                branch.append(If(condition, tuple(added)))
            body.append(If(compare(self.names.grad_outputs[m], "is not", None), tuple(branch)))
        values = tuple(name(g) for g in grads) + (NONE,) * len(self.params)
        return Method(("ctx",) + self.names.grad_outputs, tuple(body), values, unpack=unpack)

    def accumulate(self, j: int, term: Code, helpers: frozenset[str]) -> list[Statement]:
        """Statements adding ``term`` to input ``j``'s gradient, which may still be None."""
        grad = self.names.grads[j]
        self.contributions[j] += 1
        if self.broadcasts:
            # Reduced term by term: the outputs (derivatives included) differ in shape.
            term = method(parens(term), "sum_to_size", self.ctx_ref(self.name(self.inputs[j]) + "_shape"))
        term_name = self.term() if self.contributions[j] > 1 else None
        return with_helpers(accumulate(grad, term, self.contributions[j] == 1, term_name), helpers)

    def backward_term(self, output: int, expr: sympy.Expr) -> Code:
        grad_output: Code = name(self.names.grad_outputs[output])
        reduction = self.outputs[output].reduction
        if reduction == "mean":
            # The 0-d gradient is divided first: one scalar operation, where dividing the
            # expanded product would be a pass over memory of its own.
            count = method(self.ctx_ref(self.saving.shape_attr(output)), "numel")
            grad_output = parens(binop(grad_output, "/", count))
        # A 0-d gradient (of a reduction) is multiplied first: the numbers join it in scalar ops.
        first = reduction is not None or "backward" in self.upstream_first
        code = times_upstream(grad_output, self.code(expr), expr, upstream_first=first)
        if reduction is not None:
            code = method(parens(code), "expand", self.ctx_ref(self.saving.shape_attr(output)))
        return code

    # -- jvp --------------------------------------------------------------------------
    def grad_only_params(self) -> set[sympy.Symbol]:
        """The params that appear only in a ``--grad`` surrogate, not in the outputs."""
        used = set().union(*(expr.free_symbols for expr in self.d.forward))
        return {p for p in self.params if p not in used}

    def single_tangent(self) -> bool:
        """Whether jvp gets exactly one tangent, which is never None."""
        return len(self.inputs) == 1 and not self.params

    def jvp(self, saved: list[sympy.Symbol], with_unpack: bool = True) -> Method:
        unpack = self.saving.unpack_saved(saved) if with_unpack else None
        body: list[Statement] = []
        entries = self.gradient_entries()
        # Reverse mode over this jvp (torch.func.jacrev of jacfwd) differentiates its formulas
        # as they stand, and jvp cannot tell when (torch.func hides requires_grad here): so
        # they take the forms whose derivatives are right. The derivatives SecondDerivative
        # serves come from it, whose backward is exact (autograd's derivative of softplus's
        # sigmoid(x) is 0 at x = 20 in float32); the others take differentiable_form (tanh's
        # 1/cosh(x)**2 had a nan derivative from |x| = 90).
        # (second_symbols is set by create_graph_branch: backward is built first.)
        exprs = [self.second_symbols.get((i, j), differentiable_form(self.rows[i][j])) for i, j in entries]
        if self.second_symbols:
            body.append(Comment("Exact in reverse mode too (torch.func.jacrev of jacfwd differentiates this jvp)."))
            body.append(self.second_derivatives.call())
        temps, reduced = self.cse(exprs)
        # A saved tensor is always there; a tangent may be None, but not all of them are.
        if saved:
            self.reference = self.name(saved[0])
        elif len(self.names.tangents) == 1:
            self.reference = self.names.tangents[0]
        else:
            self.reference = self.names.namer.claim("reference")
            body.append(Assign(self.reference, first_present("t", tuple_of(*self.names.tangents))))
        body += self.tensorize(exprs, self.reference)
        body += [self.assign(t, e) for t, e in temps]
        returns = []
        single = self.single_tangent()
        if not single:
            self.term()  # (claimed before the tangents' names, which then stay as they were)
        surrogate_only = self.grad_only_params()
        for i, out in enumerate(self.outputs):
            result = self.name(self.names.results[i])
            tangent = self.names.namer.claim(f"{result}_tangent")
            if not self.live[i]:
                returns.append(NONE)
                continue
            terms = [
                (
                    j,
                    self.jvp_term(j, expr, self.saving.shape_attr(i) if expr.free_symbols & surrogate_only else None),
                    expr,
                )
                for (ii, j), expr in zip(entries, reduced)
                if ii == i
            ]
            helpers = self.helpers(*(expr for _, _, expr in terms))
            if any(expr.free_symbols & surrogate_only for _, _, expr in terms):
                helpers |= {"_reduced_to"}
            if single:
                value = terms[0][1]
                if out.reduction is not None:
                    expanded = method(parens(value), "expand", self.ctx_ref(self.saving.shape_attr(i)))
                    value = method(expanded, out.reduction)
                if self.n_out == 1 and not self.p.spec.fast:
                    return Method(
                        ("ctx",) + self.names.tangents, tuple(body), (value,), unpack=unpack, value_helpers=helpers
                    )
                body.append(Assign(tangent, value, helpers))
            else:
                present = [(self.names.tangents[j], term) for j, term, _ in terms]
                body += with_helpers(sum_of_present(tangent, present, self.term()), helpers)
                dtype = self.ctx_ref(f"{result}_dtype")
                device = attribute(self.reference, "device")
                body.append(
                    If(
                        compare(tangent, "is", None),
                        (
                            Comment("No given tangent reaches this output: its tangent is a zero of its dtype."),
                            Assign(tangent, call("torch.zeros", tuple_of(), dtype=dtype, device=device)),
                        ),
                    )
                )
                # The engine does not broadcast tangents: each must have its output's shape.
                value = method(tangent, "expand", self.ctx_ref(self.saving.shape_attr(i)))
                body.append(Assign(tangent, method(value, out.reduction) if out.reduction is not None else value))
            returns.append(name(tangent))
        return Method(("ctx",) + self.names.tangents, tuple(body), tuple(returns), unpack=unpack)

    def jvp_term(self, j: int, expr: sympy.Expr, reduce_to: str | None = None) -> Code:
        """Input ``j``'s tangent times ``expr``; with ``reduce_to`` (the ctx attribute of the
        output's shape), summed over the dimensions it has beyond it: a surrogate gradient
        that reads a param the output does not may broadcast beyond the output (lam of shape
        (3, 1) for x of shape (2,)), and backward sums it so. Each such term alone: summed
        after the others were added, they would be counted once per extra row."""
        tangent = name(self.names.tangents[j])
        term = times_upstream(tangent, self.code(expr), expr, upstream_first="jvp" in self.upstream_first)
        return call("_reduced_to", term, self.ctx_ref(reduce_to)) if reduce_to else term


def _first_order_branch(
    grad: str, kernel: tuple[Code, frozenset[str]], formula: list[Statement], sech_as_sigmoids: bool = False
) -> FirstOrderBranch:
    """A gradient: the kernel's call unless autograd records backward (double backward), the
    formula then (see derive.second_order.differentiable_form for ``sech_as_sigmoids``)."""
    why = (
        [
            Comment("1/cosh(u)**2 is 4*sigmoid(2*u)*sigmoid(-2*u) here: autograd's derivative of the"),
            Comment("cosh is inf*0 = nan where it overflows (|u| > 89 in float32)."),
        ]
        if sech_as_sigmoids
        else []
    )
    return FirstOrderBranch(
        kernel=(Comment("First order: ATen's fused backward kernel, fewer passes over memory."), Assign(grad, *kernel)),
        formula=(
            Comment("create_graph=True: the formula, which double backward differentiates exactly."),
            *why,
            *formula,
        ),
    )


def _name_series_arguments(temps, reduced, stream: SymbolStream):
    """Give each Taylor polynomial's argument a temporary of its own, defined before its
    first use: the polynomial prints its argument once per term, and CSE leaves in place
    a subexpression that occurs only once (the guarded ``x`` of a Removable)."""
    named: dict[sympy.Expr, sympy.Symbol] = {}
    ordered: list[tuple[sympy.Symbol, sympy.Expr]] = []

    def with_named_argument(node: sympy.Expr) -> sympy.Expr:
        argument = node.args[0]
        if argument.is_Symbol:
            return node
        if argument not in named:
            named[argument] = next(stream)
            ordered.append((named[argument], argument))
        return type(node)(named[argument])

    def rewrite(expr: sympy.Expr) -> sympy.Expr:
        return expr.replace(lambda node: isinstance(node, TaylorPolynomial), with_named_argument)

    for temp, expr in temps:
        expr = rewrite(expr)
        ordered.append((temp, expr))
    reduced = [rewrite(expr) for expr in reduced]
    return ordered, reduced


def _temp_users(temps, reduced, groups: list[int]) -> dict[sympy.Symbol, set[int]]:
    """For each temporary, the set of groups (input indices) whose expressions use it."""
    users: dict[sympy.Symbol, set[int]] = {t: set() for t, _ in temps}
    for expr, group in zip(reduced, groups):
        for symbol in expr.free_symbols:
            if symbol in users:
                users[symbol].add(group)
    # A temporary used by another temporary inherits that one's users (reverse order).
    for temp, expr in reversed(temps):
        for symbol in expr.free_symbols:
            if symbol in users:
                users[symbol] |= users[temp]
    return users
