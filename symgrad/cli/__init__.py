"""The ``symgrad`` command: :func:`run` is its console-script entry point.

:mod:`symgrad.cli.main` parses the command line and runs generate, regen, check and
build; :mod:`symgrad.cli.config` reads the ``[tool.symgrad]`` table that ``build`` uses.
"""

from .main import run as run

__all__ = ["run"]
