"""symgrad: verified, readable torch.autograd.Function code from a SymPy expression."""

from __future__ import annotations

__version__ = "0.1.0"

from .api import build_spec as build_spec  # noqa: E402
from .api import generate_file as generate_file  # noqa: E402
from .api import generate_source as generate_source  # noqa: E402
from .errors import SymgradError as SymgradError  # noqa: E402
from .spec import Spec as Spec  # noqa: E402

__all__ = ["__version__", "SymgradError", "Spec", "build_spec", "generate_file", "generate_source"]
