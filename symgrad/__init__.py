"""symgrad: verified, readable torch.autograd.Function code from a SymPy expression.

The Python API:

- :func:`generate_source` returns a generated module's text;
- :func:`build_spec` validates the arguments into a :class:`Spec`, and
  :func:`generate_file` writes its module into a folder (only when the text changed);
- :class:`SymgradError` is the one exception for bad input, with a one-line message.

>>> import symgrad
>>> source = symgrad.generate_source("sqrt(x)+1/x", "SqrtInverse")
>>> "def sqrt_inverse(x):" in source
True

The ``symgrad`` command (``symgrad EXPR --name NAME``, ``symgrad build``, ``regen``,
``check``) is :mod:`symgrad.cli`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .api import build_spec as build_spec  # noqa: E402
from .api import generate_file as generate_file  # noqa: E402
from .api import generate_source as generate_source  # noqa: E402
from .errors import SymgradError as SymgradError  # noqa: E402
from .spec import Spec as Spec  # noqa: E402

__all__ = ["__version__", "SymgradError", "Spec", "build_spec", "generate_file", "generate_source"]
