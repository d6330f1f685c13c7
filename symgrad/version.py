"""The generator's version, recorded in every generated module's header (a module of its
own, so that the modules that record it need not import the package's top level)."""

__version__ = "0.1.0"
