"""Code that runs inside generated modules, not in the generator.

:mod:`symgrad.runtime.helpers` holds the module-level helper functions a generated module
may call. The generator never imports it (it would import torch): ``symgrad.codegen.printer``
reads its source text and copies each function a module needs into that module.
"""
