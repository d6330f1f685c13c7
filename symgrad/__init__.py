"""symgrad: verified, readable torch.autograd.Function code from a SymPy expression."""

from __future__ import annotations

from .api import build_spec as build_spec
from .api import generate_file as generate_file
from .api import generate_source as generate_source
from .errors import SymgradError as SymgradError
from .spec import Spec as Spec
from .version import __version__ as __version__

__all__ = ["__version__", "SymgradError", "Spec", "build_spec", "generate_file", "generate_source"]
