"""Every name the generated code uses, decided in one place.

User symbols may be called anything a Python identifier allows, including names the
generated code itself needs (``ctx``, ``torch``, ``grad_output``, a temporary ``t0``).
Those are renamed internally, never rejected.
"""

from __future__ import annotations

import keyword
import re

from .errors import SymgradError

# Names that the generated module body uses for itself. A user symbol with one of these
# names is renamed inside method bodies (its name stays in the public signature).
RESERVED = frozenset(
    {
        "torch",
        "ctx",
        "inputs",
        "output",
        "outputs",
        "result",
        "self",
        "grad_output",
        "shape",
        "None",
        "True",
        "False",
    }
)

_CLASS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")

# The class and its functional alias are module-level names, so neither may shadow a global
# the module's own code reads: its imports, and the builtins its bodies and helpers call
# (`--name Any` would write a module whose every call raises: the float16 helpers call
# any()). A fixed list, not dir(builtins): `Max`, `Abs` and `Sum` work, and what is refused
# must not depend on how Python was started.
# tests/test_cli.py::test_shadowed_names_cover_what_generated_modules_read keeps it in step.
SHADOWED = frozenset(
    {
        "torch",
        "inspect",
        "all",
        "any",
        "bool",
        "float",
        "getattr",
        "isinstance",
        "len",
        "set",
        "staticmethod",
        "tuple",
        "type",
        "Exception",
        "NotImplementedError",
        "RuntimeError",
        "ValueError",
    }
)


def snake_case(name: str) -> str:
    """CamelCase to snake_case, keeping acronyms whole.

    >>> snake_case("SqrtInverse"), snake_case("GELU"), snake_case("RoundSTE")
    ('sqrt_inverse', 'gelu', 'round_ste')
    """
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words)
    return words.lower()


def check_class_name(name: str) -> str:
    """Validate ``--name`` and return the functional alias (its snake_case)."""
    if not _CLASS_NAME.match(name) or keyword.iskeyword(name):
        raise SymgradError(
            f"--name {name!r} is not a valid class name: use a CamelCase Python identifier, e.g. SqrtInverse"
        )
    alias = snake_case(name)
    _refuse_shadowing(name, name, "class")
    if alias == name:
        raise SymgradError(
            f"--name {name!r} must contain an upper-case letter, so that the functional alias"
            f" {alias!r} differs from the class (e.g. {name[0].upper() + name[1:]})"
        )
    if keyword.iskeyword(alias) or alias == "__init__":
        raise SymgradError(f"--name {name!r} gives the module name {alias!r}, which Python cannot import")
    _refuse_shadowing(name, alias, "functional alias")
    return alias


def _refuse_shadowing(name: str, defined: str, what: str) -> None:
    """Refuse ``--name name`` if the module-level ``defined`` (the class or its alias) is in
    SHADOWED."""
    if defined not in SHADOWED:
        return
    shadowed = "the module's import" if defined in ("torch", "inspect") else "Python's builtin"
    which = "" if defined == name else f" gives the {what} {defined!r}, which"
    raise SymgradError(f"--name {name!r}{which} would shadow {shadowed} {defined!r} in the module: choose another name")


class Namer:
    """Hands out collision-free Python identifiers, deterministically."""

    def __init__(self, taken: set[str]) -> None:
        self._taken = set(taken)

    def claim(self, wanted: str) -> str:
        """Return ``wanted`` if free, else ``wanted_``, ``wanted__``, ... and mark it taken."""
        name = wanted
        while name in self._taken or keyword.iskeyword(name):
            name += "_"
        self._taken.add(name)
        return name

    def numbered(self, prefix: str) -> "NumberedNames":
        return NumberedNames(self, prefix)


class NumberedNames:
    """An endless ``t0, t1, ...`` that skips names already taken (e.g. a user's ``t0``)."""

    def __init__(self, namer: Namer, prefix: str) -> None:
        self._namer = namer
        self._prefix = prefix
        self._next = 0

    def __next__(self) -> str:
        while True:
            name = f"{self._prefix}{self._next}"
            self._next += 1
            if name not in self._namer._taken:
                self._namer._taken.add(name)
                return name

    def __iter__(self) -> "NumberedNames":
        return self
