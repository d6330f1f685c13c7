"""symgrad: verified, readable torch.autograd.Function code from a SymPy expression.

The Python API:

- :func:`generate_source` returns a generated module's text, and :func:`function` the
  Function class that text defines, loaded in this process (for notebooks);
- :func:`build_spec` validates the arguments into a :class:`Spec`, and
  :func:`generate_file` writes its module into a folder (only when the text changed);
- :class:`SymgradError` is the one exception for bad input, with a one-line message;
  :class:`SymgradWarning` says where a generated function works, but not as well as it might.

>>> import symgrad
>>> source = symgrad.generate_source("sqrt(x)+1/x", "SqrtInverse")
>>> "def sqrt_inverse(x):" in source
True

The ``symgrad`` command (``symgrad EXPR --name NAME``, ``symgrad build``, ``regen``,
``check``) is :mod:`symgrad.cli`.
"""

from __future__ import annotations

from .api import build_spec as build_spec
from .api import function as function
from .api import generate_file as generate_file
from .api import generate_source as generate_source
from .errors import SymgradError as SymgradError
from .errors import SymgradWarning as SymgradWarning
from .spec import Spec as Spec
from .version import __version__ as __version__

__all__ = [
    "__version__",
    "SymgradError",
    "SymgradWarning",
    "Spec",
    "build_spec",
    "function",
    "generate_file",
    "generate_source",
]
