"""The public Python API: its docstrings' examples run as doctests, and the package
exports exactly the documented, typed surface."""

from __future__ import annotations

import doctest
import inspect

import pytest

import symgrad
import symgrad.api
import symgrad.errors
import symgrad.spec


@pytest.mark.parametrize("module", [symgrad, symgrad.api, symgrad.spec, symgrad.errors], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, raise_on_error=False, verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_public_surface_is_documented_and_typed():
    assert sorted(symgrad.__all__) == sorted(
        ["__version__", "SymgradError", "SymgradWarning", "Spec", "build_spec", "function", "generate_file", "generate_source"]
    )
    for name in ("build_spec", "function", "generate_file", "generate_source"):
        function = getattr(symgrad, name)
        assert ">>> " in function.__doc__, name
        signature = inspect.signature(function)
        assert signature.return_annotation is not inspect.Signature.empty, name
        for parameter in signature.parameters.values():
            assert parameter.annotation is not inspect.Parameter.empty, (name, parameter.name)
    assert ">>> " in symgrad.Spec.__doc__ and ">>> " in symgrad.SymgradError.__doc__
