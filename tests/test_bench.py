"""The benchmark still runs: a smoke test at a tiny size (no timing is asserted).

The numbers in the README come from benchmarks/bench.py, so a change that breaks it
(a renamed option, a template change the modules it generates no longer import with)
should fail here, not when someone next wants numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


def test_benchmark_runs_and_reports_every_variant():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "1e3", "--only", "Double", "Mish", "--repeats", "1", "--warmup", "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "ERROR" not in out and "generation failed" not in out, out
    assert "| Double | 1e+03 |" in out and "| Mish | 1e+03 |" in out, out
    for line in ("default/eager time", "fused/compile time", "default/eager kernels", "default/eager saved bytes"):
        assert line in out, line


def test_every_expression_has_a_baseline_with_the_same_values(tmp_path):
    """bench.BASELINES, the hand-written torch code the generated modules are timed against,
    computes the same function as the expression (checked on the default module)."""
    import importlib.util

    import torch

    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench
    finally:
        sys.path.remove(str(BENCH.parent))
    import symgrad

    assert {e[0] for e in bench.EXPRESSIONS} == set(bench.BASELINES)
    for name, expr, inputs, domain in bench.EXPRESSIONS:
        path = tmp_path / f"{name.lower()}.py"
        path.write_text(symgrad.generate_source(expr, name, inputs=inputs, domain=domain))
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        xs = [x.detach().double() for x in bench.make_inputs(torch, module, 64, "cpu")]
        want = getattr(module, module.__symgrad__["alias"])(*xs)
        torch.testing.assert_close(bench.baseline(torch, module)(*xs), want, rtol=1e-12, atol=1e-12)


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
