"""Stage 3: common subexpressions, what backward saves, and every name in the code.

Everything the templates print is decided here; they only loop over the lines.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from .derive import (
    IDENTITIES,
    Derivation,
    autograd_loses_second_derivatives,
    differentiable_form,
    exact_second_derivatives,
    op_count,
    with_derivatives_as_outputs,
)
from .errors import SymgradError
from .inplace import FUSED_TERM, IN_PLACE_CALL, reuse_buffers
from .rewrite.kernels import whole_gradient_kernel
from .naming import RESERVED, Namer, check_class_name
from .math.numbers import numbers_to_floats
from .codegen.printer import COMPILED_CALLS, HELPERS, print_torch
from .math.functions import expand_functions
from .math.series import TaylorPolynomial

INDENT = "    "
# Functions whose arguments must be tensors: a param passed as a Python number is
# converted once, with the inputs' dtype and device, before any of them sees it.
_TENSOR_CONTEXTS = (sympy.Function, sympy.Piecewise, sympy.Min, sympy.Max, sympy.core.relational.Relational)


@dataclass(frozen=True)
class Method:
    """One generated staticmethod: its parameters, body lines and return expression."""

    params: tuple[str, ...]
    lines: tuple[str, ...]
    returns: str


@dataclass(frozen=True)
class Fused:
    """Fused mode: the pure tensor functions that ``torch.compile`` runs.

    Each is a module-level function of tensors (and numbers, flags and shapes) only, with
    no ``ctx``: the Function's methods unpack ``ctx`` and call them through ``runner``,
    which compiles each on first use and runs it eagerly where compiling cannot work.
    """

    runner: str
    cache: str
    # The module constant that a body's operations times (8192 + the elements of the result
    # its tensors broadcast to) must stay below for it to run eagerly on a CPU (small
    # tensors; templates/fused.py.jinja).
    eager_work: str
    forward_name: str
    forward: Method
    # None under --save speed: backward is one multiplication per input, which runs eagerly
    # (compiling it would add a guarded call and fuse nothing).
    backward_name: str | None
    backward: Method | None
    jvp_name: str
    jvp: Method
    # The docstring's paragraph on which bodies run compiled and which eagerly, and why.
    description: tuple[str, ...] = ()
    # Plan.helpers again, for fused templates written before those served every module.
    helpers: tuple[str, ...] = ()


@dataclass(frozen=True)
class SecondDerivative:
    """A Function computing d(result)/d(input), whose backward and jvp are the symbolic
    second derivative: what backward calls under create_graph=True, in place of a formula
    whose autograd derivative is not finite or not accurate."""

    class_name: str
    inputs: tuple[str, ...]  # the inputs its derivatives depend on
    params: tuple[str, ...]  # the params they depend on, passed after the inputs
    entries: tuple[tuple[int, int], ...]  # the (output, input) pairs whose derivatives it returns
    derivatives: tuple[str, ...]  # forward's outputs, d(result)/d(input) for each of ``entries``
    forward: Method
    setup_context: Method
    backward: Method
    jvp: Method


@dataclass(frozen=True)
class Plan:
    """Stage-3 result: everything a template prints, as strings."""

    class_name: str
    no_jvp_class: str
    alias: str
    public_params: tuple[str, ...]
    call_args: tuple[str, ...]
    # What the alias keeps of ``apply``'s outputs: "" (all), or "[0]"/"[:n]" under --save
    # speed, where the outputs past the user's are derivatives.
    public_outputs: str
    docstring: str
    saved_comment: tuple[str, ...]
    forward: Method
    setup_context: Method
    backward: Method
    jvp: Method
    setup_forward_ad: tuple[str, ...]
    metadata: str
    inplace: bool
    refuses_double_backward: bool  # in place, with a copy of the input that is not in the graph
    surrogate: bool
    fused: Fused | None = None
    # --save speed: a module-level function computing the outputs alone, and how the alias
    # calls it when grad mode is off (inference needs no derivatives).
    value_name: str | None = None
    value: Method | None = None
    value_call: str | None = None
    # The forward of the torch.compile twin (no_jvp_class) where ``forward`` writes its
    # temporaries in place; None where the two are the same. See _Builder.compiled_forward.
    compiled_forward: Method | None = None
    # Double backward's own Function, where autograd's derivative of the create_graph formula
    # would be nan or inaccurate (derive.autograd_loses_second_derivatives).
    second_derivative: SecondDerivative | None = None
    # Module-level helper functions the module's code calls (printer.HELPERS), as lines.
    helpers: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Names:
    symbols: dict[sympy.Symbol, str]  # inputs, params, results, temporaries
    public: dict[sympy.Symbol, str]
    results: tuple[sympy.Symbol, ...]
    grad_outputs: tuple[str, ...]
    grads: tuple[str, ...]
    tangents: tuple[str, ...]
    temporaries: "object"
    namer: Namer


def make_plan(derivation: Derivation) -> Plan:
    """Decide names, CSE temporaries and saved tensors for a derivation."""
    parsed = derivation.parsed
    alias = check_class_name(parsed.spec.name)
    if parsed.spec.save == "speed":
        if parsed.spec.inplace:
            raise SymgradError("--save speed and --inplace cannot be combined: an in-place Function has one output")
        derivation = with_derivatives_as_outputs(derivation)
    names = _assign_names(derivation, alias)
    builder = _Builder(derivation, names, _rows(derivation, names), alias)
    plan = builder.build()
    if builder.second_derivative_needs_inputs:
        # Double backward needs the inputs that a gradient written with the output does not
        # save: where the inputs cost no more tensors, backward takes them instead, and
        # first-order backward recomputes what it had read from the output.
        names = _assign_names(derivation, alias)
        rows = _rows(derivation, names, avoid_results=True)
        if rows is not None:
            plan = _Builder(derivation, names, rows, alias).build()
    return plan


def _rows(derivation: Derivation, names: _Names, avoid_results: bool = False) -> tuple[tuple[sympy.Expr, ...], ...] | None:
    """The gradient rows backward prints (_choose_saved_forms), with the derivatives forward
    returned in place of theirs; None where ``avoid_results`` and every choice that saves no
    output saves more tensors."""
    rows = _choose_saved_forms(derivation, names, avoid_results)
    if rows is None:
        return None
    n_user = len(derivation.parsed.outputs) - len(derivation.derivatives)
    for k, entries in enumerate(derivation.derivatives):
        for i, j in entries:
            # Backward multiplies by the derivative forward returned, instead of recomputing it.
            rows[i] = rows[i][:j] + (names.results[n_user + k],) + rows[i][j + 1 :]
    return tuple(rows)


def _assign_names(derivation: Derivation, alias: str) -> _Names:
    parsed = derivation.parsed
    spec = parsed.spec
    n_out = len(parsed.outputs)
    module_level = {spec.name, f"_{spec.name}NoJvp", _derivative_class(spec.name), alias, "torch", _value_name(alias)}
    if spec.fuse:
        module_level |= set(_fused_names(alias).values()) | set(COMPILED_CALLS.values())
    # Builtins the generated bodies call, which a user symbol must not shadow.
    builtins_used = {"isinstance", "getattr"}
    # Names the bodies may use: printer.HELPERS too, which the public signature below need
    # not avoid, as the alias calls none (a user's `_erfcx` keeps its keyword there).
    in_bodies = module_level | set(HELPERS) | builtins_used
    # User symbols first avoid every name the generated code uses for itself ...
    user_namer = Namer(RESERVED | in_bodies)
    internal = {s: user_namer.claim(s.name) for s in parsed.inputs + parsed.params}
    # ... then symgrad's own names avoid the users' (a user may call a symbol ``t0``).
    namer = Namer(set(internal.values()) | in_bodies)
    # The public signature keeps the user's names; only ``torch`` (which the alias body
    # calls) and the module-level names must differ.
    public_namer = Namer(module_level)
    public = {s: public_namer.claim(s.name) for s in parsed.inputs + parsed.params}
    n_user = n_out - len(derivation.derivatives)
    results = tuple(sympy.Dummy(f"result{i}") for i in range(n_out))
    result_names = ["result"] if n_user == 1 else [f"result{i}" for i in range(n_user)]
    grad_names = ["grad_output"] if n_user == 1 else [f"grad_output{i}" for i in range(n_user)]
    # --save speed: d(result)/d(x) is returned as an output named dresult_dx.
    for (i, j), *_ in derivation.derivatives:
        result_names.append(f"d{result_names[i]}_d{internal[parsed.inputs[j]]}")
        grad_names.append(f"grad_{result_names[-1]}")
    symbols = dict(internal)
    symbols.update({r: namer.claim(n) for r, n in zip(results, result_names)})
    grad_outputs = tuple(namer.claim(n) for n in grad_names)
    grads = tuple(namer.claim(f"grad_{internal[s]}") for s in parsed.inputs)
    tangents = tuple(namer.claim(f"{internal[s]}_tangent") for s in parsed.inputs + parsed.params)
    return _Names(symbols, public, results, grad_outputs, grads, tangents, namer.numbered("t"), namer)


def _derivative_class(name: str) -> str:
    """The module-level Function computing d(result)/d(input) for double backward (SecondDerivative)."""
    return f"_{name}Derivative"


def _value_name(alias: str) -> str:
    """The module-level function that computes a --save speed module's outputs alone."""
    return f"_{alias}_value"


def _with_helpers(plan: Plan) -> Plan:
    """``plan`` with the source of each printer.HELPERS function its code calls (in every
    method the templates print: the fused bodies, the value function and the
    second-derivative Function's too)."""
    methods = [plan.forward, plan.setup_context, plan.backward, plan.jvp, plan.value, plan.compiled_forward]
    if plan.fused:
        methods += [plan.fused.forward, plan.fused.backward, plan.fused.jvp]
    if plan.second_derivative:
        second = plan.second_derivative
        methods += [second.forward, second.setup_context, second.backward, second.jvp]
    code = "\n".join(line for m in methods if m is not None for line in (*m.lines, m.returns))
    called: set[str] = set()
    while True:  # (and the helpers those call: _float32_for_half calls _half_of)
        found = {name for name in HELPERS if re.search(rf"\b{name}\(", code)} - called
        if not found:
            break
        called |= found
        code = "\n".join(line for name in sorted(found) for line in HELPERS[name])
    helpers: list[str] = []
    for name, source in sorted(HELPERS.items()):
        if name in called:
            helpers += [*source, "", ""]
    fused = plan.fused and dataclasses.replace(plan.fused, helpers=tuple(helpers))
    return dataclasses.replace(plan, helpers=tuple(helpers), fused=fused)


def _fused_names(alias: str) -> dict[str, str]:
    """Module-level names used only by fused modules."""
    return {
        "runner": "_fused",
        "cache": "_COMPILED",
        "eager_work": "_EAGER_WORK_LIMIT",
        "forward": f"_{alias}_forward",
        "backward": f"_{alias}_backward",
        "jvp": f"_{alias}_jvp",
    }


def _choose_saved_forms(
    derivation: Derivation, names: _Names, avoid_results: bool = False
) -> list[tuple[sympy.Expr, ...]] | None:
    """Per output, the gradient row to print: in terms of inputs, or of the output.

    Like PyTorch's ``exp: grad * result``, a row may be rewritten in terms of its own
    output when that is exact (a structural substitution) and cheaper. The choice that
    saves the fewest tensors, then costs the fewest operations, wins. With
    ``avoid_results``, the cheapest that saves no output and no more tensors than that
    winner; None where there is none, or where it is the winner already.
    """
    parsed = derivation.parsed
    options = []
    for index, (out, row) in enumerate(zip(parsed.outputs, derivation.gradients)):
        choices = [row]
        forward = derivation.forward[index]
        if out.reduction is None and not forward.is_Symbol:
            substituted = tuple(g.subs(forward, names.results[index]) for g in row)
            if substituted != row:
                choices.append(substituted)
        options.append(choices)
    tensors = set(parsed.inputs) | set(names.results)
    # In place, saving the overwritten input means saving a copy of it, which also
    # loses double backward: avoid that first.
    overwritten = set(parsed.inputs[:1]) if parsed.spec.inplace else set()

    def cost(rows: tuple[tuple[sympy.Expr, ...], ...]) -> tuple[int, int, int]:
        used = set().union(*(g.free_symbols for row in rows for g in row)) & tensors
        return len(used & overwritten), len(used), sum(op_count(g) for row in rows for g in row)

    choices = list(itertools.product(*options))
    best = min(choices, key=cost)
    if not avoid_results:
        return list(best)
    without = [rows for rows in choices if not any(g.has(*names.results) for row in rows for g in row)]
    best_without = min(without, key=cost) if without else None
    if best_without is None or best_without == best or cost(best_without)[:2] > cost(best)[:2]:
        return None
    return list(best_without)


class _Builder:
    def __init__(self, derivation: Derivation, names: _Names, rows, alias: str) -> None:
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
        # --save speed: the outputs past the user's are derivatives (derive.with_derivatives_as_outputs).
        self.n_user = self.n_out - len(derivation.derivatives)
        self.speed = bool(derivation.derivatives)
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
        # Whether an eager body updates a temporary in place (said in the docstring).
        self.reused = False
        # Whether an eager body adds a sum's term by one kernel (said in the docstring).
        self.fused_terms = False
        # Set by backward where double backward needs a Function of its own.
        self.second: SecondDerivative | None = None
        self.second_symbols: dict[tuple[int, int], sympy.Dummy] = {}  # its derivatives, by entry
        self.second_identities: set[str] = set()
        # Set where double backward needs its own Function but backward saved the output in
        # place of an input the Function takes (make_plan then tries the inputs).
        self.second_derivative_needs_inputs = False

    def ctx_ref(self, attribute: str) -> str:
        """``ctx.<attribute>`` in a method; a parameter of the same meaning in a pure function."""
        if not self.pure:
            return f"ctx.{attribute}"
        if attribute not in self.pure_params:
            wanted = attribute.split("[")[0]
            self.pure_params[attribute] = self.names.namer.claim(wanted)
        name = self.pure_params[attribute]
        if attribute not in self.pure_used:
            self.pure_used.append(attribute)
        return name

    # -- helpers ----------------------------------------------------------------------
    def term(self) -> str:
        """The name of a term being added to a sum that may still be None (_accumulate):
        one name for every method, each of which uses it locally."""
        if self.term_name is None:
            self.term_name = self.names.namer.claim("term")
        return self.term_name

    def name(self, symbol: sympy.Symbol) -> str:
        return self.names.symbols[symbol]

    def code(self, expr: sympy.Expr) -> str:
        # A fused module's code runs under torch.compile (its bodies, and the value function
        # of --save speed); printer.COMPILED_CALLS keep inductor's kernels accurate there.
        return print_torch(
            expr, self.names.symbols, self.reference, compiled=self.p.spec.fuse, promote=self.promotes(self.reference)
        )

    def cse(self, exprs: list[sympy.Expr]) -> tuple[list[tuple[sympy.Symbol, sympy.Expr]], list[sympy.Expr]]:
        exprs = [numbers_to_floats(expand_functions(e)) for e in exprs]
        stream = _SymbolStream(self.names)
        temps, reduced = sympy.cse(exprs, symbols=stream, order="canonical")
        return _name_series_arguments(temps, reduced, stream)

    def promotes(self, reference: str) -> bool:
        """Whether ``reference`` is an input, which may be an integer tensor: a number made a
        tensor then takes the dtype torch's type promotion gives it with the input, as a
        Python number would (0.5 with an int64 input is float32; cast to int64 it was 0,
        found by a user hunt). Gradients and tangents are floating-point tensors."""
        return reference in {self.name(s) for s in self.inputs}

    def tensorize(self, exprs: list[sympy.Expr], reference: str) -> list[str]:
        """Lines converting number params to tensors where a torch function needs one."""
        lines = []
        for param in self.params:
            if any(
                param in node.free_symbols
                for expr in exprs
                for node in sympy.preorder_traversal(expr)
                if isinstance(node, _TENSOR_CONTEXTS)
            ):
                name = self.name(param)
                dtype = f"_dtype_with({reference}, {name})" if self.promotes(reference) else f"{reference}.dtype"
                lines.append(f"{name} = torch.as_tensor({name}, dtype={dtype}, device={reference}.device)")
        return lines

    def saved(self) -> list[sympy.Symbol]:
        used = set().union(*(g.free_symbols for row in self.live_rows() for g in row))
        order = list(self.inputs) + list(self.names.results)
        return [s for s in order if s in used]

    def saved_params(self) -> list[sympy.Symbol]:
        used = set().union(*(g.free_symbols for row in self.live_rows() for g in row))
        return [s for s in self.params if s in used]

    def live_rows(self):
        return [row for row, live in zip(self.rows, self.live) if live]

    # -- the methods ------------------------------------------------------------------
    def build(self) -> Plan:
        inplace = self.p.spec.inplace
        saved = self.saved()
        once = inplace and any(s in self.inputs for s in saved)
        fused = None
        if self.p.spec.fuse:
            if inplace:
                raise SymgradError("--fuse and --inplace cannot be combined: an in-place Function is not fused")
            fused = self.fused(saved)
        value = value_call = None
        if self.speed and not any(self.d.surrogate):
            value = self.forward(outputs=self.n_user)
            if not fused:  # (fused, it runs compiled)
                value = self.eager(value)
            args = ", ".join(self.forward_params())
            value_call = f"{_value_name(self.alias)}({args})"
            if fused and _eager_reason(value, frozenset()) is None:
                value_call = f"{fused.plan.runner}({_value_name(self.alias)}, {args}, operations={eager_operations(value)})"
        out_of_place_forward = None if fused else self.forward()
        forward = fused.forward_call if fused else self.eager(out_of_place_forward)
        backward = fused.backward_call if fused else self.eager(self.backward(saved), differentiating=True)
        readers = self.inplace_readers() if inplace else {}
        if readers:
            refusal = f"_refuse_overwritten(ctx, {', '.join(f'{k}={v!r}' for k, v in readers.items())})"
            backward = dataclasses.replace(backward, lines=(refusal, *backward.lines))
        jvp = fused.jvp_call if fused else self.eager(self.jvp(saved), differentiating=True)
        plan = Plan(
            value_name=_value_name(self.alias) if value else None,
            value=value,
            value_call=value_call,
            class_name=self.p.spec.name,
            no_jvp_class=f"_{self.p.spec.name}NoJvp",
            alias=self.alias,
            public_params=tuple(self.names.public[s] for s in self.inputs + self.params),
            call_args=tuple(self.names.public[s] for s in self.inputs + self.params),
            public_outputs="" if not self.speed else "[0]" if self.n_user == 1 else f"[:{self.n_user}]",
            docstring=self.docstring(saved),
            saved_comment=self.saved_comment(saved, once),
            forward=forward,
            setup_context=self.setup_context(saved),
            backward=backward,
            jvp=jvp,
            setup_forward_ad=self.setup_forward_ad(saved),
            metadata=self.metadata(),
            inplace=inplace,
            refuses_double_backward=once,
            surrogate=any(self.d.surrogate),
            fused=fused.plan if fused else None,
            compiled_forward=self.compiled_forward(out_of_place_forward, forward),
            second_derivative=self.second,
        )
        return _with_helpers(self.half_in_float32(plan))

    def half_in_float32(self, plan: Plan) -> Plan:
        """``plan`` with every body of more than one operation computing float16 tensors in
        float32 (the module helper _float32_for_half) and rounding what it returns back once
        (_round_to), as ATen's own float16 kernels do.

        Eager operations on float16 round at every step, and a simplified formula's
        intermediates overflow float16 long before its value does (Barron's gradient
        216*x/(x**2 + 6)**3 was 0 from x = 10, and nan from 303). Backward returns gradients
        in float32: autograd rounds each to its input's dtype itself. Not bfloat16, which has
        float32's range: converting it cost up to 2.4x on short bodies on the CPU, whose
        bfloat16 arithmetic is fast (sqrt_inverse 2.0 to 4.0 ms at 1e6; float16 took the same
        time or less, gelu 14.4 to 11.0 ms). A fused module's compiled bodies computed in
        float32 already (inductor does), and now its eager ones do too. Not in place
        (forward writes its input) and not one operation (ATen's kernel then).
        """
        if self.p.spec.inplace:
            return plan
        half = self.names.namer.claim("half")
        # --save speed: forward's derivatives stay float32, and so their tangents and
        # cotangents (not converted, not rounded): a float16 derivative overflows where the
        # gradient it multiplies into does not (log(1 + x**2)*y + x*y**3's derivative by x is
        # 9.1e4 at y = 45; found in review).
        rounded = self.n_user if self.speed else None
        user = self.names.results[: self.n_user]
        tensors = {self.name(s) for s in self.inputs + self.params + user}
        tensors |= set(self.names.grad_outputs[: self.n_user] + self.names.tangents)
        if plan.second_derivative:
            tensors |= set(plan.second_derivative.backward.params[1:])  # (its cotangents)

        by_values, by_tangents = self.output_dtype_deciders()

        def in_float32(method: Method | None, gradients: bool = False, deciders=None) -> Method | None:
            if method is None or _kernels(method) <= 1:
                return method  # (a fused module's methods call its bodies: one operation)
            if gradients:
                return _in_float32_backward(method, half, tensors)
            return _in_float32(method, half, tensors, rounded, deciders)

        changes: dict[str, object] = {
            "forward": in_float32(plan.forward, deciders=by_values),
            "compiled_forward": in_float32(plan.compiled_forward, deciders=by_values),
            "value": in_float32(plan.value, deciders=by_values),
            "backward": in_float32(plan.backward, gradients=True),
            "jvp": in_float32(plan.jvp, deciders=by_tangents),
        }
        if plan.fused:
            fused = plan.fused
            changes["fused"] = dataclasses.replace(
                fused,
                forward=in_float32(fused.forward, deciders=by_values),
                backward=in_float32(fused.backward, gradients=True),
                jvp=in_float32(fused.jvp, deciders=by_tangents),
            )
        if plan.second_derivative:
            second = plan.second_derivative
            changes["second_derivative"] = dataclasses.replace(
                second,
                forward=in_float32(second.forward),
                backward=in_float32(second.backward, gradients=True),
                jvp=in_float32(second.jvp),
            )
        return dataclasses.replace(plan, **changes)

    def output_dtype_deciders(self) -> tuple[list | None, list | None]:
        """For a module of several outputs, per user output: the name rounding it back to
        float16 (_Decider), decided by the tensors it depends on (in forward, the inputs and
        params; in jvp, their tangents), or None where those are all of them and the body's
        own decision serves. (None, None) where every output is such.

        One decision for all outputs rounded ``exp(y), x*y``'s ``exp(y)`` to float16 for a
        float16 x and a 0-d float32 y, where torch gives float32 (found by a user-level hunt).
        """
        if self.n_user < 2:
            return None, None
        symbols = self.inputs + self.params
        by_values: list[_Decider | None] = []
        by_tangents: list[_Decider | None] = []
        for k in range(self.n_user):
            used = [s for s in symbols if s in self.d.forward[k].free_symbols]
            if len(used) == len(symbols):
                by_values.append(None)
                by_tangents.append(None)
                continue
            name = self.names.namer.claim(f"{self.name(self.names.results[k])}_half")
            by_values.append(_Decider(name, tuple(self.name(s) for s in used)))
            # (Each param's tangent too: the parameter jvp always has, None for a number,
            # where the param itself may not be saved; found in review.)
            by_tangents.append(_Decider(name, tuple(self.names.tangents[symbols.index(s)] for s in used)))
        if not any(by_values):
            return None, None
        return by_values, by_tangents

    @staticmethod
    def compiled_forward(out_of_place: Method | None, eager: Method) -> Method | None:
        """What the torch.compile twin's forward runs: the forward as written, without
        symgrad.inplace's buffer reuse, where that rewrote it (else None: one forward serves
        both).

        Under torch.compile the reuse buys nothing (inductor plans its own buffers), and it
        costs correctness: Dynamo in torch 2.11 returned zero gradients through some
        in-place forwards (1/x + sqrt(x) as (1 / x).add_(torch.sqrt(x)), GELU and Mish, whose
        output is an in-place op's result; found on a GPU machine, CPU and CUDA alike, with
        backend="eager" too). Out of place, all three were right there. This is
        pytorch/pytorch#180642, fixed by #180921 (torch 2.13 is right). In-place backward
        and jvp bodies traced correctly on 2.11, so they stay shared.
        """
        if out_of_place is None or out_of_place == eager:
            return None
        return out_of_place

    def eager(self, method: Method, differentiating: bool = False, gradients: tuple[str, ...] = ()) -> Method:
        """An eager body reuses its temporaries' buffers (symgrad.inplace). Not --inplace,
        whose forward writes its input, and not fused bodies: inductor plans its own buffers.

        ``differentiating``: backward and jvp run only when an input is differentiated, so
        with a single input that input is floating (only floating tensors have gradients and
        tangents), and so is every output computed from it. ``gradients``: more parameters
        that hold gradients (SecondDerivative's backward's).
        """
        if self.p.spec.inplace:
            return method
        gradients = frozenset(self.names.grad_outputs + self.names.tangents + gradients)
        tensors = frozenset(self.name(s) for s in self.inputs + self.names.results) | gradients
        floating = gradients
        if differentiating and len(self.inputs) == 1 and not self.params:
            floating = tensors
        params = frozenset(self.name(s) for s in self.params)
        lines, returns = reuse_buffers(method.lines, method.returns, tensors, floating, params)
        # (Only what the rewrite wrote: a kernel branch's own .mul_(4) is the printer's, and
        # a rewrite may write no in-place op at all, 1 / x as torch.reciprocal(x).)
        rewritten = [new for old, new in zip((*method.lines, method.returns), (*lines, returns)) if new != old]
        self.reused = self.reused or any(IN_PLACE_CALL.search(text) for text in rewritten)
        self.fused_terms = self.fused_terms or any(FUSED_TERM.search(text) for text in rewritten)
        return Method(method.params, lines, returns)

    def fused(self, saved: list[sympy.Symbol]) -> "_FusedParts":
        """The pure functions, and the methods that call them through the runner."""
        names = _fused_names(self.alias)
        runner = names["runner"]

        def pure(build, fixed: tuple[str, ...]) -> tuple[Method, tuple[str, ...]]:
            """Build a body with ctx attributes as parameters; also return the call's ctx args."""
            self.pure, self.pure_used = True, []
            try:
                method = build()
            finally:
                self.pure = False
            used = tuple(self.pure_used)
            params = fixed + tuple(self.pure_params[a] for a in used)
            return Method(params, method.lines, method.returns), tuple(f"ctx.{a}" for a in used)

        bodies: list[tuple[str, str, str | None]] = []  # (forward|backward|jvp, name, why eager)
        # Values that are never full-size tensors: the 0-d gradient of a sum or mean. (Not
        # params: they may be tensors.) An operation between two of them is no pass over memory.
        scalars = frozenset(g for g, out in zip(self.names.grad_outputs, self.outputs) if out.reduction)

        def call(kind: str, body: Method, args: str, runs: Method | None = None) -> str:
            """The body's call: through the runner, or direct where compiling cannot pay or
            would be inaccurate. ``runs``: what the body runs, where that is more than its own
            lines (a Function it calls)."""
            runs = runs or body
            name, reason = names[kind], _eager_reason(runs, scalars)
            bodies.append((kind, name, reason))
            if reason is not None:
                return f"{name}({args})"
            return f"{runner}({name}, {args}, operations={eager_operations(runs, scalars)})"

        forward, _ = pure(self.forward, self.forward_params())
        forward_call = Method(self.forward_params(), (), call("forward", forward, ", ".join(self.forward_params())))

        values = [self.name(s) for s in saved] + [self.name(p) for p in self.saved_params()]
        if self.speed:
            backward, backward_call = None, self.backward(saved)
        else:
            fixed = self.names.grad_outputs + tuple(values)
            backward, ctx_args = pure(lambda: self.backward(saved, with_unpack=False), fixed)
            grads = list(self.names.grads)
            backward = Method(backward.params, backward.lines, ", ".join(grads))
            line = f"{_unpack(grads) if len(grads) > 1 else grads[0]} = {call('backward', backward, ', '.join(fixed + ctx_args))}"
            # Double backward's Function, where it has one, is called here: the body is pure.
            entries = self.gradient_entries()
            create_graph = self.create_graph_branch(entries, [self.rows[i][j] for i, j in entries])
            backward_call = Method(
                ("ctx",) + self.names.grad_outputs,
                (*self.unpack_saved(saved), *create_graph, line),
                ", ".join(grads + ["None"] * len(self.params)),
            )

        fixed = self.names.tangents + tuple(values)
        jvp, ctx_args = pure(lambda: self.jvp(saved, with_unpack=False), fixed)
        # A jvp that calls SecondDerivative runs its forward too, compiled along (Dynamo traces
        # the Function): its operations count, and its functions must be ones inductor
        # computes accurately.
        if self.second_symbols:
            second_forward = (*self.second.forward.lines, f"_ = {self.second.forward.returns}")
            runs = Method(jvp.params, (*second_forward, *jvp.lines), jvp.returns)
        else:
            runs = None
        jvp_call = Method(
            ("ctx",) + self.names.tangents,
            tuple(self.unpack_saved(saved)),
            call("jvp", jvp, ", ".join(fixed + ctx_args), runs),
        )
        plan = Fused(
            runner=runner,
            cache=names["cache"],
            eager_work=names["eager_work"],
            forward_name=names["forward"],
            forward=forward,
            backward_name=names["backward"] if backward else None,
            backward=backward,
            jvp_name=names["jvp"],
            jvp=jvp,
            description=_fused_description(bodies, speed_backward=backward is None, eager_work=names["eager_work"]),
        )
        return _FusedParts(plan, forward_call, backward_call, jvp_call)

    def forward(self, outputs: int | None = None) -> Method:
        """The forward body; with ``outputs``, only the first that many outputs."""
        exprs = list(self.d.forward[:outputs])
        temps, reduced = self.cse(exprs)
        reference = self.reference = self.name(self.inputs[0])
        lines = self.tensorize(exprs, reference)
        lines += [f"{self.name(t)} = {self.code(e)}" for t, e in temps]
        values = []
        returned = set()
        for index, (out, expr) in enumerate(zip(self.outputs[:outputs], reduced)):
            if not numbers_to_floats(expr).free_symbols:
                # CSE folded it: (x - 0.5)/(0.5 - x) is -1 once x - 0.5 is one temporary. Printed,
                # forward returned a number, which mark_non_differentiable refused (a crash,
                # found by the fuzz campaign); derive refuses the constants it can see.
                where = f"output {index + 1}" if len(self.d.forward) > 1 else "the expression"
                shown = f"{float(expr):g}" if expr.is_real and expr.is_finite else expr
                raise SymgradError(f"{where} is constant ({shown}) wherever it is defined, so it has no gradient")
            text = self.code(expr)
            if out.reduction is None and (expr in returned or expr.is_Symbol and expr in self.inputs):
                # Never return an input, or one tensor twice (sin(x)*x, sin(x)*x): forward-mode
                # AD and torch.compile need every output to be a tensor of its own.
                text = f"{text}.clone()"
            returned.add(expr)
            if out.reduction is not None:
                text = f"({text}).{out.reduction}()"
            values.append(text)
        if self.p.spec.inplace:
            return self.inplace_forward(lines, values[0])
        return Method(self.forward_params(), tuple(lines), ", ".join(values))

    def inplace_forward(self, lines: list[str], value: str) -> Method:
        target = self.name(self.inputs[0])
        result = self.name(self.names.results[0])
        saved = self.saved()
        lines.append(f"{result} = {value}")
        lines += self.shape_lines()
        save_names = []
        for symbol in saved:
            if symbol == self.inputs[0]:
                before = self.names.namer.claim(f"{target}_before")
                lines.append(f"{before} = {target}.clone()")
                save_names.append(before)
            else:
                save_names.append(target if symbol in self.names.results else self.name(symbol))
        param_lines, tensors = self.save_parts("save_for_backward", save_names)
        lines += param_lines
        # The other inputs and params backward reads: the write may change them (mul_(a, a)).
        kept = "".join(f", {k}={k}" for k in self.inplace_readers())
        lines.append(f"ctx.overwritten = _overwrite({target}, {result}{kept})" if kept else f"_overwrite({target}, {result})")
        lines.append(f"ctx.mark_dirty({target})")
        if tensors:
            lines.append(f"ctx.save_for_backward({', '.join(tensors)})")
        return Method(self.forward_params(), tuple(lines), target)

    def inplace_readers(self) -> dict[str, tuple[int, ...]]:
        """For an in-place Function: each input after the first and each param that backward
        reads, with the inputs whose gradients read it."""
        kept = [s for s in self.saved() if s in self.inputs[1:]] + self.saved_params()
        return {
            self.name(s): tuple(
                j for j in range(len(self.inputs)) if any(s in row[j].free_symbols for row in self.live_rows())
            )
            for s in kept
        }

    def forward_params(self) -> tuple[str, ...]:
        return tuple(self.name(s) for s in self.inputs + self.params)

    def setup_context(self, saved: list[sympy.Symbol]) -> Method:
        lines = []
        uses_inputs = (
            any(s in self.inputs for s in saved) or self.saved_params() or self.broadcasts
            or any(out.reduction and live for out, live in zip(self.outputs, self.live))
        )
        if uses_inputs:
            lines.append(f"{_unpack(self.forward_params())} = inputs")
        results = [self.name(r) for r in self.names.results]
        elementwise_shapes = self.broadcasts and any(
            out.reduction is None and live for out, live in zip(self.outputs, self.live)
        )
        if any(r in saved for r in self.names.results) or not all(self.live) or elementwise_shapes:
            lines.append(f"{_unpack(results)} = output" if self.n_out > 1 else f"{results[0]} = output")
        dead = [results[i] for i, live in enumerate(self.live) if not live]
        if dead:
            lines.append("# Piecewise constant in every input: the derivative is zero almost everywhere.")
            lines.append(f"ctx.mark_non_differentiable({', '.join(dead)})")
        lines += self.shape_lines()
        lines += self.save_lines("save_for_backward", saved)
        if self.speed:
            lines.append("# An output that gets no gradient (a derivative, outside double backward) gets None.")
            lines.append("ctx.set_materialize_grads(False)")
        return Method(("ctx", "inputs", "output"), tuple(lines or ["pass"]), "")

    def shape_attr(self, output: int) -> str:
        """The ctx attribute with output ``output``'s shape; for a reduction, the shape of
        the elementwise expression it reduces."""
        result = self.name(self.names.results[output])
        return f"{result}_elementwise_shape" if self.outputs[output].reduction else f"{result}_shape"

    def shape_lines(self) -> list[str]:
        lines = []
        if self.broadcasts:
            for symbol in self.inputs:
                lines.append(f"ctx.{self.name(symbol)}_shape = {self.name(symbol)}.shape")
        for index, out in enumerate(self.outputs):
            if not self.live[index]:
                continue
            result = self.name(self.names.results[index])
            if out.reduction is not None:
                tensors = sorted(out.expr.free_symbols, key=lambda s: (self.inputs + self.params).index(s))
                shapes = ", ".join(
                    f"{self.name(s)}.shape" if s in self.inputs else f"getattr({self.name(s)}, 'shape', ())"
                    for s in tensors
                )
                lines.append(f"ctx.{self.shape_attr(index)} = torch.broadcast_shapes({shapes})")
            elif self.broadcasts:
                lines.append(f"ctx.{result}_shape = {result}.shape")
        return lines

    def save_parts(
        self, method: str, saved_names: list[str], params: Sequence[sympy.Symbol] | None = None
    ) -> tuple[list[str], list[str]]:
        """Lines that stash number params (default: saved_params) on ctx, and the tensors
        ``method`` saves."""
        lines, tensors = [], list(saved_names)
        for param in self.saved_params() if params is None else params:
            name = self.name(param)
            if method == "save_for_backward":
                lines.append(f"ctx.{name}_number = None if isinstance({name}, torch.Tensor) else {name}")
            tensors.append(f"{name} if ctx.{name}_number is None else None")
        return lines, tensors

    def save_lines(self, method: str, saved: list[sympy.Symbol]) -> list[str]:
        lines, tensors = self.save_parts(method, [self.name(s) for s in saved])
        if tensors:
            lines.append(f"ctx.{method}({', '.join(tensors)})")
        return lines

    def unpack_saved(self, saved: Sequence[sympy.Symbol], params: Sequence[sympy.Symbol] | None = None) -> list[str]:
        """Lines unpacking ctx.saved_tensors: ``saved``, then the params (default:
        saved_params), a number param from its ctx attribute."""
        params = self.saved_params() if params is None else params
        names = [self.name(s) for s in saved] + [self.name(p) for p in params]
        if not names:
            return []
        lines = [f"{_unpack(names)} = ctx.saved_tensors"]
        for param in params:
            name = self.name(param)
            lines.append(f"if {name} is None:")
            lines.append(f"{INDENT}{name} = ctx.{name}_number")
        return lines

    def backward(self, saved: list[sympy.Symbol], with_unpack: bool = True) -> Method:
        if self.speed:
            return self.speed_backward(saved, with_unpack)
        lines = self.unpack_saved(saved) if with_unpack else []
        # All gradients share one CSE, so work common to several inputs is done once.
        entries = self.gradient_entries()
        kernels = [self.first_order_kernel(j) for j in range(len(self.inputs))]
        # Where a kernel computes the first-order gradient, the formula runs only for double
        # backward, so it takes the form whose autograd derivative is finite.
        exprs = [differentiable_form(self.rows[i][j]) if kernels[j] else self.rows[i][j] for i, j in entries]
        create_graph = [] if self.pure else self.create_graph_branch(entries, exprs)
        lines += create_graph
        if create_graph:
            exprs = [self.rows[i][j] for i, j in entries]  # first order only from here
        rewritten = {j for (i, j), expr in zip(entries, exprs) if expr != self.rows[i][j]}
        temps, reduced = self.cse(exprs)
        reference = self.reference = self.names.grad_outputs[self.live.index(True)]
        lines += self.tensorize(exprs, reference)
        users = _temp_users(temps, reduced, [j for _, j in entries])
        shared = [(t, e) for t, e in temps if len(users[t]) > 1]
        lines += [f"{self.name(t)} = {self.code(e)}" for t, e in shared]
        grads = []
        for j, symbol in enumerate(self.inputs):
            grad = self.names.grads[j]
            terms = [
                self.backward_term(i, expr)
                for (i, jj), expr in zip(entries, reduced)
                if jj == j
            ]
            lines.append(f"{grad} = None")
            grads.append(grad)
            if not terms:
                continue
            lines.append(f"if {self.ctx_ref('needs_input_grad')}[{j}]:")
            own = [(t, e) for t, e in temps if users[t] == {j}]
            body = [f"{self.name(t)} = {self.code(e)}" for t, e in own]
            if self.broadcasts:
                # Each term is reduced on its own: outputs can have different shapes (exp(y) and
                # x*y), and a smaller term broadcast into a sum first would be counted repeatedly.
                shape = self.ctx_ref(self.name(symbol) + "_shape")
                terms = [f"({term}).sum_to_size({shape})" for term in terms]
            body.append(f"{grad} = {' + '.join(terms)}")
            if kernels[j] is not None and create_graph:
                body = [
                    "# First order (create_graph=True returned above): ATen's fused backward kernel,",
                    "# fewer passes over memory.",
                    f"{grad} = {kernels[j]}",
                ]
            elif kernels[j] is not None:
                body = _first_order_branch(grad, kernels[j], body, sech_as_sigmoids=j in rewritten)
            lines += [INDENT + line for line in body]
        grads += ["None"] * len(self.params)
        return Method(("ctx",) + self.names.grad_outputs, tuple(lines), ", ".join(grads))

    def gradient_entries(self) -> list[tuple[int, int]]:
        """(output i, input j) of each gradient that is not zero."""
        return [(i, j) for i in range(self.n_out) for j in range(len(self.inputs)) if self.live[i] and self.rows[i][j] != 0]

    def second_derivative(self, entries: list[tuple[int, int]], exprs: list[sympy.Expr]) -> SecondDerivative | None:
        """Double backward's own Function (SecondDerivative), where autograd's derivative of
        some create_graph formula ``exprs[k]`` (of gradient ``entries[k]``) is nan or
        inaccurate and symbolic second derivatives are not (derive); else None.

        Its outputs are the gradients' derivatives d(result)/d(input), one per (output,
        input) pair, and params pass through it undifferentiated. It leaves out the gradients
        whose own derivatives are all 0 (a constant, sign(x)): autograd's derivative of those
        is exact, and a Function output that no input moves would have no tangent of its
        shape. Not in place, nor with a surrogate (whose derivative is declared, not derived).
        """
        if self.p.spec.inplace or any(self.d.surrogate):
            return None
        gradients = [self.d.gradients[i][j] for i, j in entries]
        raws = [self.d.raw_gradients[i][j] for i, j in entries]
        # autograd differentiates the outputs through this Function's own backward: the gradients.
        restored = dict(zip(self.names.results, self.d.forward))
        # The probe covers three symbols at most. Params beyond that are probed at their sample
        # values (log(1+exp(a*x*y+b)): at a = b = 0.708), not left unprobed.
        symbols_used = set().union(*(raw.free_symbols for raw in raws)) & set(self.inputs + self.params)
        fixed = {}
        if len(symbols_used) > 3:
            # (Rational: exp(0.708) as a 15-digit Float would spoil the exact reference.)
            fixed = {p: sympy.Rational(str(v)) for p, v in self.param_samples().items() if p in symbols_used}
        try:
            if not any(
                autograd_loses_second_derivatives(expr.xreplace(restored), raw, self.inputs, fixed)
                for expr, raw in zip(exprs, raws)
            ):
                return None
            varying = [k for k, g in enumerate(gradients) if numbers_to_floats(g).free_symbols & set(self.inputs)]
            used = set().union(*(gradients[k].free_symbols | raws[k].free_symbols for k in varying))
            symbols = tuple(s for s in self.inputs if s in used)
            if not set(symbols) <= set(self.saved()) or not used & set(self.params) <= set(self.saved_params()):
                self.second_derivative_needs_inputs = True
                return None  # backward has not got them (it saved the output instead)
            identities: set[str] = set()
            # (Params are probed as the inputs are, but not differentiated by.)
            hessian = {k: exact_second_derivatives(raws[k], gradients[k], symbols, identities, fixed) for k in varying}
        except SymgradError:
            return None  # SymPy cannot differentiate it again: autograd differentiates the formula
        if any(row is None for row in hessian.values()):
            return None
        covered = [k for k in varying if any(h != 0 for h in hessian[k])]
        if not covered:
            return None
        # The inputs and params that the derivatives it returns depend on.
        needed = set().union(*(gradients[k].free_symbols | raws[k].free_symbols for k in covered))
        kept = [n for n, s in enumerate(symbols) if s in needed]
        self.second_identities = identities
        return self.second_derivative_methods(
            [entries[k] for k in covered],
            tuple(symbols[n] for n in kept),
            tuple(p for p in self.params if p in needed),
            [gradients[k] for k in covered],
            [tuple(hessian[k][n] for n in kept) for k in covered],
        )

    def second_derivative_methods(self, entries, symbols, params, gradients, hessian) -> SecondDerivative:
        """SecondDerivative's methods, with ``symbols`` as its inputs and ``params`` after
        them: forward returns d(result i)/d(input j) for each (i, j) in ``entries``
        (``gradients``); backward and jvp multiply by ``hessian`` (row k holds the derivatives
        of ``gradients[k]`` by each of ``symbols``)."""
        inputs = [self.name(s) for s in symbols]
        param_names = [self.name(p) for p in params]
        # Several tensors broadcast: each gradient is reduced to its input's shape, and a
        # tangent may be None.
        several = len(inputs) + len(param_names) > 1
        derivatives = [
            self.names.namer.claim(f"d{self.name(self.names.results[i])}_d{self.name(self.inputs[j])}") for i, j in entries
        ]
        cotangents = tuple(self.names.namer.claim(f"grad_{d}") for d in derivatives)
        unpack = self.unpack_saved(symbols, params)
        hessian_entries = [h for row in hessian for h in row]

        def body(exprs: list[sympy.Expr], reference: str) -> tuple[list[str], list[str]]:
            self.reference = reference  # (a float tensor in scope, for the printer)
            temps, reduced = self.cse(exprs)
            lines = self.tensorize(exprs, reference) + [f"{self.name(t)} = {self.code(e)}" for t, e in temps]
            return lines, [self.code(e) for e in reduced]

        def product(factor: str, k: int, j: int) -> str:
            return factor if _is_one(hessian[k][j]) else f"{factor} * {_factor(values[k * len(inputs) + j])}"

        lines, values = body(gradients, inputs[0])
        returned = []
        for k, (value, gradient) in enumerate(zip(values, gradients)):
            # A new tensor each: forward-mode AD and torch.compile need that (dx of x*y is y).
            if gradient.is_Symbol or value in values[:k]:
                value = f"{value}.clone()"
            returned.append(value)
        forward = Method(tuple(inputs + param_names), tuple(lines), ", ".join(returned))

        # With several derivatives a cotangent may be None (a Hessian row of its own, or
        # torch.func.jacrev of one gradient), and with several inputs a tangent may be: their
        # terms are skipped, not multiplied as zeros, which would make 0*inf = nan where a
        # second derivative overflows.
        optional_cotangents = len(derivatives) > 1
        if param_names:
            # A number param is kept on ctx; save_for_backward takes tensors only.
            stash, tensors = self.save_parts("save_for_backward", inputs, params)
            saved = ", ".join(tensors)
            setup = [f"{_unpack(inputs + param_names)} = inputs", *stash]
            setup += [f"ctx.save_for_backward({saved})", f"ctx.save_for_forward({saved})"]
        else:
            setup = ["ctx.save_for_backward(*inputs)", "ctx.save_for_forward(*inputs)"]
        if several:
            # (For jvp: the zero tangent of a derivative that no given tangent reaches.)
            setup.append("ctx.dtypes = " + ("tuple(d.dtype for d in output)" if optional_cotangents else "(output.dtype,)"))
        if optional_cotangents:
            setup.append("ctx.set_materialize_grads(False)")
        setup_context = Method(("ctx", "inputs", "output"), tuple(setup), "")
        term = self.term() if several or optional_cotangents else None

        lines, values = body(hessian_entries, inputs[0])
        grads = []
        for j, symbol in enumerate(symbols):
            name = self.names.grads[self.inputs.index(symbol)]
            reaching = [k for k in range(len(cotangents)) if hessian[k][j] != 0]
            if not reaching:
                grads.append("None")
                continue
            if not (several or optional_cotangents):
                grads.append(product(cotangents[reaching[0]], reaching[0], j))
                continue
            added = {k: product(cotangents[k], k, j) for k in reaching}
            if several:
                added = {k: f"({text}).sum_to_size({inputs[j]}.shape)" for k, text in added.items()}
            if optional_cotangents:
                unset, *summed = _sum_of_present(name, [(cotangents[k], added[k]) for k in reaching], term)
            else:  # (one cotangent, never None)
                unset, summed = f"{name} = None", [f"{name} = {added[reaching[0]]}"]
            lines += [unset, f"if ctx.needs_input_grad[{j}]:", *(INDENT + line for line in summed)]
            grads.append(name)
        grads += ["None"] * len(param_names)
        backward = Method(("ctx",) + cotangents, (*unpack, *lines), ", ".join(grads))

        everything = self.inputs + self.params
        tangents = tuple(self.names.tangents[everything.index(s)] for s in symbols + params)
        lines, values = body(hessian_entries, inputs[0])
        pushed = []
        for k, gradient in enumerate(gradients):
            moving = [j for j in range(len(symbols)) if hessian[k][j] != 0]
            needed = [s for s in symbols + params if s in gradient.free_symbols]
            shape = ", ".join(
                f"{self.name(s)}.shape" if s in symbols else f"getattr({self.name(s)}, 'shape', ())" for s in needed
            )
            if not several:
                pushed.append(product(tangents[0], k, 0))
                continue
            name = self.names.namer.claim(f"{derivatives[k]}_tangent")
            lines += _sum_of_present(name, [(tangents[j], product(tangents[j], k, j)) for j in moving], term)
            lines += [
                f"if {name} is None:",
                f"{INDENT}{name} = torch.zeros((), dtype=ctx.dtypes[{k}], device={inputs[0]}.device)",
                # A term may not have the derivative's shape: it varies with another input
                # piecewise-constantly (sign(y)), or that input's tangent was None.
                f"{name} = {name}.expand(torch.broadcast_shapes({shape}))",
            ]
            pushed.append(name)
        jvp = Method(("ctx",) + tangents, (*unpack, *lines), ", ".join(pushed))
        return SecondDerivative(
            class_name=_derivative_class(self.p.spec.name),
            inputs=tuple(inputs),
            params=tuple(param_names),
            entries=tuple(entries),
            derivatives=tuple(derivatives),
            forward=self.eager(forward),
            setup_context=setup_context,
            backward=self.eager(backward, differentiating=True, gradients=cotangents),
            jvp=self.eager(jvp, differentiating=True),
        )

    def create_graph_branch(self, entries: list[tuple[int, int]], exprs: list[sympy.Expr]) -> list[str]:
        """Backward's lines for create_graph=True where double backward needs SecondDerivative
        (else none): they return, and the first-order code after them runs otherwise. A
        gradient the Function leaves out is its formula, ``exprs``' entry."""
        second = self.second_derivative(entries, exprs)
        if second is None:
            return []
        self.second = second
        symbols = {entry: sympy.Dummy(name) for entry, name in zip(second.entries, second.derivatives)}
        self.names.symbols.update({symbols[entry]: name for entry, name in zip(second.entries, second.derivatives)})
        self.second_symbols = symbols
        lines = ["if torch.is_grad_enabled():", *(INDENT + line for line in _SECOND_DERIVATIVE_COMMENT)]
        lines.append(INDENT + self.second_derivative_call())
        self.reference = self.names.grad_outputs[entries[0][0]]
        # A formula the Function leaves out is printed as it stands; a torch function may need
        # a number param as a tensor there.
        left_out = [expr for entry, expr in zip(entries, exprs) if entry not in symbols]
        lines += [INDENT + line for line in self.tensorize(left_out, self.reference)]
        for j, symbol in enumerate(self.inputs):
            grad = self.names.grads[j]
            lines.append(f"{INDENT}{grad} = None")
            terms = [self.backward_term(i, symbols.get((i, jj), expr)) for (i, jj), expr in zip(entries, exprs) if jj == j]
            if not terms:
                continue
            if self.broadcasts:
                # Each term on its own: the outputs can differ in shape.
                shape = self.ctx_ref(self.name(symbol) + "_shape")
                terms = [f"({term}).sum_to_size({shape})" for term in terms]
            lines += [f"{INDENT}if ctx.needs_input_grad[{j}]:", f"{INDENT * 2}{grad} = {' + '.join(terms)}"]
        lines.append(f"{INDENT}return {', '.join(self.names.grads + ('None',) * len(self.params))}")
        return lines

    def second_derivative_call(self) -> str:
        """The line that gets the derivatives SecondDerivative returns, by their names."""
        second = self.second
        targets = _unpack(second.derivatives) if len(second.derivatives) > 1 else second.derivatives[0]
        return f"{targets} = {second.class_name}.apply({', '.join(second.inputs + second.params)})"

    def first_order_kernel(self, j: int) -> str | None:
        """The call of an ATen backward kernel (symgrad.kernels) that computes input ``j``'s
        whole gradient, or None (always in fused bodies: whole_gradient_kernel refuses --fuse)."""
        live = [i for i in range(self.n_out) if self.live[i] and self.rows[i][j] != 0]
        terms = [(self.rows[i][j], self.outputs[i].reduction) for i in live]
        found = whole_gradient_kernel(self.p.spec, self.inputs, self.params, terms)
        if found is None:
            return None
        return found.code(self.names.grad_outputs[live[0]], lambda e: self.code(numbers_to_floats(e)))

    def speed_backward(self, saved: list[sympy.Symbol], with_unpack: bool) -> Method:
        """--save speed: multiply by the derivatives forward returned; differentiate them again
        only when they received a gradient themselves (double backward).

        Gradients are not materialised (setup_context), so an output that got none has
        ``None`` here and costs nothing.
        """
        lines = self.unpack_saved(saved) if with_unpack else []
        grads = list(self.names.grads)
        lines.append(f"{' = '.join(grads)} = None")
        self.contributions = [0] * len(self.inputs)
        first = [i for i in range(self.n_user) if self.live[i]]
        second = [i for i in range(self.n_user, self.n_out) if self.live[i]]
        self.reference = self.name(self.names.results[self.n_user])
        # Number params that torch functions take (in recomputed entries and second derivatives).
        lines += self.tensorize([g for i in first + second for g in self.rows[i]], self.reference)
        for i in first:
            lines.append(f"if {self.names.grad_outputs[i]} is not None:")
            for j in range(len(self.inputs)):
                if self.rows[i][j] != 0:
                    lines.append(f"{INDENT}if {self.ctx_ref('needs_input_grad')}[{j}]:")
                    lines += [INDENT * 2 + line for line in self.accumulate(j, self.backward_term(i, self.rows[i][j]))]
        for m in second:
            entries = [j for j in range(len(self.inputs)) if self.rows[m][j] != 0]
            lines.append(f"if {self.names.grad_outputs[m]} is not None:")
            if m == second[0]:
                lines.append(f"{INDENT}# Double backward: the derivative is an output too, so it is differentiated again.")
            exprs = [self.rows[m][j] for j in entries]
            temps, reduced = self.cse(exprs)
            lines += [f"{INDENT}{self.name(t)} = {self.code(e)}" for t, e in temps]
            for j, expr in zip(entries, reduced):
                lines.append(f"{INDENT}if {self.ctx_ref('needs_input_grad')}[{j}]:")
                lines += [INDENT * 2 + line for line in self.accumulate(j, self.backward_term(m, expr))]
        grads += ["None"] * len(self.params)
        return Method(("ctx",) + self.names.grad_outputs, tuple(lines), ", ".join(grads))

    def accumulate(self, j: int, term: str) -> list[str]:
        """Lines adding ``term`` to input ``j``'s gradient, which may still be None."""
        grad = self.names.grads[j]
        self.contributions[j] += 1
        if self.broadcasts:
            # Reduced term by term: the outputs (derivatives included) differ in shape.
            term = f"({term}).sum_to_size({self.ctx_ref(self.name(self.inputs[j]) + '_shape')})"
        return _accumulate(grad, term, self.contributions[j] == 1, self.term() if self.contributions[j] > 1 else None)

    def backward_term(self, output: int, expr: sympy.Expr) -> str:
        grad_output = self.names.grad_outputs[output]
        reduction = self.outputs[output].reduction
        if reduction == "mean":
            # The 0-d gradient is divided first: one scalar operation, where dividing the
            # expanded product would be a pass over memory of its own.
            grad_output = f"({grad_output} / {self.ctx_ref(self.shape_attr(output))}.numel())"
        text = grad_output if _is_one(expr) else f"{grad_output} * {_factor(self.code(expr))}"
        if reduction is not None:
            text = f"({text}).expand({self.ctx_ref(self.shape_attr(output))})"
        return text

    def grad_only_params(self) -> set[sympy.Symbol]:
        """The params that appear only in a ``--grad`` surrogate, not in the outputs."""
        used = set().union(*(expr.free_symbols for expr in self.d.forward))
        return {p for p in self.params if p not in used}

    def single_tangent(self) -> bool:
        """Whether jvp gets exactly one tangent, which is never None."""
        return len(self.inputs) == 1 and not self.params

    def setup_forward_ad(self, saved: list[sympy.Symbol]) -> tuple[str, ...]:
        lines = self.save_lines("save_for_forward", saved)
        results = [self.name(r) for r in self.names.results]
        # With several tangents, an output none of the given ones reaches gets a zero tangent
        # of its own dtype (not the inputs': float16 x and float32 y give a float32 output).
        dtypes = [] if self.single_tangent() else [
            f"ctx.{results[i]}_dtype = {results[i]}.dtype" for i in range(self.n_out) if self.live[i]
        ]
        if not lines and not dtypes:
            return ()
        unpack = []
        if any(s in self.inputs for s in saved) or self.saved_params():
            unpack.append(f"{_unpack(self.forward_params())} = inputs")
        if any(r in saved for r in self.names.results) or dtypes:
            unpack.append(f"{_unpack(results)} = output" if self.n_out > 1 else f"{results[0]} = output")
        return tuple(unpack + dtypes + lines)

    def jvp(self, saved: list[sympy.Symbol], with_unpack: bool = True) -> Method:
        lines = self.unpack_saved(saved) if with_unpack else []
        entries = [(i, j) for i in range(self.n_out) for j in range(len(self.inputs)) if self.live[i] and self.rows[i][j] != 0]
        # Reverse mode over this jvp (torch.func.jacrev of jacfwd) differentiates its formulas
        # as they stand, and jvp cannot tell when (torch.func hides requires_grad here): so
        # they take the forms whose derivatives are right. The derivatives SecondDerivative
        # serves come from it, whose backward is exact (autograd's derivative of softplus's
        # sigmoid(x) is 0 at x = 20 in float32); the others take differentiable_form (tanh's
        # 1/cosh(x)**2 had a nan derivative from |x| = 90).
        # (second_symbols is set by create_graph_branch: backward is built first, in build()
        # and fused() alike.)
        exprs = [self.second_symbols.get((i, j), differentiable_form(self.rows[i][j])) for i, j in entries]
        if self.second_symbols:
            lines.append("# Exact in reverse mode too (torch.func.jacrev of jacfwd differentiates this jvp).")
            lines.append(self.second_derivative_call())
        temps, reduced = self.cse(exprs)
        # A saved tensor is always there; a tangent may be None, but not all of them are.
        if saved:
            self.reference = self.name(saved[0])
        elif len(self.names.tangents) == 1:
            self.reference = self.names.tangents[0]
        else:
            self.reference = self.names.namer.claim("reference")
            tangents = ", ".join(self.names.tangents)
            lines.append(f"{self.reference} = next(t for t in ({tangents}) if t is not None)")
        lines += self.tensorize(exprs, self.reference)
        lines += [f"{self.name(t)} = {self.code(e)}" for t, e in temps]
        returns = []
        single = self.single_tangent()
        if not single:
            self.term()  # (claimed before the tangents' names, which then stay as they were)
        surrogate_only = self.grad_only_params()
        for i, out in enumerate(self.outputs):
            result = self.name(self.names.results[i])
            tangent = self.names.namer.claim(f"{result}_tangent")
            if not self.live[i]:
                returns.append("None")
                continue
            terms = [
                (j, self.jvp_term(j, expr, self.shape_attr(i) if expr.free_symbols & surrogate_only else None))
                for (ii, j), expr in zip(entries, reduced)
                if ii == i
            ]
            if single:
                value = terms[0][1]
                if out.reduction is not None:
                    value = f"({value}).expand({self.ctx_ref(self.shape_attr(i))}).{out.reduction}()"
                lines.append(f"{tangent} = {value}")
            else:
                lines += _sum_of_present(tangent, [(self.names.tangents[j], term) for j, term in terms], self.term())
                lines.append(f"if {tangent} is None:")
                lines.append(f"{INDENT}# No given tangent reaches this output: its tangent is a zero of its dtype.")
                dtype = self.ctx_ref(f"{result}_dtype")
                lines.append(f"{INDENT}{tangent} = torch.zeros((), dtype={dtype}, device={self.reference}.device)")
                # The engine does not broadcast tangents: each must have its output's shape.
                value = f"{tangent}.expand({self.ctx_ref(self.shape_attr(i))})"
                lines.append(f"{tangent} = {value}.{out.reduction}()" if out.reduction is not None else f"{tangent} = {value}")
            returns.append(tangent)
        return Method(("ctx",) + self.names.tangents, tuple(lines), ", ".join(returns))

    def jvp_term(self, j: int, expr: sympy.Expr, reduce_to: str | None = None) -> str:
        """Input ``j``'s tangent times ``expr``; with ``reduce_to`` (the ctx attribute of the
        output's shape), summed over the dimensions it has beyond it: a surrogate gradient
        that reads a param the output does not may broadcast beyond the output (lam of shape
        (3, 1) for x of shape (2,)), and backward sums it so. (jvp's expand raised there;
        found by a user-level hunt. Each such term alone: summed after the others were added,
        they were counted once per extra row; found in review.)"""
        tangent = self.names.tangents[j]
        term = tangent if _is_one(expr) else f"{tangent} * {_factor(self.code(expr))}"
        return f"_reduced_to({term}, {self.ctx_ref(reduce_to)})" if reduce_to else term

    # -- documentation ----------------------------------------------------------------
    def docstring(self, saved: list[sympy.Symbol]) -> str:
        math_names = {s: s.name for s in self.inputs + self.params}
        math_names.update({r: self.name(r) for r in self.names.results})
        out_names = ["f"] if self.n_user == 1 else [f"f{i}" for i in range(self.n_user)]
        args = ", ".join(s.name for s in self.inputs + self.params)
        lines = []
        for name, out in zip(out_names, self.outputs):
            body = sympy.sstr(out.expr)
            if out.reduction:
                body = f"{out.reduction}({body})"
            lines.append(f"{name}({args}) = {body}")
        lines.append("")
        for i, name in enumerate(out_names):
            if not self.live[i]:
                lines.append(f"{name} is piecewise constant: its gradient is zero almost everywhere.")
                continue
            for j, symbol in enumerate(self.inputs):
                gradient = sympy.sstr((self.d.documented_gradients or self.d.gradients)[i][j])
                marker = "  (surrogate: not the true derivative)" if self.d.surrogate[j] else ""
                inner = "the elementwise part of " if self.outputs[i].reduction else ""
                lines.append(f"d{name}/d{symbol.name} = {gradient}{marker}" if not inner else f"d({inner}{name})/d{symbol.name} = {gradient}")
        identities = sorted(set(self.d.identities) | self.second_identities)
        if identities:
            lines.append("")
            uses_abs = {"sech", "sigmoid_pair"} & set(identities)
            lines += textwrap.wrap(
                (
                    "The fused bodies use these identities, which need fewer or cheaper calls in"
                    " one compiled kernel."
                    if self.d.parsed.spec.fuse
                    else "The bodies use these identities, which run fewer or cheaper kernels."
                )
                + " Each is accurate in float32 (the softplus ones are kept"
                " only where rounding shows it"
                + (
                    "; they give 0 where sigmoid(u) underflows, u < -88.7 in float32, where"
                    " tanh(softplus(u)) is below the smallest normal float32)"
                    if {"tanh_softplus", "cosh_softplus"} & set(identities)
                    else ")"
                )
                + (
                    ", and -|u| is written as torch.where(u > 0, -u, u), which autograd"
                    " differentiates exactly on each side:"
                    if uses_abs
                    else ":"
                ),
                width=88,
            )
            lines += [f"    {IDENTITIES[name]}" for name in identities]
        if self.reused:
            lines.append("")
            lines += textwrap.wrap(
                "In-place methods (.add_(), .mul_(), .exp_(), ...) only update a temporary that"
                " the same expression has just made, never an input, a saved tensor or a named"
                " value: an in-place op skips the read of a new buffer that an out-of-place op"
                " pays, and autograd, vmap and broadcasting allow each of them (symgrad.inplace).",
                width=88,
            )
        if self.fused_terms:
            lines.append("")
            lines += [
                "A sum's product and quotient terms are added by one kernel each:",
                "    a.addcmul(l, r, value=c) = a + c*l*r",
                "    a.addcdiv(l, r, value=c) = a + c*l/r",
                "    a.add(r, alpha=c) = a + c*r",
            ]
        if self.speed:
            derivatives = [self.name(r) for r in self.names.results[self.n_user :]]
            lines.append("")
            lines += textwrap.wrap(
                f"--save speed: forward also computes {', '.join(derivatives)}, sharing work with the"
                f" output, so `{self.p.spec.name}.apply` returns {self.n_out} tensors and the alias"
                f" returns the first {self.n_user}. Backward multiplies by the saved derivatives"
                " instead of recomputing them; double backward differentiates them again. With"
                " grad mode off (inference), the alias computes the outputs alone.",
                width=88,
            )
        return "\n".join(lines)

    def saved_comment(self, saved: list[sympy.Symbol], once: bool) -> tuple[str, ...]:
        if not saved and not self.saved_params():
            return ("Nothing is saved for backward: every gradient is constant.",)
        parts = []
        derivatives = set(self.names.results[self.n_user :])
        for symbol in saved:
            if symbol in derivatives:
                parts.append(f"{self.name(symbol)} (a derivative forward returned, so backward only multiplies by it)")
            elif symbol in self.names.results:
                parts.append(f"{self.name(symbol)} (the output: the gradient is written in terms of it, so backward recomputes nothing)")
            elif once and symbol == self.inputs[0]:
                parts.append(f"{self.name(symbol)} (a copy of the input from before it is overwritten)")
            else:
                parts.append(f"{self.name(symbol)} (the gradient depends on it)")
        parts += [f"{self.name(p)} (a param the gradient uses)" for p in self.saved_params()]
        n_tensors = len(saved)
        # Each saved tensor is at most the size of the (broadcast) output; exactly, with one input.
        at_most = "at most " if self.broadcasts else ""
        text = (
            "Saved for backward: " + "; ".join(parts) + "."
            f" That is {n_tensors} tensor{'s' if n_tensors != 1 else ''}: {at_most}{4 * n_tensors} bytes per"
            " element of the output in float32."
        )
        if once:
            text += " The copy is not part of the graph, so double backward is refused."
        elif self.speed:
            text += (
                " The derivatives are outputs, not hidden intermediates, so double backward"
                " differentiates them exactly."
            )
        else:
            text += " No forward intermediate is saved, so double backward stays exact."
        return tuple(textwrap.wrap(text, width=86))

    def param_samples(self) -> dict[sympy.Symbol, float]:
        """Each param's sample value: the tests' (in the metadata), and where the
        second-derivative probe fixes params (second_derivative)."""
        domain = {s: (lo, hi) for s, lo, hi in self.d.domain}
        return {p: round(domain[p][0] + 0.618 * (domain[p][1] - domain[p][0]), 3) for p in self.params}

    def metadata(self) -> str:
        domain = {s.name: (lo, hi) for s, lo, hi in self.d.domain}
        params = {p.name: value for p, value in self.param_samples().items()}
        data = {
            "expr": self.p.spec.expr,
            "function": self.p.spec.name,
            "alias": self.alias,
            "inputs": [s.name for s in self.inputs],
            "params": params,
            "domain": domain,
            "outputs": [out.reduction or "elementwise" for out in self.outputs[: self.n_user]],
            "nondifferentiable": [i for i, live in enumerate(self.live[: self.n_user]) if not live],
            "surrogate": {s.name: text for s, text in zip([s for s, _ in self.p.surrogates], [t for _, t in self.p.spec.grads])},
            "inplace": self.p.spec.inplace,
            "save": self.p.spec.save,
            "saved": [self.name(s) for s in self.saved()],
        }
        return repr(data)


# Functions whose inductor kernels lose relative accuracy near 0 (torch 2.13, CPU): the
# vectorised expm1 is exp(x) - 1 (5% off at x = 1e-6 in float32, 100% at 1e-30), and atanh
# and float32 erf lose the same way; found in review. tests/test_inductor.py measures every
# function the printer uses. A fused body calling one runs eagerly, on ATen's accurate kernel.
# (torch 2.14.1 computes expm1 accurately; the list keeps it, since a generated file may run
# on torch 2.13 and older.)
INDUCTOR_INACCURATE = ("torch.atanh", "torch.expm1", "torch.special.erf")

# Helpers (printer.HELPERS) whose kernel inductor compiles a few ulps less accurately than
# ATen's, by the torch function they call: log_ndtr, 4.5 float64 ulps off at 1e-8 and 3.4
# float32 ulps at -1e-4, where ATen's is 0.5 ulps off or less (torch 2.13, CPU). A fused
# body calling one runs eagerly too. (Not in INDUCTOR_INACCURATE, which tests/test_inductor.py
# checks to be exactly what it measures above 4 ulps at its sample points: log_ndtr sits at
# that line.)
INDUCTOR_LESS_ACCURATE_HELPERS = {"_log_ndtr": "torch.special.log_ndtr"}


_ONE_OPERATION = "one elementwise operation"  # (the other reason is the inaccurate calls)


def _eager_reason(body: Method, scalars: frozenset[str]) -> str | None:
    """Why a fused module calls ``body`` directly instead of compiled, or None to compile it."""
    if _one_elementwise_operation(body, scalars):
        return _ONE_OPERATION
    tree = ast.parse("\n".join([*body.lines, f"_ = {body.returns}"]))
    called = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    inaccurate = [name for name in (*INDUCTOR_INACCURATE, *INDUCTOR_LESS_ACCURATE_HELPERS) if name in called]
    if inaccurate:
        return " and ".join(inaccurate)
    return None


def _one_elementwise_operation(body: Method, scalars: frozenset[str] = frozenset()) -> bool:
    """Whether ``body`` is at most one elementwise arithmetic operation on full-size tensors.

    (``2 * x``, ``grad_output * result``, and ``(grad_output * 2 * x).expand(shape)`` where
    grad_output is the 0-d gradient of a sum: ``scalars`` names such values.) Such a body
    runs eagerly even in a fused module: one eager kernel makes the same pass over memory as
    a compiled one (on one CPU thread ATen's is 10-30% faster than inductor's: for that
    sum's backward at 1e7, 3.0 ms against 3.7), and the compiled call would only add
    Dynamo's guard check. A body with a function call (exp, sigmoid, ..., or a reduction)
    stays compiled: inductor's kernels for those differ. ``expand`` makes a view and
    ``numel`` an int, no kernel. A comparison on a tensor is an operation too (a kernel).
    """
    operators, calls = _tensor_operations(body, scalars)
    return operators <= 1 and not calls


def eager_operations(body: Method, scalars: frozenset[str] = frozenset()) -> int:
    """How many ATen operations ``body`` runs eagerly: each a kernel launch and a pass over
    memory, where the compiled body makes one. (Every branch counts, taken or not.)

    The fused runner compares it with the tensors' size to decide whether a compiled call
    pays (templates/fused.py.jinja). Where it errs, it counts too many (every
    ``needs_input_grad`` branch, a ``sum_to_size`` that is a view), which only makes a body
    compile sooner. ``scalars`` as for ``_one_elementwise_operation``.
    """
    return sum(_tensor_operations(body, scalars))


def _tensor_operations(body: Method, scalars: frozenset[str]) -> tuple[int, int]:
    """``body``'s operators on tensors (not between scalars), and its calls that launch a kernel."""
    tree = ast.parse("\n".join([*body.lines, f"_ = {body.returns}"]))

    def is_scalar(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in scalars
        if isinstance(node, ast.UnaryOp):
            return is_scalar(node.operand)
        if isinstance(node, ast.Call):
            return _is_method_call(node, "numel")  # (a Python int)
        if isinstance(node, ast.Compare):
            return all(is_scalar(side) for side in [node.left, *node.comparators])
        return isinstance(node, ast.BinOp) and is_scalar(node.left) and is_scalar(node.right)

    operators = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.BinOp, ast.Compare)) and not is_scalar(n)
        or isinstance(n, ast.UnaryOp) and not is_scalar(n.operand)
    ]  # (-1 in grad_output * -1 is a constant, not an operation)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and not _is_method_call(n, "expand", "numel")]
    return len(operators), len(calls)


def _is_method_call(node: ast.Call, *methods: str) -> bool:
    """Whether ``node`` calls one of these methods (``shape.numel()``, ``t.expand(shape)``)."""
    return isinstance(node.func, ast.Attribute) and node.func.attr in methods


def _fused_description(bodies: list[tuple[str, str, str | None]], speed_backward: bool, eager_work: str) -> tuple[str, ...]:
    """The fused module's docstring paragraph: which bodies run compiled, which eagerly, and why.

    ``bodies`` holds (kind, function name, why it runs eagerly or None) for forward, backward
    (unless ``speed_backward``) and jvp, in that order; ``eager_work`` names the module's
    small-tensor limit.
    """

    def listed(items: list[str]) -> str:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

    compiled = [f"`{name}`" for _, name, reason in bodies if reason is None]
    kinds = listed([kind for kind, _, _ in bodies])
    compile_note = (
        "through torch.compile(fullgraph=True), compiled on first use (the first call pays the"
        " compile, seconds; a second shape, or value of a number param, compiles once more,"
        " for all of them)."
    )
    text = [f"Fused: the bodies of {kinds} are the pure functions {listed([f'`{name}`' for _, name, _ in bodies])}"]
    if compiled and len(compiled) == len(bodies):
        text[0] += ", which run " + compile_note
    else:
        text[0] += "."
        if compiled:
            text.append(f"{listed(compiled)} run{'s' if len(compiled) == 1 else ''} " + compile_note)
    for reason in dict.fromkeys(reason for _, _, reason in bodies if reason is not None):
        eager = [f"`{name}`" for _, name, r in bodies if r == reason]
        one = len(eager) == 1
        if reason == _ONE_OPERATION:
            text.append(
                f"{listed(eager)} {'is' if one else 'are'} at most one elementwise operation{'' if one else ' each'} and"
                f" run{'s' if one else ''} eagerly: one eager kernel is as fast, and a compiled call would only"
                " add a guard check."
            )
        else:
            called = reason.split(" and ")
            why = (
                " inductor's CPU kernels for these lose relative accuracy near 0 (its expm1 is"
                " exp(x) - 1), and ATen's are accurate."
                if set(called) & set(INDUCTOR_INACCURATE)
                else " inductor compiles its kernel a few ulps less accurately than ATen's."
            )
            text.append(f"{listed(eager)} call{'s' if one else ''} {reason}, so {'it runs' if one else 'they run'} eagerly:" + why)
    if speed_backward:
        text.append(
            "Backward only multiplies by the derivatives forward returned, so it runs eagerly:"
            " compiling one multiplication would add a guarded call and fuse nothing."
        )
    if compiled:
        text.append(
            f"{'The compiled bodies run' if len(compiled) > 1 else listed(compiled) + ' runs'} eagerly"
            " instead, with the same results up to rounding, where compiling cannot work or would not pay: under"
            f" an outer torch.compile (which traces {'them' if len(compiled) > 1 else 'it'} inline), under torch.func transforms"
            " (vmap, grad, jacrev, ..., which cannot call a compiled function from eager mode),"
            " in double backward (create_graph=True, where the eager body is differentiable as it"
            " stands), and on small CPU tensors, where a compiled call costs more than the eager"
            f" kernels (`{eager_work}`, below)."
        )
    return tuple(textwrap.wrap(" ".join(text), width=88))


@dataclass(frozen=True)
class _FusedParts:
    plan: Fused
    forward_call: Method
    backward_call: Method
    jvp_call: Method


class _SymbolStream:
    """CSE temporaries named t0, t1, ... that never collide with any other name."""

    def __init__(self, names: _Names) -> None:
        self._names = names

    def __iter__(self):
        return self

    def __next__(self) -> sympy.Symbol:
        name = next(self._names.temporaries)
        symbol = sympy.Symbol(f"_cse_{name}", real=True)
        self._names.symbols[symbol] = name
        return symbol


def _kernels(body: Method) -> int:
    """How many kernels ``body`` may launch (eager_operations), not counting ``is None``
    tests, which launch none."""
    tree = ast.parse("\n".join([*body.lines, f"_ = {body.returns}"]))
    identity_tests = sum(
        1 for n in ast.walk(tree) if isinstance(n, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in n.ops)
    )
    return eager_operations(body) - identity_tests


_SAVED_TENSORS = re.compile(r"^\(?(?P<names>[\w, ]+?),?\)? = ctx\.saved_tensors$")
_NUMBER_PARAM = re.compile(r"^    (?P<name>\w+) = ctx\.(?P=name)_number$")


def _unpacked(lines: Sequence[str]) -> tuple[list[str], int]:
    """The names a body's leading lines unpack from ``ctx.saved_tensors`` (a number param
    from its ctx attribute, Builder.unpack_saved), and how many lines those are."""
    match = lines and _SAVED_TENSORS.match(lines[0])
    if not match:
        return [], 0
    names = [name.strip() for name in match["names"].split(",") if name.strip()]
    count = 1
    while count + 1 < len(lines) and lines[count].startswith("if ") and _NUMBER_PARAM.match(lines[count + 1]):
        count += 2
    return names, count


def _widening(method: Method, half: str, tensors: set[str]) -> tuple[str | None, int]:
    """The line converting ``method``'s tensors (its parameters and what it unpacks from
    ctx that are among ``tensors``) with _float32_for_half, and the index after the
    unpacking, where it goes at the latest; None where it has no such tensor."""
    unpacked, start = _unpacked(method.lines)
    names = [n for n in (*method.params, *unpacked) if n in tensors]
    if not names:
        return None, start
    return f"{', '.join(names)}, {half} = _float32_for_half({', '.join(names)})", start


@dataclass(frozen=True)
class _Decider:
    """Where an output is rounded back to float16 by the tensors it depends on: the line
    ``name = _half_of(*tensors)`` (Builder.output_dtype_deciders)."""

    name: str
    tensors: tuple[str, ...]


def _in_float32(
    method: Method, half: str, tensors: set[str], rounded: int | None, deciders: Sequence[_Decider | None] | None = None
) -> Method:
    """A forward or jvp computing in float32 what is float16 (Builder.half_in_float32):
    its tensors converted once they are unpacked, and the first ``rounded`` values it
    returns (None: all) rounded back: each by its own decider where ``deciders`` gives one
    whose tensors the body has (decided before they are converted), else by ``half``."""
    widen, start = _widening(method, half, tensors)
    if widen is None:
        return method
    lines = list(method.lines)
    in_scope = set(method.params) | set(_unpacked(method.lines)[0])
    halves = [
        d.name if d is not None and set(d.tensors) <= in_scope else half for d in (deciders or ())
    ]
    own = [d for d, h in zip(deciders or (), halves) if d and h == d.name]
    decisions = [f"{d.name} = _half_of({', '.join(d.tensors)})" for d in own]
    if own:
        # (float16 tensors are converted where any output is float16, not only where the
        # result of all of them is: y**2/(1 + y**2) beside x*y was computed in float16 for a
        # float32 x, inf/inf = nan at y = 300; found in review)
        widen = f"{widen[:-1]}, also=({', '.join(d.name for d in own)},))"
    lines[start:start] = [*decisions, widen]
    lines = [_rounded_return(line, half, rounded, halves) for line in lines]
    return Method(method.params, tuple(lines), _rounded(method.returns, half, rounded, halves))


def _rounded(returns: str, half: str, rounded: int | None = None, halves: Sequence[str] = ()) -> str:
    """What a body returns (one value, or a tuple), its first ``rounded`` values (None:
    all) rounded back to ``half``, or each to its own entry of ``halves`` where they differ."""
    tree = ast.parse(returns, mode="eval").body
    values = [ast.get_source_segment(returns, v) for v in tree.elts] if isinstance(tree, ast.Tuple) else [returns]
    count = len(values) if rounded is None else min(rounded, len(values))
    if any(h != half for h in halves[:count]):
        each = [f"_round_to({halves[k] if k < len(halves) else half}, {v})" for k, v in enumerate(values[:count])]
        return ", ".join([*each, *values[count:]])
    if count == len(values):
        return f"_round_to({half}, {', '.join(values)})"
    call = f"_round_to({half}, {', '.join(values[:count])})"
    return ", ".join([call if count == 1 else f"*{call}", *values[count:]])


def _rounded_return(line: str, half: str, rounded: int | None, halves: Sequence[str] = ()) -> str:
    """A ``return`` line of a body that rounds what it returns back to ``half`` (or
    ``halves``, as _rounded)."""
    indent, text = line[: len(line) - len(line.lstrip())], line.lstrip()
    if not text.startswith("return "):
        return line
    return f"{indent}return {_rounded(text[len('return '):], half, rounded, halves)}"


def _in_float32_backward(method: Method, half: str, tensors: set[str]) -> Method:
    """A backward computing in float32 what is float16 (no rounding back: autograd rounds
    each gradient to its input's dtype), except where one ATen backward kernel call
    (symgrad.kernels) computes the first-order gradient, in float32 itself: only the
    create_graph formulas convert there. A fused module's compiled body (whose call is
    one operation here) converts for itself."""
    widen, start = _widening(method, half, tensors)
    if widen is None:
        return method
    lines = list(method.lines)
    if "if torch.is_grad_enabled():" in lines:
        # (Builder.create_graph_branch: it returns, and first order follows it.)
        branch = lines.index("if torch.is_grad_enabled():")
        end = next((k for k in range(branch + 1, len(lines)) if not lines[k].startswith(INDENT)), len(lines))
        if _kernels(Method(method.params, tuple(lines[end:]), method.returns)) > 1:
            lines.insert(end, widen)
        lines.insert(_past_comments(lines, branch + 1), INDENT + widen)
        return Method(method.params, tuple(lines), method.returns)
    # (_first_order_branch: the kernel, else the formula. A kernel of more than one
    # operation converts too: tanh's is two softplus_backward calls and a product.)
    formulas = [k for k, line in enumerate(lines) if line.strip() == "else:" and _CREATE_GRAPH_FORMULA in lines[k + 1]]
    kernels = [k for k, line in enumerate(lines) if line.strip() == "if not torch.is_grad_enabled():"]
    if not formulas or any(_kernels(_branch(lines, k)) > 1 for k in kernels):
        lines.insert(start, widen)
        return Method(method.params, tuple(lines), method.returns)
    for k in reversed(formulas):
        at = _past_comments(lines, k + 1)
        lines.insert(at, lines[at][: len(lines[at]) - len(lines[at].lstrip())] + widen)
    return Method(method.params, tuple(lines), method.returns)


def _past_comments(lines: Sequence[str], at: int) -> int:
    """The index of the first line from ``at`` on that is not a comment."""
    while lines[at].lstrip().startswith("#"):
        at += 1
    return at


def _branch(lines: Sequence[str], k: int) -> Method:
    """The lines of the block that ``lines[k]`` (an ``if`` or ``else:``) opens, as a body."""
    depth = len(lines[k]) - len(lines[k].lstrip()) + len(INDENT)
    end = next((j for j in range(k + 1, len(lines)) if len(lines[j]) - len(lines[j].lstrip()) < depth), len(lines))
    return Method((), tuple(line[depth:] for line in lines[k + 1 : end]), "None")


_CREATE_GRAPH_FORMULA = "create_graph=True: the formula, which double backward differentiates exactly."


def _first_order_branch(grad: str, kernel: str, formula: list[str], sech_as_sigmoids: bool = False) -> list[str]:
    """A gradient's lines: the kernel's call unless autograd records backward (double
    backward), the formula then (see derive.differentiable_form for ``sech_as_sigmoids``)."""
    why = (
        [
            f"{INDENT}# 1/cosh(u)**2 is 4*sigmoid(2*u)*sigmoid(-2*u) here: autograd's derivative of the",
            f"{INDENT}# cosh is inf*0 = nan where it overflows (|u| > 89 in float32).",
        ]
        if sech_as_sigmoids
        else []
    )
    return [
        "if not torch.is_grad_enabled():",
        f"{INDENT}# First order: ATen's fused backward kernel, fewer passes over memory.",
        f"{INDENT}{grad} = {kernel}",
        "else:",
        f"{INDENT}# {_CREATE_GRAPH_FORMULA}",
        *why,
        *(INDENT + line for line in formula),
    ]


_SECOND_DERIVATIVE_COMMENT = (
    "# create_graph=True: autograd's derivative of the formula would be nan or inexact",
    "# somewhere the math is finite, so the derivative comes from a Function whose",
    "# backward is the exact second derivative.",
)


def _name_series_arguments(temps, reduced, stream: _SymbolStream):
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


def _sum_of_present(target: str, terms: list[tuple[str, str]], term_name: str | None) -> list[str]:
    """Lines setting ``target`` to the sum of ``terms``, (a name that may be None at run
    time, a term that uses it): each is added only where its name is not None, and
    ``target`` stays None where none is."""
    lines = [f"{target} = None"]
    for n, (optional, term) in enumerate(terms):
        lines += [f"if {optional} is not None:", *(INDENT + line for line in _accumulate(target, term, n == 0, term_name))]
    return lines


def _accumulate(target: str, term: str, first: bool, term_name: str | None) -> list[str]:
    """Lines adding ``term`` to ``target``, which is None until a first term arrives (a term
    may be skipped at run time: an absent gradient or tangent)."""
    if first:
        return [f"{target} = {term}"]
    return [f"{term_name} = {term}", f"{target} = {term_name} if {target} is None else {target} + {term_name}"]


def _factor(code: str) -> str:
    """``code`` as the right operand of ``*``: parenthesised if it is a sum or difference.

    Decided on the printed text, not on the SymPy type: an unevaluated Mul(-1, 1 + u) prints
    as ``-1 - u`` (found by the fuzz campaign: ``grad * -1 - u`` was printed).
    """
    top = ast.parse(code, mode="eval").body
    if isinstance(top, (ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Constant, ast.Attribute, ast.Subscript)):
        if not (isinstance(top, ast.BinOp) and isinstance(top.op, (ast.Add, ast.Sub))):
            return code
    return f"({code})"


def _is_one(expr: sympy.Expr) -> bool:
    """Whether ``expr`` is the number 1 (SymPy's ``Float(1.0) == 1`` is False)."""
    return bool(expr.is_number) and not expr.free_symbols and float(expr) == 1.0


def _unpack(names: list[str] | tuple[str, ...]) -> str:
    return f"({names[0]},)" if len(names) == 1 else ", ".join(names)
