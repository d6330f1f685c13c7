"""Stage 5, in process: a generated module's text executed as a module of its own."""

from __future__ import annotations

import itertools
import linecache
import sys
import types

# Numbers each loaded module's name, so that two loads of one function never share a module.
_LOADS = itertools.count(1)


def load_source(source: str, stem: str) -> types.ModuleType:
    """Execute ``source`` as a new module named ``_symgrad_<stem>_<n>`` and return it.

    The module is in ``sys.modules`` before its code runs, as an imported one is:
    torch.compile (Dynamo) may look a function's module up there by name, and has failed
    ("No module named ...") on a module loaded by hand that was not. Its text is in
    ``linecache``, so tracebacks, ``inspect`` and pdb show the generated lines. If executing
    fails, neither keeps it.
    """
    name = f"_symgrad_{stem}_{next(_LOADS)}"
    filename = f"<symgrad {name}>"
    module = types.ModuleType(name)
    module.__file__ = filename
    # (size, mtime, lines, name): an mtime of None keeps linecache.checkcache from dropping it.
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    sys.modules[name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        linecache.cache.pop(filename, None)
        raise
    return module
