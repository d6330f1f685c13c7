"""The benchmark still runs: a smoke test at a tiny size (no timing is asserted).

The numbers in the README come from benchmarks/bench.py, so a change that breaks it
(a renamed option, a template change the modules it generates no longer import with)
should fail here, not when someone next wants numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from symgrad.plan.docs import metadata_of

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


def test_benchmark_runs_and_reports_every_variant(tmp_path):
    png = tmp_path / "bench.png"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "1e3", "--only", "Double", "Mish", "--repeats", "1", "--warmup", "0",
         "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "ERROR" not in out and "generation failed" not in out, out
    assert "| Double | 1e+03 |" in out and "| Mish | 1e+03 |" in out, out
    # torch's own function is timed where torch has one (F.mish), and only there
    mish = next(line for line in out.splitlines() if line.startswith("| Mish |")).split(" | ")
    double = next(line for line in out.splitlines() if line.startswith("| Double |")).split(" | ")
    column = out.splitlines()[[l.startswith("| expression") for l in out.splitlines()].index(True)].split(" | ").index("torch's own ms")
    assert mish[column][0].isdigit() and double[column] == "-"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists()
    else:
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), out
    for line in ("default/eager time", "fused/compile time", "default/eager kernels", "default/eager saved bytes", "floor/eager saved bytes"):
        assert line in out, line


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench
    finally:
        sys.path.remove(str(BENCH.parent))
    return bench


@pytest.fixture(scope="module")
def default_modules(bench, tmp_path_factory):
    """Each benchmark expression's default module, as bench.generate writes it."""
    import importlib.util

    import symgrad

    directory = tmp_path_factory.mktemp("bench_modules")
    modules = {}
    for name, expr, inputs, domain in bench.EXPRESSIONS:
        path = directory / f"{name.lower()}.py"
        path.write_text(symgrad.generate_source(expr, name, inputs=inputs, domain=domain))
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[name] = module
    return modules


def test_benchmark_times_an_expanded_upstream_gradient_and_fast_modules():
    """--upstream expanded: the stride-0 upstream gradient of ``y.sum()``; --fast: the eager
    modules generated with --fast. The header says both."""
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "1e3", "--only", "Cube", "--repeats", "1", "--warmup", "0",
         "--sets", "elementwise", "--upstream", "expanded", "--fast"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "upstream gradient (elementwise set): expanded" in result.stdout
    assert "eager modules generated with --fast" in result.stdout
    assert "| Cube | 1e+03 |" in result.stdout and "ERROR" not in result.stdout, result.stdout


def test_every_expression_has_a_baseline_with_the_same_values(bench, default_modules):
    """bench.BASELINES, the hand-written torch code the generated modules are timed against,
    computes the same function as the expression (checked on the default module)."""
    import torch

    assert {e[0] for e in bench.EXPRESSIONS} == set(bench.BASELINES)
    for module in default_modules.values():
        xs = [x.detach().double() for x in bench.make_inputs(torch, module, 64, "cpu")]
        want = getattr(module, metadata_of(module)["alias"])(*xs)
        torch.testing.assert_close(bench.baseline(torch, module)(*xs), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "expr, inputs, tensors",
    [
        ("2*x", ["x"], 0),  # linear: backward needs nothing
        ("x + 3*y", ["x", "y"], 0),
        ("exp(x)", ["x"], 1),
        ("sum(x**2)", ["x"], 1),
        ("mean(tanh(x))", ["x"], 1),
        ("exp(x) + y", ["x", "y"], 1),  # y's gradient is constant
        ("exp(x + y)", ["x", "y"], 1),  # both gradients are the one value exp(x + y)
        # the same with coefficients, whose rounding a double-precision evaluation let
        # through as a second rank (found in review)
        ("exp(x/3 + y/7)", ["x", "y"], 1),
        ("tanh(x/3 - y/7)", ["x", "y"], 1),
        ("1/(1+exp(-(x+3*y+z+w/11)))", ["x", "y", "z", "w"], 1),
        ("x*y+exp(-x)*log(1+y**2)", ["x", "y"], 2),
        ("x*y*z*w", ["x", "y", "z", "w"], 4),
        # several outputs: what is saved must serve every output's gradient
        ("exp(x), 2*exp(x)", ["x"], 1),
        ("x*y, x + y", ["x", "y"], 2),
        ("exp(x), y**2", ["x", "y"], 2),
    ],
)
def test_saved_bytes_floor_is_the_rank_of_the_hessian(bench, expr, inputs, tensors):
    assert bench.saved_floor_tensors({"expr": expr, "inputs": inputs, "params": {}}) == tensors


def test_saved_bytes_floor_with_params(bench):
    """Params are not differentiated: they take their sample values."""
    meta = {"expr": "x*sigmoid(b*x) + a*y", "inputs": ["x", "y"], "params": {"a": 0.5, "b": 1.702}}
    assert bench.saved_floor_tensors(meta) == 1
    meta = {"expr": "softplus(x*y) + log1p(a*y**2) - expm1(x)", "inputs": ["x", "y"], "params": {"a": 2.0}}
    assert bench.saved_floor_tensors(meta) == 2


def test_default_plan_saves_the_floor_on_every_benchmark_expression(bench, default_modules):
    """The saved-bytes target is measured against this floor: the default plan (its list
    of saved tensors; bench.py measures the bytes) reaches it."""
    for name, module in default_modules.items():
        assert len(metadata_of(module)["saved"]) == bench.saved_floor_tensors(metadata_of(module)), name


def test_ab_compares_two_folders_of_modules(tmp_path):
    """benchmarks/ab.py, which the README's A/B tables come from, runs: two folders of one
    module each, many calls per round at a small size; no time is asserted."""
    import symgrad

    for folder, expr in (("old", "x**3"), ("new", "x*x*x")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "cube.py").write_text(symgrad.generate_source(expr, "Cube"))
    result = subprocess.run(
        [sys.executable, str(BENCH.parent / "ab.py"), str(tmp_path / "old"), str(tmp_path / "new"), "--n", "8", "--calls", "3", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rounds of 3 calls" in result.stdout, result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("cube "))
    assert " us " in line and "new/old" in line, line


def test_ab_times_double_backward(tmp_path):
    """``--double``: forward, backward with create_graph=True and its backward, through a
    module whose formula autograd differentiates (old) and one whose double backward has a
    Function of its own (plan.SecondDerivative, new); no time is asserted."""
    import symgrad

    for folder, expr in (("old", "x**3 + x"), ("new", "log(1+exp(x))")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "softplus.py").write_text(symgrad.generate_source(expr, "Softplus"))
    assert "_SoftplusDerivative.apply" in (tmp_path / "new" / "softplus.py").read_text()
    result = subprocess.run(
        [sys.executable, str(BENCH.parent / "ab.py"), str(tmp_path / "old"), str(tmp_path / "new"), "--n", "64", "--rounds", "2", "--double"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("double backward, N=6e+01"), result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("softplus "))
    assert "new/old" in line, line


def test_ab_refuses_zero_calls(tmp_path):
    result = subprocess.run(
        [sys.executable, str(BENCH.parent / "ab.py"), str(tmp_path), str(tmp_path), "--calls", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--calls and --rounds must be at least 1" in result.stderr.splitlines()[-1]


def test_rowwise_set_runs_and_reports_the_issue_targets(tmp_path):
    """The row-wise set end to end at a tiny shape: every case timed against eager, torch's
    own and compile, the targets table, and its panel row in the chart."""
    png = tmp_path / "rowwise.png"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sets", "rowwise", "--row-shape", "8", "16", "--repeats", "1", "--warmup", "0",
         "--png", str(png)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "ERROR" not in out and "generation failed" not in out and "| Double |" not in out, out
    lines = out.splitlines()
    head = next(line for line in lines if line.startswith("| case | shape |")).split(" | ")
    for name in ("Softmax", "RMSNorm", "LayerNorm", "CrossEntropy", "SwiGLU"):
        cells = next(line for line in lines if line.startswith(f"| {name} | 8x16 |")).split(" | ")
        for variant in ("eager ms", "compile ms", "default ms", "torch's own ms"):
            assert cells[head.index(variant)][0].isdigit(), (name, variant, out)
        # --fuse is timed where it generates a module of its own, else reported as not yet
        fused = cells[head.index("fused ms")]
        assert fused == "not yet" or fused[0].isdigit(), out
    assert "| case | default / best of torch's own, eager (<= 1.25) |" in out, out
    assert "geometric mean of default / eager time over 11 cases" in out, out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists()
    else:
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), out


@pytest.fixture(scope="module")
def rowwise_modules(bench, tmp_path_factory):
    """Each row-wise case's default (and --fuse) modules, as bench.generate_rowwise writes them."""
    directory = tmp_path_factory.mktemp("bench_rowwise")
    package = "bench_rowwise_modules"
    (directory / package).mkdir()
    (directory / package / "__init__.py").write_text("")
    sys.path.insert(0, str(directory))
    try:
        yield {case.name: bench.generate_rowwise(directory, package, case) for case in bench.ROWWISE}
    finally:
        sys.path.remove(str(directory))


def _rowwise_case(bench, name):
    return next(case for case in bench.ROWWISE if case.name == name)


def test_rowwise_cases_are_the_generated_textbook_formulas(bench):
    """The row-wise set benchmarks the formulas [tool.symgrad] generates into generated/."""
    import tomllib

    pyproject = tomllib.loads((BENCH.parents[1] / "pyproject.toml").read_text())
    configured = {f["name"]: f for f in pyproject["tool"]["symgrad"]["functions"]}
    for case in bench.ROWWISE:
        assert configured[case.name]["expr"] == case.expr, case.name
        if "inputs" in configured[case.name]:  # (else the expression's symbols, as bench passes them)
            assert tuple(configured[case.name]["inputs"]) == case.inputs, case.name


def test_rowwise_references_compute_the_formula(bench, rowwise_modules):
    """The eager formula and torch's own function each case is timed against give the
    default module's values and gradients (float64, a small shape)."""
    import torch

    for case in bench.ROWWISE:
        module = rowwise_modules[case.name]["symgrad"]
        xs, params = bench.rowwise_arguments(torch, case, (6, 8), "cpu")
        xs = [x.detach().double().requires_grad_() for x in xs]
        want = getattr(module, metadata_of(module)["alias"])(*xs, *params)
        upstream = torch.rand_like(want)
        want_grads = torch.autograd.grad(want, xs, upstream)
        for body in (case.eager, case.own):
            got = bench.rowwise_reference(torch, case, body, "test")(*xs, *params)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=f"{case.name}: {body}")
            for a, b in zip(torch.autograd.grad(got, xs, upstream), want_grads):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"{case.name}: {body}")


def _saved_storages(torch, fn, xs):
    """(output, data pointers of the storages autograd saves during one forward)."""
    pointers = []

    def pack(tensor):
        pointers.append(tensor.untyped_storage().data_ptr())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*xs)
    return out, set(pointers)


def test_softmax_saves_its_output_alone(bench, rowwise_modules):
    import torch

    module = rowwise_modules["Softmax"]["symgrad"]
    softmax = getattr(module, metadata_of(module)["alias"])
    xs, _ = bench.rowwise_arguments(torch, _rowwise_case(bench, "Softmax"), (8, 16), "cpu")
    out, pointers = _saved_storages(torch, softmax, xs)
    assert pointers == {out.untyped_storage().data_ptr()}
    assert bench.saved_bytes(torch, softmax, xs) == 4 * 8 * 16
    split = bench.saved_split(torch, softmax, xs, xs, (8, 16))
    assert (split.full, split.per_row, split.arguments) == (1, 0, 0) and split.meets_rule()


def test_rms_norm_saves_one_full_tensor_plus_one_value_per_row(bench, rowwise_modules):
    """x, w as given and one float32 statistic per row, as Liger's and unsloth's RMSNorm."""
    import torch

    case = _rowwise_case(bench, "RMSNorm")
    module = rowwise_modules["RMSNorm"]["symgrad"]
    xs, params = bench.rowwise_arguments(torch, case, (8, 16), "cpu")
    rms_norm = bench._bound(getattr(module, metadata_of(module)["alias"]), params)
    x, w = xs
    _, pointers = _saved_storages(torch, rms_norm, xs)
    assert {x.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()} <= pointers and len(pointers) == 3
    assert bench.saved_bytes(torch, rms_norm, xs) == 4 * 8 * 16 + 4 * 16 + 4 * 8
    split = bench.saved_split(torch, rms_norm, xs, xs + params, (8, 16))
    assert (split.full, split.per_row, split.arguments) == (1, 4, 4 * 16) and split.meets_rule()
    # the eager formula keeps x and the normalised x: two full tensors, over the rule
    eager = bench._bound(bench.rowwise_reference(torch, case, case.eager, "eager"), params)
    assert not bench.saved_split(torch, eager, xs, xs + params, (8, 16)).meets_rule()


def test_fused_is_not_yet_only_where_its_source_is_the_default_one(bench):
    """The row-wise set times ``--fuse`` only where it generates a module of its own: the
    comparison ignores the header (which names the options), and sees a fused body."""
    import symgrad

    default = symgrad.generate_source("exp(x)/sum(exp(x), -1)", "Softmax")
    reheaded = default.replace("--name Softmax", "--name Softmax --fuse", 1)
    assert reheaded != default and bench._without_header(reheaded) == bench._without_header(default)
    mish, mish_fused = (symgrad.generate_source("x*tanh(log(1+exp(x)))", "Mish", fuse=fuse) for fuse in (False, True))
    assert bench._without_header(mish) != bench._without_header(mish_fused)
