"""Shared fixtures: discovery of the modules in generated/ and their sample inputs."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from symgrad.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "generated"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="torch device for the device-aware tests (generated modules' contract, stability, fused,"
        " inductor kernels), e.g. cuda; default cpu",
    )


@pytest.fixture(scope="session")
def device(request):
    """The torch device of ``--device``. Generated code must run unchanged on any device, so
    the contract tests take their inputs here; asking for an absent device is an error, not a skip."""
    import torch

    name = request.config.getoption("--device")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {name}: torch sees no CUDA device")
    return device


def generated_names() -> list[str]:
    """The elementwise modules in generated/ (tests/test_rowwise.py checks the row-wise ones)."""
    return [name for name in _all_generated() if not _is_rowwise(name)]


def rowwise_generated_names() -> list[str]:
    """The modules in generated/ with reductions along a dim, softmax, gather or chunk."""
    return [name for name in _all_generated() if _is_rowwise(name)]


def _all_generated() -> list[str]:
    return sorted(p.stem for p in GENERATED.glob("*.py") if p.name != "__init__.py")


def _is_rowwise(name: str) -> bool:
    from symgrad.frontend.parse import parse_spec
    from symgrad.math.reductions import is_rowwise
    from symgrad.codegen.write import read_spec

    spec = read_spec((GENERATED / f"{name}.py").read_text())
    return any(is_rowwise(out.expr) for out in parse_spec(spec).outputs)


def load(name: str):
    return compiled_at_every_size(importlib.import_module(f"generated.{name}"))


def load_source(source: str, path: Path):
    """``source`` written to ``path`` and imported as a module of its own, registered in
    sys.modules under its stem (Dynamo looks a module's globals up by its name)."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def compiled_at_every_size(module):
    """Make a fused module compile its bodies for tensors of any size, as for large ones.

    The tests' tensors are small, which a fused module would otherwise run eagerly on a CPU
    (its ``_EAGER_WORK_LIMIT``); its contracts must hold for the compiled bodies too.
    tests/test_fused.py checks the small-tensor path itself. A default module is returned as it is.
    """
    if hasattr(module, "_EAGER_WORK_LIMIT"):
        module._EAGER_WORK_LIMIT = 0
    return module


@pytest.fixture(params=generated_names())
def module(request):
    """Each module in generated/, by file stem (black's data-driven cases, tangent's ids)."""
    return load(request.param)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run ``symgrad ARGS`` in ``tmp_path``; returns (exit code, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


# -- Test tiers (tests/README.md) ----------------------------------------------------------
#
# pyproject's addopts deselect the `slow` and `exhaustive` markers; `pytest -m ""` runs all.
# A test parametrized over the axes below runs its whole product only in the slow tier. The
# default tier keeps one axis combination for each combination of its other parameters (each
# case, each module), rotating from one to the next so that together they take every value of
# every axis; a test with too few cases for that keeps as many more as it needs.
VARIANT_AXES = ("dtype", "save", "fuse")
# Long campaigns: the whole grammar's property-based fuzzing (the smooth grammar's stays).
EXHAUSTIVE = {"test_any_expression_generates_or_refuses"}
# Single long tests whose behaviour other default tests cover in part: every benchmark
# variant end to end.
SLOW = {"test_benchmark_runs_and_reports_every_variant"}


# Parameters naming what a test module builds once per process and caches (a generated
# module, a stability case's modules and their inductor compiles): under `--dist loadgroup`
# the tests sharing one run on the same worker, which then builds it once.
SHARED_BUILDS = {"test_generated": ("module",), "test_stability": ("case", "name")}


def pytest_collection_modifyitems(config, items):
    functions: dict[tuple, dict[tuple, list]] = {}
    for item in items:
        name = getattr(item, "originalname", item.name)
        group = _shared_build(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if name in EXHAUSTIVE:
            item.add_marker(pytest.mark.exhaustive)
        if name in SLOW:
            item.add_marker(pytest.mark.slow)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if not any(axis in params for axis in VARIANT_AXES):
            continue
        others = tuple(sorted((key, _identity(value)) for key, value in params.items() if key not in VARIANT_AXES))
        functions.setdefault((item.module.__name__, name), {}).setdefault(others, []).append(item)
    for groups in functions.values():
        kept = _default_variants([[_variant(item) for item in members] for members in groups.values()])
        for members, keep in zip(groups.values(), kept):
            for item in members:
                if _variant(item) not in keep:
                    item.add_marker(pytest.mark.slow)


def _shared_build(item) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    for key in SHARED_BUILDS.get(item.module.__name__, ()):
        if key in params:
            value = params[key]
            return f"{item.module.__name__}:{getattr(value, 'name', value)}"
    return None


def _identity(value) -> object:
    try:
        hash(value)
    except TypeError:
        return id(value)  # (a case object: the same object throughout the parametrize list)
    return value


def _variant(item) -> tuple:
    params = item.callspec.params
    return tuple((axis, params[axis]) for axis in VARIANT_AXES if axis in params)


def _default_variants(groups: list[list[tuple]]) -> list[set[tuple]]:
    """For each group's variants, those the default tier keeps: one per group, chosen greedily
    to take axis values not yet taken (ties rotate through the group's order), then more
    where some value is still untaken."""
    untaken = {value for variants in groups for variant in variants for value in variant}
    kept: list[set[tuple]] = []
    for index, variants in enumerate(groups):
        rotated = variants[index % len(variants) :] + variants[: index % len(variants)]
        best = max(rotated, key=lambda variant: len(untaken.intersection(variant)))
        kept.append({best})
        untaken -= set(best)
    while untaken:
        candidates = [(index, variant) for index, variants in enumerate(groups) for variant in variants]
        index, best = max(candidates, key=lambda candidate: len(untaken.intersection(candidate[1])))
        kept[index].add(best)
        untaken -= set(best)
    return kept
