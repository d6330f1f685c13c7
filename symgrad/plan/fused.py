"""Fused mode (--fuse): the bodies as pure functions that torch.compile runs, and the
methods that call them through the module's runner."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import sympy

from ..codegen.syntax import NONE, Code, attribute, call, name
from .code import unpack_target
from .ir import Assign, Fused, Method, Statement
from .names import fused_names
from .operations import calls, eager_operations, one_elementwise_operation

# Functions whose inductor kernels lose relative accuracy near 0 (torch 2.13, CPU): the
# vectorised expm1 is exp(x) - 1 (5% off at x = 1e-6 in float32, 100% at 1e-30), and atanh
# and float32 erf lose the same way. tests/test_inductor.py measures every function the
# printer uses. A fused body calling one runs eagerly, on ATen's accurate kernel. (torch
# 2.14.1 computes expm1 accurately; the list keeps it, since a generated file may run on
# torch 2.13 and older.)
INDUCTOR_INACCURATE = ("torch.atanh", "torch.expm1", "torch.special.erf")

# Helpers (printer.HELPERS) whose kernel inductor compiles a few ulps less accurately than
# ATen's, by the torch function they call: log_ndtr, 4.5 float64 ulps off at 1e-8 and 3.4
# float32 ulps at -1e-4, where ATen's is 0.5 ulps off or less (torch 2.13, CPU). A fused
# body calling one runs eagerly too. (Not in INDUCTOR_INACCURATE, which tests/test_inductor.py
# checks to be exactly what it measures above 4 ulps at its sample points: log_ndtr sits at
# that line.)
INDUCTOR_LESS_ACCURATE_HELPERS = {"_log_ndtr": "torch.special.log_ndtr"}

@dataclass(frozen=True)
class EagerReason:
    """Why a fused module calls a body directly instead of compiled: the calls whose inductor
    kernel is less accurate than ATen's, or none where the body is one elementwise operation."""

    inaccurate_calls: tuple[str, ...] = ()


def eager_reason(body: Method, scalars: frozenset[str]) -> EagerReason | None:
    """Why a fused module calls ``body`` directly instead of compiled, or None to compile it."""
    if one_elementwise_operation(body, scalars):
        return EagerReason()
    called = calls(body)
    inaccurate = tuple(name for name in (*INDUCTOR_INACCURATE, *INDUCTOR_LESS_ACCURATE_HELPERS) if name in called)
    return EagerReason(inaccurate) if inaccurate else None


@dataclass(frozen=True)
class FusedParts:
    plan: Fused
    forward_call: Method
    backward_call: Method
    jvp_call: Method


class FusedBodies:
    """Builds a fused module's pure functions (``builder``: :class:`~.bodies.Builder`)."""

    def __init__(self, builder) -> None:
        self.b = builder

    def build(self, saved: list[sympy.Symbol]) -> FusedParts:
        """The pure functions, and the methods that call them through the runner."""
        b = self.b
        names = fused_names(b.alias)
        runner = names["runner"]

        def pure(build, fixed: tuple[str, ...]) -> tuple[Method, tuple[Code, ...]]:
            """Build a body with ctx attributes as parameters; also return the call's ctx args."""
            b.pure, b.pure_used = True, []
            try:
                method = build()
            finally:
                b.pure = False
            used = tuple(b.pure_used)
            params = fixed + tuple(b.pure_params[a] for a in used)
            return Method(params, method.body, method.values, value_helpers=method.value_helpers), tuple(
                attribute("ctx", a) for a in used
            )

        bodies: list[tuple[str, str, str | None]] = []  # (forward|backward|jvp, name, why eager)
        # Values that are never full-size tensors: the 0-d gradient of a sum or mean. (Not
        # params: they may be tensors.) An operation between two of them is no pass over memory.
        scalars = frozenset(g for g, out in zip(b.names.grad_outputs, b.outputs) if out.reduction)

        def body_call(kind: str, body: Method, args: tuple[str | Code, ...], runs: Method | None = None) -> Code:
            """The body's call: through the runner, or direct where compiling cannot pay or
            would be inaccurate. ``runs``: what the body runs, where that is more than its own
            statements (a Function it calls)."""
            runs = runs or body
            function, reason = names[kind], eager_reason(runs, scalars)
            bodies.append((kind, function, reason))
            if reason is not None:
                return call(function, *args)
            return call(runner, function, *args, operations=eager_operations(runs, scalars))

        forward, _ = pure(b.forward, b.forward_params())
        forward_call = Method(b.forward_params(), (), (body_call("forward", forward, b.forward_params()),))

        values = [b.name(s) for s in saved] + [b.name(p) for p in b.saving.saved_params()]
        if b.speed:
            backward, backward_call = None, b.backward(saved)
        else:
            fixed = b.names.grad_outputs + tuple(values)
            backward, ctx_args = pure(lambda: b.backward(saved, with_unpack=False), fixed)
            grads = list(b.names.grads)
            backward = Method(backward.params, backward.body, tuple(name(g) for g in grads))
            target = unpack_target(grads) if len(grads) > 1 else grads[0]
            line = Assign(target, body_call("backward", backward, fixed + ctx_args))
            # Double backward's Function, where it has one, is called here: the body is pure.
            entries = b.gradient_entries()
            create_graph = b.second_derivatives.create_graph_branch(entries, [b.rows[i][j] for i, j in entries])
            backward_call = Method(
                ("ctx",) + b.names.grad_outputs,
                (*([create_graph] if create_graph else []), line),
                tuple(name(g) for g in grads) + (NONE,) * len(b.params),
                unpack=b.saving.unpack_saved(saved),
            )

        fixed = b.names.tangents + tuple(values)
        jvp, ctx_args = pure(lambda: b.jvp(saved, with_unpack=False), fixed)
        # A jvp that calls SecondDerivative runs its forward too, compiled along (Dynamo traces
        # the Function): its operations count, and its functions must be ones inductor
        # computes accurately.
        if b.second_symbols:
            second = b.second.forward
            second_forward: tuple[Statement, ...] = (*second.statements, Assign("_", second.result))
            runs = Method(jvp.params, (*second_forward, *jvp.body), jvp.values)
        else:
            runs = None
        jvp_call = Method(
            ("ctx",) + b.names.tangents,
            (),
            (body_call("jvp", jvp, fixed + ctx_args, runs),),
            unpack=b.saving.unpack_saved(saved),
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
            description=fused_description(bodies, speed_backward=backward is None, eager_work=names["eager_work"]),
        )
        return FusedParts(plan, forward_call, backward_call, jvp_call)


def fused_description(
    bodies: list[tuple[str, str, str | None]], speed_backward: bool, eager_work: str
) -> tuple[str, ...]:
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
        if not reason.inaccurate_calls:
            text.append(
                f"{listed(eager)} {'is' if one else 'are'} at most one elementwise operation{'' if one else ' each'} and"
                f" run{'s' if one else ''} eagerly: one eager kernel is as fast, and a compiled call would only"
                " add a guard check."
            )
        else:
            called = reason.inaccurate_calls
            why = (
                " inductor's CPU kernels for these lose relative accuracy near 0 (its expm1 is"
                " exp(x) - 1), and ATen's are accurate."
                if set(called) & set(INDUCTOR_INACCURATE)
                else " inductor compiles its kernel a few ulps less accurately than ATen's."
            )
            text.append(
                f"{listed(eager)} call{'s' if one else ''} {' and '.join(called)}, so {'it runs' if one else 'they run'} eagerly:"
                + why
            )
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
