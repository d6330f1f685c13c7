"""Benchmark symgrad's generated Functions against eager autograd and torch.compile.

Run from the repository root (1-3 minutes on 2 cores with a warm inductor cache; a cold
one adds 5-30 s per compile):

    python benchmarks/bench.py                      # N = 1e6 and 1e7, float32, CPU
    python benchmarks/bench.py --sizes 1e6 --png bench.png --only Mish GELU   # the chart: matplotlib
    python benchmarks/bench.py --device cuda --sizes 1e7 1e8   # on a GPU
    python benchmarks/bench.py --sets rowwise --repeats 31     # the row-wise set alone

For every expression in EXPRESSIONS it generates four modules with
``symgrad.generate_source`` into a temporary package (the default, ``save="speed"``,
``fuse=True``, and both) and times one forward plus backward (``torch.autograd.grad``
with a fixed upstream gradient) for six variants:

- ``eager``: the expression as a careful PyTorch user would write it (BASELINES: torch's
  own kernels where it has them, ``torch.sigmoid``, ``F.softplus``, ``torch.log1p``, and
  the stable spellings symgrad's values are held to, ``erfc`` and ``hypot``), differentiated
  by eager autograd. It is fixed here, not taken from symgrad's output, so that a change
  in what symgrad prints cannot move the baseline;
- ``compile``: ``torch.compile`` (inductor) of that same eager expression;
- ``symgrad``: the generated Function (default mode, ``--save memory``);
- ``speed``: the generated Function with ``--save speed``;
- ``fused``: the generated Function with ``--fuse``;
- ``fused_speed``: the generated Function with ``--fuse --save speed``;
- ``torch``: torch's own function for the expression (``F.mish``, ``F.gelu``, ...), where
  it has one: the table ``symgrad report`` compares with too
  (``symgrad.report.references.TORCH_OWN``).

The row-wise set (ROWWISE: softmax, norms, losses, SwiGLU; ``--sets rowwise`` alone) runs
each case once at ``--row-shape`` (default 2048 x 1024) with ``--repeats`` timed runs, against
``eager`` (the textbook formula as a careful user writes it), ``compile`` of it, ``torch``
(torch's own function), ``symgrad`` (the default module) and ``fused`` (``--fuse``, timed only
where it generates a module of its own; "not yet" where its source is the default's). It
prints issue 44's targets per case: default time over the best of torch's own and eager,
saved bytes against both and against one full tensor plus per-row statistics (SavedSplit),
fused over compile, and the geometric mean of default over eager.

Times are the median (with min and max) over ``--repeats`` runs after warm-up. The
first call of ``compile`` and ``fused`` includes compiling; it is reported separately.
Fused modules run as shipped: on small CPU tensors (below 122,880 elements for a
1-operation body, fewer for longer ones; ``_EAGER_WORK_LIMIT`` in a fused module) their
short bodies run eagerly, so at such ``--sizes`` the fused columns time that eager path
and compile only the bodies past the limit.
Saved bytes are the unique storages that autograd keeps for backward, counted with
``torch.autograd.graph.saved_tensors_hooks`` (inputs included when they are saved).
Their floor is what any backward must keep at full precision: as many input-sized
tensors as the rank of the elementwise part's Hessian (``saved_floor_tensors``), so one
for a one-input function.
The bandwidth floor is the traffic fwd+bwd cannot avoid, divided by the measured copy
bandwidth at the same N: forward reads each input and writes each elementwise output;
backward reads each elementwise upstream gradient and each tensor the minimal plan
saves (the default module's ``saved`` list), and writes one gradient per input.

Threads: one by default (``--threads``). On a shared machine, an OpenMP thread that the
OS deschedules stalls every parallel op until it runs again (30 ms jumps on a busy
2-core box), which swamps the comparison; one thread measures the code, not the load.

Allocator: at N=1e7 glibc's default returns every 40 MB buffer to the OS and page-faults
it back in on the next allocation, which dominates eager timings. The script re-executes
itself with ``MALLOC_MMAP_MAX_=0`` and ``MALLOC_TRIM_THRESHOLD_`` set high (so freed
buffers are reused) unless ``--system-malloc`` is given or they are already set.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

def module_metadata(module) -> dict:
    """The module's ``__symgrad__`` with every key (symgrad imported only when needed)."""
    from symgrad.plan.docs import metadata_of

    return metadata_of(module)


ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}


def keep_freed_buffers(system_malloc: bool) -> None:
    """Re-execute this script with ALLOCATOR_ENV set, unless ``system_malloc`` or already set."""
    if not system_malloc and any(k not in os.environ for k in ALLOCATOR_ENV):
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, **ALLOCATOR_ENV))


# (class name, expression, inputs, domain): the seed functions, common activations, a
# several-input function and a large expression. The domain (where inputs are sampled)
# is given explicitly, so that the benchmark does not depend on symgrad's domain search.
X = {"x": (-3.0, 3.0)}
EXPRESSIONS = [
    ("Double", "2*x", None, X),
    ("Square", "x**2", None, X),
    ("Cube", "x**3", None, X),
    ("Exp", "exp(x)", None, X),
    ("SquareSum", "sum(x**2)", None, X),
    ("SqrtInverse", "sqrt(x)+1/x", None, {"x": (0.5, 4.0)}),
    ("Sigmoid", "1/(1+exp(-x))", None, X),
    ("Tanh", "tanh(x)", None, X),
    ("Mish", "x*tanh(log(1+exp(x)))", None, X),
    ("SiLU", "x/(1+exp(-x))", None, X),
    ("GELU", "x/2*(1+erf(x/sqrt(2)))", None, X),
    ("Softplus", "log(1+exp(x))", None, X),
    ("TwoInput", "x*y+exp(-x)*log(1+y**2)", ["x", "y"], {"x": (-3.0, 3.0), "y": (-3.0, 3.0)}),
    (
        "Large",
        "sin(x)*exp(-x**2/2) + x**3/(1+x**2) + tanh(x)*log(1+x**2) + sqrt(1+x**2)*cos(2*x) + x**4/24 - x/3",
        None,
        X,
    ),
]


@dataclass(frozen=True)
class RowwiseCase:
    """One row-wise benchmark case: the textbook formula symgrad generates from (as in
    [tool.symgrad]), and the two hand-written references it is timed against.

    ``eager`` and ``own`` are lambda bodies over the inputs, then the params, in order:
    ``eager`` is the formula as a careful PyTorch user writes it (torch's softmax and
    log_softmax where the formula names them), differentiated by eager autograd (and
    compiled for ``compile``); ``own`` is torch's own function for the whole pattern, or
    None. Inputs named x and y are (rows, columns) tensors, w and b are (columns,), t holds
    integer targets, one per row; ``values`` gives each float param.
    """

    name: str
    expr: str
    eager: str
    own: str | None
    inputs: tuple[str, ...] = ("x",)
    params: tuple[str, ...] = ()
    values: dict = field(default_factory=dict)
    # Issue 44's saved-bytes rule, one full tensor plus per-row statistics (what Liger's
    # and unsloth's Functions save), is set for its single-input cases: not SwiGLU or
    # CosineSimilarity.
    full_tensor_rule: bool = True


# The row-wise set: each [tool.symgrad] row-wise function at (2048, 1024) float32 (``--row-shape``).
ROWWISE = [
    RowwiseCase("Softmax", "exp(x)/sum(exp(x), -1)", "x.exp() / x.exp().sum(-1, keepdim=True)", "torch.softmax(x, -1)"),
    RowwiseCase(
        "LogSoftmax", "x - log(sum(exp(x), -1))", "x - x.exp().sum(-1, keepdim=True).log()", "torch.log_softmax(x, -1)"
    ),
    RowwiseCase("LogSumExp", "log(sum(exp(x), -1))", "x.exp().sum(-1).log()", "torch.logsumexp(x, -1)"),
    RowwiseCase(
        "RMSNorm",
        "x/sqrt(mean(x**2, -1) + eps)*w",
        "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w",
        "F.rms_norm(x, (x.shape[-1],), w, eps)",
        inputs=("x", "w"),
        params=("eps",),
        values={"eps": 1e-6},
    ),
    RowwiseCase(
        "LayerNorm",
        "(x - mean(x, -1))/sqrt(mean((x - mean(x, -1))**2, -1) + eps)*w + b",
        "(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps) * w + b",
        "F.layer_norm(x, (x.shape[-1],), w, b, eps)",
        inputs=("x", "w", "b"),
        params=("eps",),
        values={"eps": 1e-5},
    ),
    RowwiseCase(
        "CrossEntropy",
        "mean(-gather(log_softmax(x, -1), t))",
        "-x.log_softmax(-1).gather(-1, t.unsqueeze(-1)).mean()",
        "F.cross_entropy(x, t)",
        params=("t",),
    ),
    RowwiseCase(
        "LabelSmoothedCrossEntropy",
        "mean(-(1 - s)*gather(log_softmax(x, -1), t) - s*mean(log_softmax(x, -1), -1))",
        "(-(1 - s) * (p := x.log_softmax(-1)).gather(-1, t.unsqueeze(-1)).squeeze(-1) - s * p.mean(-1)).mean()",
        "F.cross_entropy(x, t, label_smoothing=s)",
        params=("t", "s"),
        values={"s": 0.1},
    ),
    RowwiseCase(
        "CosineSimilarity",
        "sum(x*y, -1)/sqrt(sum(x**2, -1)*sum(y**2, -1))",
        "(x * y).sum(-1) / torch.sqrt((x**2).sum(-1) * (y**2).sum(-1))",
        "F.cosine_similarity(x, y, dim=-1, eps=0.0)",
        inputs=("x", "y"),
        full_tensor_rule=False,
    ),
    RowwiseCase(
        "L2Normalize",
        "x/norm(x, -1)",
        "x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)",
        "F.normalize(x, dim=-1, eps=0.0)",
    ),
    RowwiseCase(
        "Entropy",
        "-sum(softmax(x, -1)*log_softmax(x, -1), -1)",
        "-(x.softmax(-1) * x.log_softmax(-1)).sum(-1)",
        "torch.distributions.Categorical(logits=x, validate_args=False).entropy()",
    ),
    RowwiseCase(
        "SwiGLU",
        "chunk(x, 2, 0)*sigmoid(chunk(x, 2, 0))*chunk(x, 2, 1)",
        "(h := x.chunk(2, -1))[0] * torch.sigmoid(h[0]) * h[1]",
        "F.silu((h := x.chunk(2, -1))[0]) * h[1]",
        full_tensor_rule=False,
    ),
]

# The benchmark's sets, each drawn as its own panel row of the chart: the elementwise
# expressions above (timed at each --sizes N) and the row-wise cases (at --row-shape).
SETS = {"elementwise": EXPRESSIONS, "rowwise": ROWWISE}

# The baselines: each expression written by hand in torch, as an experienced user would
# who wants the accuracy symgrad gives (GELU through erfc, whose tail does not cancel as
# 1 + erf does; hypot, which does not overflow as sqrt(1 + x**2) does); inputs in the
# generated modules' order. Until 2026-11-29 the baseline was the default module's own
# forward: the same math, written out of place here; then symgrad's eager forward for Mish
# changed to a sigmoid form, which moved both baselines with it (torch.compile of it got
# 5x faster, eager autograd of it 1.5x slower).
BASELINES = {
    "Double": "2 * x",
    "Square": "x**2",
    "Cube": "x**3",
    "Exp": "torch.exp(x)",
    "SquareSum": "(x**2).sum()",
    "SqrtInverse": "torch.sqrt(x) + 1 / x",
    "Sigmoid": "torch.sigmoid(x)",
    "Tanh": "torch.tanh(x)",
    "Mish": "x * torch.tanh(F.softplus(x))",
    "SiLU": "x * torch.sigmoid(x)",
    "GELU": "0.5 * x * torch.special.erfc(-x / math.sqrt(2))",
    "Softplus": "F.softplus(x)",
    "TwoInput": "x * y + torch.exp(-x) * torch.log1p(y**2)",
    "Large": (
        "torch.sin(x) * torch.exp(-(x**2) / 2) + x**3 / (1 + x**2) + torch.tanh(x) * torch.log1p(x**2)"
        " + torch.hypot(x, torch.ones_like(x)) * torch.cos(2 * x) + x**4 / 24 - x / 3"
    ),
}


def baseline(torch, module):
    """The hand-written torch function for ``module``'s expression (BASELINES)."""
    import torch.nn.functional as F

    meta = module_metadata(module)
    source = f"lambda {', '.join(meta['inputs'])}: {BASELINES[meta['function']]}"
    code = compile(source, f"<baseline {meta['function']}>", "eval")  # (named in tracebacks)
    return eval(code, {"torch": torch, "F": F, "math": math})  # noqa: S307 (our own table)


def torch_own(module):
    """torch's own function for ``module``'s expression (``symgrad report``'s table), or None."""
    from symgrad.report.references import as_function, torch_own_code

    meta = module_metadata(module)
    code = None if meta["params"] else torch_own_code(meta["expr"], meta["inputs"])
    return None if code is None else as_function(code, meta["inputs"], f"torch's own {meta['function']}")


VARIANTS = ("eager", "compile", "symgrad", "speed", "fused", "fused_speed")
COMPILED = ("compile", "fused", "fused_speed")  # their first call compiles
EAGER_KERNELS = ("eager", "symgrad", "speed")  # each torch op is one kernel: counted
# torch's own function: timed where torch has one for the expression (Row.times may lack it).
TORCH_OWN = "torch"
DISPLAY_NAMES = {"symgrad": "default", "fused_speed": "fused+speed", TORCH_OWN: "torch's own"}  # in tables and the chart


@dataclass
class Row:
    name: str
    n: int
    set: str = "elementwise"  # the key of SETS it belongs to
    times: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # median, min, max (ms)
    compile_s: dict[str, float] = field(default_factory=dict)
    saved: dict[str, int] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)  # EAGER_KERNELS only
    floor_ms: float = float("nan")
    floor_saved: int | None = None  # bytes: saved_floor_tensors() input-sized float32 tensors
    error: str = ""
    shape: tuple[int, int] | None = None  # row-wise cases: (rows, columns) of x; n is their product
    not_yet: tuple[str, ...] = ()  # variants whose module generation made identical to the default's
    saved_split: dict[str, SavedSplit] = field(default_factory=dict)  # row-wise cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7], help="element counts (default 1e6 1e7)")
    parser.add_argument(
        "--repeats", type=int, default=15, help="timed runs at N <= 1e6 and in the row-wise set (default 15)"
    )
    parser.add_argument("--repeats-large", type=int, default=5, help="timed runs at N > 1e6 (default 5)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before timing (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: see the docstring)")
    parser.add_argument("--only", nargs="+", help="benchmark only these names (e.g. Mish GELU)")
    parser.add_argument("--png", help="also write a bar chart to this file (needs matplotlib)")
    parser.add_argument("--system-malloc", action="store_true", help="do not set MALLOC_MMAP_MAX_/MALLOC_TRIM_THRESHOLD_")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default cpu)")
    parser.add_argument(
        "--fast", action="store_true",
        help="generate the eager modules with --fast: the default and speed columns then time --fast "
        "and --fast --save speed (the fused ones are unchanged)",
    )
    parser.add_argument(
        "--upstream", choices=("random", "expanded"), default="random",
        help="the elementwise set's upstream gradient: a random tensor (default), or the stride-0 "
        "expanded ones that y.sum().backward() passes",
    )
    parser.add_argument(
        "--sets", nargs="+", choices=list(SETS), default=list(SETS), help="which sets to run (default all)"
    )
    parser.add_argument(
        "--row-shape", nargs=2, type=int, default=ROW_SHAPE, metavar=("ROWS", "COLUMNS"),
        help=f"the row-wise set's shape (default {ROW_SHAPE[0]} {ROW_SHAPE[1]})",
    )
    args = parser.parse_args()

    keep_freed_buffers(args.system_malloc)

    import torch

    threads = args.threads
    torch.set_num_threads(threads)
    device = torch.device(args.device)
    print(machine_line(torch, threads))
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}")
    print("allocator: " + ("glibc defaults" if args.system_malloc else " ".join(f"{k}={os.environ.get(k)}" for k in ALLOCATOR_ENV)))
    print(f"dtype float32, device {device}; times are fwd+bwd in ms: median [min-max]", flush=True)
    if "elementwise" in args.sets:
        print(f"upstream gradient (elementwise set): {args.upstream}")
        if args.fast:
            print("eager modules generated with --fast: the default and speed columns are --fast's")
    print(f"load average at start: {load()} (other processes on the machine make timings noisy)\n", flush=True)

    package_dir = Path(tempfile.mkdtemp(prefix="symgrad_bench_"))
    package = "symgrad_bench_modules"
    (package_dir / package).mkdir()
    (package_dir / package / "__init__.py").write_text("")
    sys.path.insert(0, str(package_dir))

    expressions = [e for e in EXPRESSIONS if "elementwise" in args.sets and (not args.only or e[0] in args.only)]
    cases = [c for c in ROWWISE if "rowwise" in args.sets and (not args.only or c.name in args.only)]
    modules = {}
    for name, expr, inputs, domain in expressions:
        try:
            modules[name] = generate(package_dir, package, name, expr, inputs, domain, fast=args.fast)
        except Exception as exc:  # report, keep going
            print(f"{name}: generation failed: {type(exc).__name__}: {exc}", flush=True)

    floors = {}
    for name, pair in modules.items():
        try:
            floors[name] = saved_floor_tensors(module_metadata(pair["symgrad"]))
        except Exception as exc:  # report, keep the row's timings
            print(f"{name}: no saved-bytes floor: {type(exc).__name__}: {exc}", flush=True)

    rows = []
    for size in args.sizes if expressions else ():
        n = int(size)
        bandwidth = copy_bandwidth(torch, n, device)
        print(f"N={n:.0e}: copy bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
        repeats = args.repeats if n <= 1_000_000 else args.repeats_large
        for name, *_ in expressions:
            if name not in modules:
                continue
            row = bench_one(torch, name, modules[name], n, repeats, args.warmup, bandwidth, device, args.upstream)
            if name in floors:
                row.floor_saved = 4 * n * floors[name]
            rows.append(row)
            print(progress_line(row), flush=True)
    rowwise_rows = bench_rowwise(torch, cases, package_dir, package, tuple(args.row_shape), args, device)
    print(f"\nload average at end: {load()}")
    if rows:
        print()
        print(table(rows))
        print()
        print(summary(rows))
    if rowwise_rows:
        print()
        print(rowwise_table(rowwise_rows))
        print()
        print(rowwise_summary(rowwise_rows))
    if args.png:
        chart(rows + rowwise_rows, args.png)
    return 0


def load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def machine_line(torch, threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # The vector width ATen's kernels were dispatched to: two hosts that both report "AMD EPYC"
    # ran torch.sigmoid on 1e7 float32 values in 4.2 and 11.4 ms, which moves every ratio.
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"machine: {cpu} ({capability}), {os.cpu_count()} cores, torch {torch.__version__} with {threads} threads, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def generate(package_dir: Path, package: str, name: str, expr: str, inputs, domain, fast: bool = False):
    """Write the four symgrad modules for one expression; import them. ``fast``: the two
    eager ones (default and ``save="speed"``) with ``fast=True``."""
    import symgrad

    out = {}
    for variant, class_name, fuse, save in (
        ("symgrad", name, False, "memory"),
        ("speed", f"{name}Speed", False, "speed"),
        ("fused", f"{name}Fused", True, "memory"),
        ("fused_speed", f"{name}FusedSpeed", True, "speed"),
    ):
        extra = {"fast": True} if fast and not fuse else {}
        source = symgrad.generate_source(expr, class_name, inputs=inputs, domain=domain, fuse=fuse, save=save, **extra)
        stem = f"{name.lower()}_{variant}"
        (package_dir / package / f"{stem}.py").write_text(source)
        out[variant] = importlib.import_module(f"{package}.{stem}")
    return out


def make_inputs(torch, module, n: int, device):
    meta = module_metadata(module)
    generator = torch.Generator().manual_seed(0)
    xs = []
    for symbol in meta["inputs"]:
        low, high = meta["domain"][symbol]
        xs.append((low + (high - low) * torch.rand(n, generator=generator)).to(device).requires_grad_())
    return xs


def timer(torch, device):
    """A function that runs ``call()`` and returns its result and seconds, waiting for the
    device's queued kernels before and after: an accelerator returns from a call before its
    kernels run (torch.cuda, torch.xpu and torch.mps each have synchronize)."""
    sync = (lambda: None) if device.type == "cpu" else getattr(torch, device.type).synchronize

    def timed(call):
        sync()
        start = time.perf_counter()
        result = call()
        sync()
        return result, time.perf_counter() - start

    return timed


def variants(torch, pair):
    """The six callables for one expression, each taking the input tensors."""
    eager_forward = baseline(torch, pair["symgrad"])
    # A clean slate per expression: Dynamo in torch 2.11 (on an H200) compiled the baselines
    # of the first 8 expressions and ran every later one eagerly, whatever their file names.
    torch._dynamo.reset()
    fns = {"eager": eager_forward, "compile": torch.compile(eager_forward)}
    for variant in VARIANTS[2:]:
        fns[variant] = getattr(pair[variant], module_metadata(pair[variant])["alias"])
    own = torch_own(pair["symgrad"])
    if own is not None:
        fns[TORCH_OWN] = own
    return fns


def step(torch, fn, xs, upstream):
    out = fn(*xs)
    # (An output marked non-differentiable has no gradient to take: benchmarks/ab.py meets them.)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    grads = [upstream if o.dim() else None for o in outs]
    return torch.autograd.grad(outs, xs, grads)


def bench_one(
    torch, name: str, pair, n: int, repeats: int, warmup: int, bandwidth: float, device, upstream_kind: str = "random"
) -> Row:
    """Time the six variants, and torch's own function where it has one, for one
    elementwise expression at ``n`` elements per input (:func:`measure`). ``upstream_kind``
    "expanded": the upstream gradient is ``y.sum()``'s, one 0-d value expanded to ``n``
    (stride 0), where the order a backward multiplies it in shows."""
    row = Row(name, n)
    try:
        xs = make_inputs(torch, pair["symgrad"], n, device)
        if upstream_kind == "expanded":
            upstream = torch.ones((), device=device).expand(n)
        else:
            upstream = (torch.rand(n, generator=torch.Generator().manual_seed(1)) + 0.5).to(device)
        measure(torch, row, variants(torch, pair), xs, upstream, repeats, warmup, timer(torch, device))
        row.floor_ms = floor_bytes(pair["symgrad"], n) / bandwidth * 1e3
    except Exception as exc:  # report, keep going
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return row


def measure(torch, row: Row, fns: dict, xs, upstream, repeats: int, warmup: int, timed) -> None:
    """Fill ``row``'s compile times, saved bytes, kernel counts and times for ``fns`` (each
    taking the input tensors ``xs``), checking that every variant's gradients match the
    first's. Timed round-robin, so that load from other processes hits all alike, in a new
    order each round."""
    reference = None
    for variant, fn in fns.items():
        graphs = _compiled_graphs(torch)
        # (the first call compiles where it compiles)
        grads, first = timed(lambda: step(torch, fn, xs, upstream))
        if variant in COMPILED:
            row.compile_s[variant] = first
        if variant == "compile" and _compiled_graphs(torch) == graphs:
            # (A silent fallback to eager would make every ratio against compile wrong.)
            raise RuntimeError("torch.compile compiled no graph: it ran the baseline eagerly")
        if reference is None:
            reference = grads
        else:
            for got, want in zip(grads, reference):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        del grads
        row.saved[variant] = saved_bytes(torch, fn, xs)
        if variant in EAGER_KERNELS:
            row.kernels[variant] = kernel_count(torch, fn, xs, upstream)
        for _ in range(warmup):
            step(torch, fn, xs, upstream)
    del reference
    samples = {variant: [] for variant in fns}
    order = list(fns.items())
    shuffle = random.Random(0).shuffle  # fixed seed: the same orders in every run
    for _ in range(repeats):
        # A variant that always runs right after another one inherits its cache state
        # and allocator pattern (5-20% at 1e6): a new order each round averages that out.
        shuffle(order)
        for variant, fn in order:
            _, seconds = timed(lambda: step(torch, fn, xs, upstream))
            samples[variant].append(seconds * 1e3)
    for variant, values in samples.items():
        row.times[variant] = (statistics.median(values), min(values), max(values))


def _compiled_graphs(torch) -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def saved_bytes(torch, fn, xs) -> int:
    """Bytes of the unique storages autograd saves for backward during one forward
    (``symgrad report`` counts them the same way)."""
    from symgrad.report.cost import saved_bytes as count

    return count(torch, fn, xs)


def kernel_count(torch, fn, xs, upstream) -> int:
    """Kernels one forward plus backward runs: the torch ops that compute (not views).

    Without fusion every op is a pass over memory, so for the variants that run torch ops
    one by one this count, more than arithmetic, sets the time at large N. Counted below
    autograd with a dispatch mode (as torch.utils.flop_counter does), backward included.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and func.overloadpacket.__name__ != "detach":
                Counter.count += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        step(torch, fn, xs, upstream)
    return Counter.count


def floor_bytes(module, n: int) -> int:
    """fwd+bwd traffic no implementation avoids (float32), from the minimal plan."""
    meta = module_metadata(module)
    elementwise_outputs = sum(1 for o in meta["outputs"] if o == "elementwise")
    inputs = len(meta["inputs"])
    saved = len(meta["saved"])
    forward = inputs + elementwise_outputs
    backward = elementwise_outputs + saved + inputs
    return 4 * n * (forward + backward)


def saved_floor_tensors(meta: dict) -> int:
    """The fewest input-sized tensors any backward of a module's expression must save.

    Backward returns ``grad_output * gradient(x)`` for any ``grad_output``, so what it
    saves must determine the gradient map ``x -> gradient(x)`` at each element. Where that
    map has rank r (the rank of the elementwise part's Hessian at a generic point), no r-1
    full-precision numbers per element determine it: r input-sized tensors is the floor.
    That is 0 for a linear function, 1 for a one-input function, and 2 for TwoInput, whose
    two gradients are independent. Computed with SymPy from ``meta["expr"]`` (the module's
    ``__symgrad__``) as symgrad's parser reads it (a reduction's elements are each their
    own), not from symgrad's plan.
    """
    import random

    import sympy

    from symgrad.frontend.parse import parse_outputs

    outputs = [output.expr for output in parse_outputs(meta["expr"])]
    by_name = {s.name: s for e in outputs for s in e.free_symbols}
    symbols = [by_name.get(name, sympy.Symbol(name, real=True)) for name in meta["inputs"]]
    params = {by_name[name]: sympy.Rational(str(value)) for name, value in meta["params"].items() if name in by_name}
    # Several outputs: what backward saves must determine every output's gradient map.
    hessian = sympy.Matrix.vstack(*(sympy.hessian(e.xreplace(params), symbols) for e in outputs))
    generic = random.Random(0)  # fixed: the same points in every run
    ranks = []
    for _ in range(2):
        # Exact rationals in (0.3, 1.3), away from special values such as 0 and 1; evalf
        # substitutes them at 30 digits, so that row reduction leaves residues of 1e-30
        # relative to the entries, well below the tolerance.
        point = {s: sympy.Rational(generic.randrange(3000, 13000), 10000) for s in symbols}
        values = hessian.evalf(30, subs=point)
        scale = max([abs(v) for v in values] + [sympy.Integer(1)])
        ranks.append(values.rank(iszerofunc=lambda v: abs(v) < 1e-20 * scale))
    return max(ranks)


def copy_bandwidth(torch, n: int, device) -> float:
    """Bytes per second of ``dst.copy_(src)`` (read + write) at N float32 elements."""
    src, dst = torch.rand(n, device=device), torch.empty(n, device=device)
    timed = timer(torch, device)
    for _ in range(3):
        dst.copy_(src)
    samples = [timed(lambda: dst.copy_(src))[1] for _ in range(20)]
    return 8 * n / statistics.median(samples)


# The row-wise set ---------------------------------------------------------------------

ROW_SHAPE = (2048, 1024)
ROWWISE_VARIANTS = ("eager", "compile", "symgrad", "fused", TORCH_OWN)
ROWWISE_SAVED = ("eager", TORCH_OWN, "compile", "symgrad")  # the saved-bytes columns, in order
# Per-row statistics the saved-bytes rule allows: LayerNorm's mean and rstd, the most any
# of the Functions issue 44 names keeps per row.
ROW_STATISTICS = 2
# Issue 44's time targets: default at most 1.25x the best of torch's own and eager autograd,
# --fuse at most 1.15x torch.compile of the formula, geomean default/eager at most 0.5.
DEFAULT_OVER_BEST, FUSED_OVER_COMPILE, GEOMEAN_DEFAULT_OVER_EAGER = 1.25, 1.15, 0.5


@dataclass(frozen=True)
class SavedSplit:
    """What one implementation saves for backward, split as the saved-bytes rule reads it.

    Attributes:
        full: storages the size of x or larger (x itself, an output, a full intermediate).
        per_row: bytes per row of the smaller tensors it computed (row statistics).
        arguments: bytes of the smaller inputs and params it keeps as given (w, b, targets),
            which every implementation may keep.
    """

    full: int
    per_row: float
    arguments: int

    def meets_rule(self) -> bool:
        """One full tensor plus at most ROW_STATISTICS float32 values per row."""
        return self.full <= 1 and self.per_row <= 4 * ROW_STATISTICS

    def __str__(self) -> str:
        kept = f" + {_size(self.arguments)} of w, b, t" if self.arguments else ""
        return f"{self.full} full + {self.per_row:.3g} B/row{kept}"


def _size(nbytes: float) -> str:
    """``nbytes`` in B, kB or MB, as the saved-bytes cells print it."""
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:g} B"


def saved_split(torch, fn, xs, arguments, shape: tuple[int, int]) -> SavedSplit:
    """The unique storages autograd saves during one forward of ``fn(*xs)`` (counted as
    :func:`saved_bytes` counts them), split by size and by whether they are one of
    ``arguments`` (the call's tensors, params included)."""
    from symgrad.report.cost import saved_storages

    given = {(a.untyped_storage().data_ptr(), a.device) for a in arguments if isinstance(a, torch.Tensor)}
    storages = saved_storages(torch, fn, xs)
    rows, columns = shape
    full_bytes = 4 * rows * columns
    small = {key: nbytes for key, nbytes in storages.items() if nbytes < full_bytes}
    return SavedSplit(
        full=len(storages) - len(small),
        per_row=sum(nbytes for key, nbytes in small.items() if key not in given) / rows,
        arguments=sum(nbytes for key, nbytes in small.items() if key in given),
    )


def generate_rowwise(package_dir: Path, package: str, case: RowwiseCase) -> dict:
    """The default and ``--fuse`` modules for one case, imported. ``fused`` is left out
    where its source is the default's but for the header (which names the options): there
    is no fused module to time yet."""
    import symgrad

    sources = {
        variant: symgrad.generate_source(case.expr, case.name, inputs=case.inputs, params=case.params, fuse=fuse)
        for variant, fuse in (("symgrad", False), ("fused", True))
    }
    out = {}
    for variant, source in sources.items():
        if variant != "symgrad" and _without_header(source) == _without_header(sources["symgrad"]):
            continue
        stem = f"rowwise_{case.name.lower()}_{variant}"
        (package_dir / package / f"{stem}.py").write_text(source)
        out[variant] = importlib.import_module(f"{package}.{stem}")
    return out


def _without_header(source: str) -> str:
    """A generated module's source after its leading comment lines."""
    lines = source.splitlines(keepends=True)
    return "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("#")) :])


def rowwise_arguments(torch, case: RowwiseCase, shape: tuple[int, int], device):
    """The case's inputs (requiring grad) and params at ``shape``: x and y standard
    normal, w near 1 and b near 0 (as trained norms have them), t uniform class indices."""
    rows, columns = shape
    generator = torch.Generator().manual_seed(0)
    make = {
        "x": lambda: torch.randn(rows, columns, generator=generator),
        "y": lambda: torch.randn(rows, columns, generator=generator),
        "w": lambda: 1 + 0.1 * torch.randn(columns, generator=generator),
        "b": lambda: 0.1 * torch.randn(columns, generator=generator),
    }
    xs = [make[name]().to(device).requires_grad_() for name in case.inputs]
    params = [
        torch.randint(0, columns, (rows,), generator=generator).to(device) if name == "t" else case.values[name]
        for name in case.params
    ]
    return xs, params


def rowwise_reference(torch, case: RowwiseCase, body: str, label: str):
    """``body`` (RowwiseCase.eager or .own) as a function of the inputs, then the params."""
    import torch.nn.functional as F

    source = f"lambda {', '.join(case.inputs + case.params)}: {body}"
    code = compile(source, f"<{label} {case.name}>", "eval")  # (named in tracebacks)
    return eval(code, {"torch": torch, "F": F})  # noqa: S307 (our own table)


def rowwise_variants(torch, case: RowwiseCase, modules: dict, params: list) -> dict:
    """The callables for one case, each taking the input tensors (params bound)."""
    eager = rowwise_reference(torch, case, case.eager, "eager formula")
    torch._dynamo.reset()  # (a clean slate per case, as for the elementwise set)
    compiled = torch.compile(eager)
    functions = {"eager": eager, "compile": compiled}
    for variant in ("symgrad", "fused"):
        if variant in modules:
            functions[variant] = getattr(modules[variant], module_metadata(modules[variant])["alias"])
    if case.own is not None:
        functions[TORCH_OWN] = rowwise_reference(torch, case, case.own, "torch's own")
    return {variant: _bound(function, params) for variant, function in functions.items()}


def _bound(function, params: list):
    return lambda *xs: function(*xs, *params)


def bench_rowwise_one(torch, case: RowwiseCase, modules: dict, shape, repeats: int, warmup: int, device) -> Row:
    """Time one row-wise case's variants (:func:`measure`) and split what each saves."""
    row = Row(case.name, shape[0] * shape[1], set="rowwise", shape=shape)
    row.not_yet = tuple(v for v in ("fused",) if v not in modules)
    try:
        xs, params = rowwise_arguments(torch, case, shape, device)
        fns = rowwise_variants(torch, case, modules, params)
        with torch.no_grad():
            out_shape = fns["eager"](*xs).shape
        upstream = (torch.rand(out_shape, generator=torch.Generator().manual_seed(1)) + 0.5).to(device)
        measure(torch, row, fns, xs, upstream, repeats, warmup, timer(torch, device))
        for variant, fn in fns.items():
            row.saved_split[variant] = saved_split(torch, fn, xs, xs + params, shape)
    except Exception as exc:  # report, keep going
        row.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return row


def bench_rowwise(torch, cases: list[RowwiseCase], package_dir: Path, package: str, shape, args, device) -> list[Row]:
    """Generate and time every row-wise case at ``shape``, with ``--repeats`` timed runs."""
    if cases:
        print(f"row-wise set at {shape[0]}x{shape[1]}:", flush=True)
    rows = []
    for case in cases:
        try:
            modules = generate_rowwise(package_dir, package, case)
        except Exception as exc:  # report, keep going
            print(f"{case.name}: generation failed: {type(exc).__name__}: {exc}", flush=True)
            continue
        row = bench_rowwise_one(torch, case, modules, shape, args.repeats, args.warmup, device)
        rows.append(row)
        print(progress_line(row), flush=True)
    return rows


def progress_line(row: Row) -> str:
    if row.error:
        return f"  {row.name:<12} ERROR {row.error}"
    parts = [f"{DISPLAY_NAMES.get(v, v)} {row.times[v][0]:.2f}" for v in (*VARIANTS, TORCH_OWN) if v in row.times]
    return f"  {row.name:<12} " + ", ".join(parts) + " ms"


def fmt_time(t: tuple[float, float, float]) -> str:
    return f"{t[0]:.2f} [{t[1]:.2f}-{t[2]:.2f}]"


def table(rows: list[Row]) -> str:
    names = DISPLAY_NAMES
    head = (
        "| expression | N | "
        + " | ".join(f"{names.get(v, v)} ms" for v in (*VARIANTS, TORCH_OWN))
        + f" | floor ms | default/eager | default/{names[TORCH_OWN]} | speed/eager | fused/compile | fused+speed/compile | best fused/floor"
        + " | saved MB " + " / ".join(names.get(v, v) for v in VARIANTS)
        + " | kernels " + " / ".join(names.get(v, v) for v in EAGER_KERNELS)
        + " | compile s (" + ", ".join(names.get(v, v) for v in COMPILED) + ") |"
    )
    columns = head.count("|") - 1
    lines = [head, "|" + "---|" * columns]
    for row in rows:
        if row.error:
            lines.append(f"| {row.name} | {row.n:.0e} | error: {row.error} |" + " |" * (columns - 3))
            continue
        t = {v: row.times[v][0] for v in VARIANTS}
        own = row.times.get(TORCH_OWN)
        cells = [row.name, f"{row.n:.0e}"] + [fmt_time(row.times[v]) for v in VARIANTS] + [fmt_time(own) if own else "-"]
        cells += [
            f"{row.floor_ms:.2f}",
            f"{t['symgrad'] / t['eager']:.2f}",
            f"{t['symgrad'] / own[0]:.2f}" if own else "-",
            f"{t['speed'] / t['eager']:.2f}",
            f"{t['fused'] / t['compile']:.2f}",
            f"{t['fused_speed'] / t['compile']:.2f}",
            f"{min(t['fused'], t['fused_speed']) / row.floor_ms:.1f}",
            " / ".join(f"{row.saved[v] / 1e6:.0f}" for v in VARIANTS),
            " / ".join(str(row.kernels[v]) for v in EAGER_KERNELS),
            ", ".join(f"{row.compile_s[v]:.1f}" for v in COMPILED),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


# Median ratios within this of 1 are reported as ties as well as counted against "none
# slower": run-to-run noise on this 2-core machine is about that size.
TIE = 0.05

# Issue 5's targets: (mode, baseline, geomean time at most, geomean saved bytes at most).
TARGETS = (("symgrad", "eager", 0.6, 0.4), ("fused", "compile", 0.85, None))


def above_floor(rows: list[Row], variant: str) -> str:
    """The rows where ``variant`` saves more than the floor, with its ratio to the floor."""
    over = []
    for r in rows:
        if r.floor_saved is None:
            over.append(f"{r.name} (no floor)")
        elif r.saved[variant] > r.floor_saved:
            ratio = f"{r.saved[variant] / r.floor_saved:.2f}x" if r.floor_saved else f"{r.saved[variant] / 1e6:.1f} MB over 0"
            over.append(f"{r.name} {ratio}")
    return ", ".join(over) or "none"


def summary(rows: list[Row]) -> str:
    ok = [r for r in rows if not r.error]
    names = DISPLAY_NAMES
    lines = []
    for n in sorted({r.n for r in ok}):
        at = [r for r in ok if r.n == n]

        def times(a, b, k=0):
            return [r.times[a][k] / r.times[b][k] for r in at]

        def saved(a, b):
            return [r.saved[a] / r.saved[b] for r in at if r.saved[b]]

        def floor(b):
            return [r.floor_saved / r.saved[b] for r in at if r.saved[b] and r.floor_saved is not None]

        ratio = {
            "default/eager time": times("symgrad", "eager"),
            "default/torch's own time": [r.times["symgrad"][0] / r.times[TORCH_OWN][0] for r in at if TORCH_OWN in r.times],
            "speed/eager time": times("speed", "eager"),
            "best of default, speed / eager": [min(r.times["symgrad"][0], r.times["speed"][0]) / r.times["eager"][0] for r in at],
            "fused/compile time": times("fused", "compile"),
            "fused+speed/compile time": times("fused_speed", "compile"),
            "best fused / compile": [min(r.times["fused"][0], r.times["fused_speed"][0]) / r.times["compile"][0] for r in at],
            "fused/eager time": times("fused", "eager"),
            "default/eager time (min)": times("symgrad", "eager", 1),
            "fused/compile time (min)": times("fused", "compile", 1),
            "default/eager kernels": [r.kernels["symgrad"] / r.kernels["eager"] for r in at],
            "speed/eager kernels": [r.kernels["speed"] / r.kernels["eager"] for r in at],
            "default/eager saved bytes": saved("symgrad", "eager"),
            "floor/eager saved bytes": floor("eager"),
            "speed/eager saved bytes": saved("speed", "eager"),
            "fused/compile saved bytes": saved("fused", "compile"),
            "default/floor time": [r.times["symgrad"][0] / r.floor_ms for r in at],
            "speed/floor time": [r.times["speed"][0] / r.floor_ms for r in at],
            "fused/floor time": [r.times["fused"][0] / r.floor_ms for r in at],
            "fused+speed/floor time": [r.times["fused_speed"][0] / r.floor_ms for r in at],
            "compile/floor time": [r.times["compile"][0] / r.floor_ms for r in at],
        }
        lines.append(f"N={n:.0e} geometric means over {len(at)} expressions:")
        for label, values in ratio.items():
            lines.append(f"  {label:<32} {geomean(values):.2f}  (max {max(values):.2f})" if values else f"  {label}: n/a")
        for mode, baseline, max_time, max_bytes in TARGETS:
            # No plan saves less than the floor: say so where a target asks for less.
            floor_ratio = geomean(floor(baseline))
            below_floor = f" (the target is below the floor, {floor_ratio:.2f}x, on this set)" if max_bytes is not None and floor_ratio > max_bytes else ""
            for variant in (mode, f"{mode}_speed" if mode == "fused" else "speed"):
                label = names.get(variant, variant)
                ratios = {r.name: r.times[variant][0] / r.times[baseline][0] for r in at}
                slower = [f"{name} {ratio:.2f}" for name, ratio in ratios.items() if ratio > 1]
                clearly = [f"{name} {ratio:.2f}" for name, ratio in ratios.items() if ratio > 1 + TIE]
                heavier = [r.name for r in at if r.saved[variant] > r.saved[baseline]]
                lines.append(f"  {label} slower than {baseline}: {', '.join(slower) or 'none'}")
                lines.append(f"  {label} slower than {baseline} by over {TIE:.0%}: {', '.join(clearly) or 'none'}")
                checks = [
                    (f"geomean time <= {max_time}x {baseline}", geomean(times(variant, baseline)) <= max_time),
                    (f"none slower than {baseline}", not slower),
                ]
                if max_bytes is not None:
                    lines.append(f"  {label} saving more bytes than {baseline}: {', '.join(heavier) or 'none'}")
                    lines.append(f"  {label} saving more bytes than the floor: {above_floor(at, variant)}")
                    checks += [
                        (f"geomean saved bytes <= {max_bytes}x {baseline}", geomean(saved(variant, baseline)) <= max_bytes),
                        (f"none saves more than {baseline}", not heavier),
                    ]
                for check, met in checks:
                    why = below_floor if "saved bytes" in check and not met else ""
                    lines.append(f"  target {label}: {check}: {'met' if met else 'MISSED'}{why}")
    return "\n".join(lines)


def rowwise_table(rows: list[Row]) -> str:
    """The row-wise set's times, saved bytes (in MB and split as the rule reads them),
    kernel counts and compile times, one line per case."""
    names = DISPLAY_NAMES
    head = (
        "| case | shape | "
        + " | ".join(f"{names.get(v, v)} ms" for v in ROWWISE_VARIANTS)
        + " | saved MB " + " / ".join(names.get(v, v) for v in ROWWISE_SAVED)
        + " | saved: eager | saved: torch's own | saved: default"
        + " | kernels eager / default | compile s (compile, fused) |"
    )
    columns = head.count("|") - 1
    lines = [head, "|" + "---|" * columns]
    for row in rows:
        shape = f"{row.shape[0]}x{row.shape[1]}"
        if row.error:
            lines.append(f"| {row.name} | {shape} | error: {row.error} |" + " |" * (columns - 3))
            continue

        def cell(variant, show):
            if variant in row.not_yet:
                return "not yet"
            return show(variant) if variant in row.times else "-"

        cells = [row.name, shape]
        cells += [cell(v, lambda v: fmt_time(row.times[v])) for v in ROWWISE_VARIANTS]
        cells.append(" / ".join(f"{row.saved[v] / 1e6:.1f}" if v in row.saved else "-" for v in ROWWISE_SAVED))
        cells += [str(row.saved_split[v]) if v in row.saved_split else "-" for v in ("eager", TORCH_OWN, "symgrad")]
        cells.append(f"{row.kernels['eager']} / {row.kernels['symgrad']}")
        cells.append(", ".join(cell(v, lambda v: f"{row.compile_s[v]:.1f}") for v in ("compile", "fused")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def rowwise_targets(row: Row, full_tensor_rule: bool) -> dict[str, str]:
    """Issue 44's per-case targets for one row-wise case, each as 'ratio verdict'."""
    t = {v: row.times[v][0] for v in row.times}
    best = min(t[v] for v in ("eager", TORCH_OWN) if v in t)
    ratio = t["symgrad"] / best
    targets = {
        f"default / best of torch's own, eager (<= {DEFAULT_OVER_BEST})": f"{ratio:.2f} {_verdict(ratio <= DEFAULT_OVER_BEST)}"
    }
    others = [v for v in ("eager", TORCH_OWN) if v in row.saved]
    heavier = [
        f"{_size(row.saved['symgrad'] - row.saved[v])} over {DISPLAY_NAMES.get(v, v)}"
        for v in others
        if row.saved["symgrad"] > row.saved[v]
    ]
    over = f" ({', '.join(heavier)})" if heavier else ""
    targets["default saves no more than eager, torch's own"] = _verdict(not heavier) + over
    split = row.saved_split["symgrad"]
    rule = f"{_verdict(split.meets_rule())} ({split})" if full_tensor_rule else "-"
    targets["one full tensor plus row statistics"] = rule
    if "fused" in row.not_yet:
        targets[f"fused / compile (<= {FUSED_OVER_COMPILE})"] = "not yet (--fuse generates the default module)"
    else:
        ratio = t["fused"] / t["compile"]
        targets[f"fused / compile (<= {FUSED_OVER_COMPILE})"] = f"{ratio:.2f} {_verdict(ratio <= FUSED_OVER_COMPILE)}"
    return targets


def rowwise_summary(rows: list[Row]) -> str:
    """Issue 44's targets per case, measured as ratios in this run, and the geometric mean."""
    ok = [r for r in rows if not r.error]
    if not ok:
        return "row-wise set: no case without errors"
    rules = {case.name: case.full_tensor_rule for case in ROWWISE}
    per_case = {r.name: rowwise_targets(r, rules.get(r.name, False)) for r in ok}
    head = list(next(iter(per_case.values())))
    lines = ["| case | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 1)]
    lines += [f"| {name} | " + " | ".join(targets[h] for h in head) + " |" for name, targets in per_case.items()]
    ratio = geomean([r.times["symgrad"][0] / r.times["eager"][0] for r in ok])
    lines.append("")
    lines.append(
        f"geometric mean of default / eager time over {len(ok)} cases: {ratio:.2f} "
        f"(target <= {GEOMEAN_DEFAULT_OVER_EAGER}): {_verdict(ratio <= GEOMEAN_DEFAULT_OVER_EAGER)}"
    )
    for h in head:
        missed = [name for name, targets in per_case.items() if "MISSED" in targets[h]]
        measured = [name for name, targets in per_case.items() if targets[h] != "-" and "not yet" not in targets[h]]
        lines.append(
            f"{h}: measured on {len(measured)} of {len(per_case)} cases, missed by {', '.join(missed) or 'none'}"
        )
    return "\n".join(lines)


# The chart's bars: (label, numerator, denominator) of a time ratio. A bar is left out of a
# group whose row lacks either (torch's own function, where torch has none; in the row-wise
# set, speed, and fused where it is not yet its own module).
CHART_RATIOS = (
    ("default / eager", "symgrad", "eager"),
    ("speed / eager", "speed", "eager"),
    ("default / torch's own", "symgrad", TORCH_OWN),
    ("fused / compile", "fused", "compile"),
    ("fused+speed / compile", "fused_speed", "compile"),
)
# The saved-bytes bars: the implementations whose bytes per element are drawn.
CHART_SAVED = ("eager", TORCH_OWN, "compile", "symgrad", "speed", "fused")


def chart(rows: list[Row], path: str) -> None:
    """One figure row per (set, N): on the left the fwd+bwd time ratios against eager,
    torch's own function and torch.compile, one bar group per case (below 1: symgrad is
    faster); on the right the bytes saved for backward per element, with the floor."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no chart written to {path}")
        return
    ok = [r for r in rows if not r.error]
    panels = sorted({(r.set, r.n) for r in ok}, key=lambda key: (list(SETS).index(key[0]), key[1]))
    if not panels:
        print(f"no rows without errors: no chart written to {path}")
        return
    figure, axes = plt.subplots(
        len(panels), 2, figsize=(17, 4.2 * len(panels)), squeeze=False, gridspec_kw={"width_ratios": (3, 2)}
    )
    for (set_name, n), (times_axis, saved_axis) in zip(panels, axes):
        at = [r for r in ok if (r.set, r.n) == (set_name, n)]
        _bar_groups(times_axis, at, [
            (label, [r.times[a][0] / r.times[b][0] if a in r.times and b in r.times else None for r in at])
            for label, a, b in CHART_RATIOS
        ])
        times_axis.axhline(1, color="k", linewidth=0.8)
        times_axis.set_ylabel("fwd+bwd time ratio (below 1: faster)")
        size = f"{at[0].shape[0]}x{at[0].shape[1]}" if at[0].shape else f"N={n:.0e}"
        not_yet = sorted({DISPLAY_NAMES.get(v, v) for r in at for v in r.not_yet})
        pending = f" ({', '.join(not_yet)}: not yet)" if not_yet else ""
        times_axis.set_title(f"{set_name}, {size} float32: time against eager, torch's own, compile{pending}")
        _bar_groups(saved_axis, at, [
            (DISPLAY_NAMES.get(v, v), [r.saved[v] / r.n if v in r.saved else None for r in at]) for v in CHART_SAVED
        ])
        floors = [(i, r.floor_saved / r.n) for i, r in enumerate(at) if r.floor_saved is not None]
        if floors:
            saved_axis.scatter(*zip(*floors), marker="_", color="k", s=300, zorder=3, label="floor")
        saved_axis.set_ylabel("bytes saved for backward per element")
        saved_axis.set_title(f"{set_name}: saved bytes")
        for axis in (times_axis, saved_axis):
            axis.set_xticks(range(len(at)), [r.name for r in at], rotation=30, ha="right")
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    print(f"chart written to {path}")


def _bar_groups(axis, rows: list[Row], series: list[tuple[str, list]]) -> None:
    """One group of bars per row, one bar per series that has a value for it."""
    width = 0.8 / len(series)
    for k, (label, values) in enumerate(series):
        offset = (k - (len(series) - 1) / 2) * width
        points = [(i + offset, v) for i, v in enumerate(values) if v is not None]
        if points:
            axis.bar(*zip(*points), width, label=label)


if __name__ == "__main__":
    sys.exit(main())
