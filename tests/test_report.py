"""``symgrad report``: its numbers on functions with a known answer, its files, and the
path without matplotlib. The command's error paths are in test_cli.py (ERROR_CASES)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from symgrad.cli.main import main as cli_main
from symgrad.report import accuracy, cost
from symgrad.report.references import torch_own_code
from symgrad.report.subject import EAGER, GENERATED, TORCH, load_module_file

ROOT = Path(__file__).resolve().parent.parent
GENERATED_DIR = ROOT / "generated"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _curves(result, implementation, dtype):
    return {c.quantity: c for c in result.curves if c.implementation == implementation and c.dtype == dtype}


def _error_at(curve, x):
    return curve.errors[curve.x.index(x)]


@pytest.fixture(scope="module")
def softplus():
    subject = load_module_file(GENERATED_DIR / "softplus.py")
    return subject, accuracy.measure(subject, subject.domain, per_decade=1)


def test_exp_is_exact_to_one_ulp():
    subject = load_module_file(GENERATED_DIR / "exp.py")
    result = accuracy.measure(subject, subject.domain, per_decade=2)
    for dtype in accuracy.DTYPES:
        for quantity, curve in _curves(result, GENERATED, dtype).items():
            worst, where = curve.worst
            assert worst <= 1, f"exp {quantity} in {dtype}: {worst} ulps at x={where}"
            # the sweep reaches past overflow and underflow on both sides
            assert min(curve.x) <= -1e30 and max(curve.x) >= 1e30 and 0.0 in curve.x


def test_autograd_of_softplus_formula_is_inf_at_100(softplus):
    subject, result = softplus
    assert list(subject.implementations) == [GENERATED, EAGER, TORCH]
    eager = _curves(result, EAGER, "float32")
    # log(1+exp(100)): exp overflows float32, so the value is inf and the gradient nan
    assert math.isinf(_error_at(eager[accuracy.VALUE], 100.0))
    assert math.isinf(_error_at(eager[accuracy.GRADIENT], 100.0))
    for quantity, curve in _curves(result, GENERATED, "float32").items():
        assert _error_at(curve, 100.0) <= 1, quantity
        assert curve.worst[0] <= 2 and curve.non_finite == 0, quantity


def test_error_in_eps():
    import torch

    info = torch.finfo(torch.float32)
    assert accuracy.error_in_eps(1.0, 1.0, info) == 0
    assert accuracy.error_in_eps(1.0 + info.eps, 1.0, info) == pytest.approx(1.0)
    assert accuracy.error_in_eps(math.inf, 1e39, info) == 0  # the exact value overflows float32
    assert math.isinf(accuracy.error_in_eps(math.nan, 1.0, info))
    assert math.isinf(accuracy.error_in_eps(math.inf, 1.0, info))


def test_removable_singularity_is_measured_at_the_point():
    subject = load_module_file(GENERATED_DIR / "sinc.py")
    result = accuracy.measure(subject, subject.domain, per_decade=1, dtypes=("float64",))
    curves = _curves(result, GENERATED, "float64")
    # sin(x)/x at 0 is 1 (the limit), and its derivative 0: both measured, both exact
    assert _error_at(curves[accuracy.VALUE], 0.0) == 0
    assert _error_at(curves[accuracy.GRADIENT], 0.0) == 0
    # eager autograd's gradient of sin(x)/x cancels near 0
    assert _curves(result, EAGER, "float64")[accuracy.GRADIENT].worst[0] > 1e6


def test_points_outside_the_domain_are_not_measured():
    subject = load_module_file(GENERATED_DIR / "sqrt_inverse.py")
    result = accuracy.measure(subject, subject.domain, per_decade=1, dtypes=("float64",))
    assert all(x > 0 for c in result.curves for x in c.x)


def test_torch_own_function_is_found_by_the_math():
    assert torch_own_code("log(exp(x)+1)", ["x"]) == "F.softplus(x)"
    assert torch_own_code("log(1+exp(t))", ["t"]) == "(lambda x: F.softplus(x))(t)"
    assert torch_own_code("x**2", ["x"]) is None
    assert torch_own_code("x*y", ["x", "y"]) is None


def test_saved_bytes_per_element(softplus):
    subject, _ = softplus
    costs = {c.implementation: c for c in cost.measure(subject, 1000, 1, compile=False)}
    assert costs[GENERATED].saved_per_element == 4  # x
    assert costs[EAGER].saved_per_element == 8  # x and exp(x)
    assert costs[EAGER].ratio == 1


def _report(*args):
    return cli_main(["report", str(GENERATED_DIR / "softplus.py"), "--no-timing", "--points-per-decade", "1", *args])


def test_png_and_html_are_written(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "r"
    assert _report("--out", str(out)) == 0
    png, page = out / "softplus.png", out / "softplus.html"
    assert png.read_bytes().startswith(PNG_SIGNATURE) and png.stat().st_size > 10_000
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "data:image/png;base64," in text and "eager autograd" in text
    captured = capsys.readouterr()
    assert "Softplus: log(1+exp(x))" in captured.out
    assert captured.err == ""  # no progress bar when stderr is not a terminal


def test_without_matplotlib_the_table_prints_with_a_hint(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "r"
    assert _report("--out", str(out)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Softplus: ") and any(line.startswith("    eager autograd") for line in lines)
    assert lines[-1] == "(no PNG/HTML: matplotlib is not installed; pip install 'symgrad[report]')"
    assert not out.exists()


def test_an_expression_not_yet_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["report", "-x*exp(x)", "--name", "NegExp", "--no-timing", "--points-per-decade", "1"]) == 0
    assert capsys.readouterr().out.startswith("NegExp: -x*exp(x)")
    assert list(tmp_path.iterdir()) == []  # nothing written in the working folder


@pytest.mark.slow
def test_full_report_with_timing_and_compile(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code = cli_main(["report", str(GENERATED_DIR / "softplus.py"), "--out", str(tmp_path), "--size", "1e4", "--repeats", "3"])
    assert code == 0
    out = capsys.readouterr().out
    assert "torch.compile" in out and "saved B/element" in out


def test_progress_shows_on_a_terminal(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert _report() == 0
    assert "accuracy:   0%" in terminal.getvalue() and "/246 " in terminal.getvalue()  # points x dtypes
    assert "accuracy: " not in capsys.readouterr().out.split("\n", 2)[0]  # (the bar is not on stdout)
