"""``python -m symgrad``: the same as the ``symgrad`` command."""

from .cli import run

run()
