"""Code generation, the pipeline's last stages: print, render, write.

:mod:`~symgrad.codegen.syntax` holds code as syntax trees, which the printer builds and the
plan's passes read; :mod:`~symgrad.codegen.printer` prints SymPy expressions as torch code
(as trees) and holds the helpers' sources; :mod:`~symgrad.codegen.render` fills a Jinja2
template from a plan and formats it with black; :mod:`~symgrad.codegen.write` composes the
header and writes files; :mod:`~symgrad.codegen.load` executes a module's text in this process.
"""
