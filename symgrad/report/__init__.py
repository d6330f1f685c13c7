"""``symgrad report``: a generated Function's accuracy against mpmath and its cost, against
eager autograd of the same formula, torch's own function and ``torch.compile``.

Unlike the generator, this package imports torch (lazily, when a report runs). Its parts:
:mod:`.subject` loads the module and its comparisons (:mod:`.references`), :mod:`.truth`
and :mod:`.accuracy` measure errors, :mod:`.cost` saved bytes and time, :mod:`.output`
writes the table, the PNG and the HTML page, and :mod:`.command` is the command line.
"""

from .command import main as main

__all__ = ["main"]
