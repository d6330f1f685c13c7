"""The plan as data: what each generated method does, as structure, printed to lines once.

A :class:`Method` keeps apart what later decisions need to see: the tensors it unpacks from
``ctx``, the float16 widening, the body statements, the values it returns and how those
are rounded back. The float16 policy (:mod:`.dtype`), the buffer reuse (:mod:`.inplace`)
and the helper needs (:attr:`Method.helpers`) are decided on these fields. Expressions are
syntax trees (:mod:`symgrad.codegen.syntax`); ``lines`` and ``returns`` print them for the
templates, and nothing reads those back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..codegen.syntax import Code, call, parens, source, starred, tuple_of, unary

INDENT = "    "


@dataclass(frozen=True)
class Assign:
    """``target = value``: ``value`` built by the printer or by the plan. ``target`` is the
    plan's own: a name, ``ctx.<attribute>``, names to unpack, or ``a = b`` (both set)."""

    target: str
    value: Code
    helpers: frozenset[str] = frozenset()  # the module-level helpers ``value`` calls

    def render(self) -> list[str]:
        return [f"{self.target} = {source(self.value)}"]


@dataclass(frozen=True)
class Line:
    """A call that computes nothing to rewrite: a call on ctx, a helper call."""

    code: Code
    helpers: frozenset[str] = frozenset()

    def render(self) -> list[str]:
        return [source(self.code)]


@dataclass(frozen=True)
class Pass:
    """A body with nothing to do."""

    def render(self) -> list[str]:
        return ["pass"]


@dataclass(frozen=True)
class Comment:
    text: str

    def render(self) -> list[str]:
        return [f"# {self.text}"]


@dataclass(frozen=True)
class Raise:
    """``raise`` of an exception: a call the module refuses (a --vjp module's jvp)."""

    exception: Code

    def render(self) -> list[str]:
        return [f"raise {source(self.exception)}"]


@dataclass(frozen=True)
class Return:
    """An early return inside a block (create_graph's branch of backward)."""

    values: tuple[Code, ...]

    def render(self) -> list[str]:
        return [f"return {', '.join(source(v) for v in self.values)}"]


@dataclass(frozen=True)
class Widen:
    """Float16 tensors as float32 (the helper ``_float32_for_half``), and the dtype to round
    results back to, ``half``. ``decisions``: outputs deciding their own rounding by the
    tensors they depend on (``name = _half_of(*tensors)``), passed as ``also``."""

    names: tuple[str, ...]
    half: str
    decisions: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def helpers(self) -> frozenset[str]:
        return frozenset({"_float32_for_half", "_half_of"})

    def render(self) -> list[str]:
        lines = [f"{name} = _half_of({', '.join(tensors)})" for name, tensors in self.decisions]
        # (Printed from the names: ``also``'s trailing comma is black's cue to split the call.)
        widening = f"_float32_for_half({', '.join(self.names)}"
        if self.decisions:
            widening += f", also=({', '.join(name for name, _ in self.decisions)},)"
        lines.append(f"{', '.join(self.names)}, {self.half} = {widening})")
        return lines


@dataclass(frozen=True)
class If:
    """``if condition:`` over ``body``, ``else:`` over ``orelse`` where there is one."""

    condition: Code
    body: tuple["Statement", ...]
    orelse: tuple["Statement", ...] = ()

    def render(self) -> list[str]:
        lines = [f"if {source(self.condition)}:", *(INDENT + line for line in render_statements(self.body))]
        if self.orelse:
            lines += ["else:", *(INDENT + line for line in render_statements(self.orelse))]
        return lines


@dataclass(frozen=True)
class FirstOrderBranch:
    """A gradient by an ATen backward kernel unless autograd records backward (double
    backward), the formula then: what the float16 policy sees as two bodies."""

    kernel: tuple["Statement", ...]
    formula: tuple["Statement", ...]

    def as_if(self) -> If:
        return If(unary("not", call("torch.is_grad_enabled")), self.kernel, self.formula)

    def render(self) -> list[str]:
        return self.as_if().render()


@dataclass(frozen=True)
class CreateGraphBranch:
    """Backward's create_graph=True branch, which returns: the first-order code follows it."""

    body: tuple["Statement", ...]

    def as_if(self) -> If:
        return If(call("torch.is_grad_enabled"), self.body)

    def render(self) -> list[str]:
        return self.as_if().render()


Statement = Union[Assign, Line, Pass, Comment, Raise, Return, Widen, If, FirstOrderBranch, CreateGraphBranch]


def render_statements(statements: tuple[Statement, ...] | list[Statement]) -> list[str]:
    return [line for statement in statements for line in statement.render()]


@dataclass(frozen=True)
class Unpack:
    """Tensors from ``ctx.saved_tensors``; a number param (None there) from its ctx attribute."""

    names: tuple[str, ...]
    number_params: tuple[str, ...] = ()

    def render(self) -> list[str]:
        target = f"({self.names[0]},)" if len(self.names) == 1 else ", ".join(self.names)
        lines = [f"{target} = ctx.saved_tensors"]
        for name in self.number_params:
            lines += [f"if {name} is None:", f"{INDENT}{name} = ctx.{name}_number"]
        return lines


@dataclass(frozen=True)
class Rounding:
    """The returned values rounded back to float16: the first ``count`` (None: all), each by
    its entry of ``halves`` where those differ from ``half``."""

    half: str
    count: int | None = None
    halves: tuple[str, ...] = ()

    def apply(self, values: tuple[Code, ...]) -> Code:
        """The returned expression: ``values`` rounded back (a tuple where there are several)."""
        half, halves = self.half, self.halves
        count = len(values) if self.count is None else min(self.count, len(values))
        if any(h != half for h in halves[:count]):
            each = [call("_round_to", halves[k] if k < len(halves) else half, v) for k, v in enumerate(values[:count])]
            return _returned([*each, *values[count:]])
        if count == len(values):
            return call("_round_to", half, *values)
        rounded = call("_round_to", half, *values[:count])
        return _returned([rounded if count == 1 else starred(rounded), *values[count:]])


def _returned(values: list[Code]) -> Code:
    """What ``return`` gives back: one value, or a tuple of several."""
    return values[0] if len(values) == 1 else tuple_of(*values)


@dataclass(frozen=True)
class Method:
    """One generated function or staticmethod, as structure.

    Printed in this order: ``unpack``, ``widen``, ``body``, then ``return`` of ``values``
    (rounded by ``rounding`` where set).
    """

    params: tuple[str, ...]
    body: tuple[Statement, ...] = ()
    values: tuple[Code, ...] = ()
    unpack: Unpack | None = None
    widen: Widen | None = None
    rounding: Rounding | None = None
    # Helpers that ``values`` call.
    value_helpers: frozenset[str] = field(default=frozenset())
    # Whether the returned tuple is printed in parentheses (as the buffer-reuse rewrite
    # prints a tuple it changed).
    parenthesised: bool = False

    @property
    def statements(self) -> tuple[Statement, ...]:
        """Everything before the return, in order (unpacking and widening included)."""
        head: tuple[Statement, ...] = (self.widen,) if self.widen else ()
        return head + self.body

    @property
    def lines(self) -> tuple[str, ...]:
        head = self.unpack.render() if self.unpack else []
        return tuple(head + render_statements(self.statements))

    @property
    def result(self) -> Code | None:
        """The returned expression (a tuple where it returns several values), or None."""
        if not self.values:
            return None
        if self.rounding is not None:
            return self.rounding.apply(self.values)
        returned = _returned(list(self.values))
        return parens(returned) if self.parenthesised else returned

    @property
    def returns(self) -> str:
        result = self.result
        return "" if result is None else source(result)

    @property
    def helpers(self) -> frozenset[str]:
        found = set(self.value_helpers)
        if self.rounding is not None:
            found.add("_round_to")
        for statement in walk(self.statements):
            found |= getattr(statement, "helpers", frozenset())
        return frozenset(found)


def walk(statements) -> list[Statement]:
    """Every statement of ``statements``, nested ones too, in printing order."""
    found = []
    for statement in statements:
        found.append(statement)
        if isinstance(statement, If):
            found += walk(statement.body) + walk(statement.orelse)
        elif isinstance(statement, FirstOrderBranch):
            found += walk(statement.kernel) + walk(statement.formula)
        elif isinstance(statement, CreateGraphBranch):
            found += walk(statement.body)
    return found


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
    """Stage-3 result: everything a template prints."""

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
    # temporaries in place; None where the two are the same.
    compiled_forward: Method | None = None
    # Double backward's own Function, where autograd's derivative of the create_graph formula
    # would be nan or inaccurate (derive.second_order.autograd_loses_second_derivatives).
    second_derivative: SecondDerivative | None = None
    # Module-level helper functions the module's code calls (printer.HELPERS), as lines.
    helpers: tuple[str, ...] = ()

    def methods(self) -> list[Method]:
        """Every method the templates print."""
        methods = [self.forward, self.setup_context, self.backward, self.jvp, self.value, self.compiled_forward]
        if self.fused:
            methods += [self.fused.forward, self.fused.backward, self.fused.jvp]
        if self.second_derivative:
            second = self.second_derivative
            methods += [second.forward, second.setup_context, second.backward, second.jvp]
        return [m for m in methods if m is not None]
