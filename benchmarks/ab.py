"""A/B timing of two folders of generated modules: one symgrad version against another.

    python benchmarks/ab.py OLD_DIR NEW_DIR [--n 1e7] [--rounds 9] [--calls 1] [--double] [--system-malloc]

Each module present in both folders (same file name) is timed for one forward plus
backward, the two versions alternating in the same process, each round in the other
order; the median ratio new/old is printed. A module whose code is the same in both
folders is a noise control. ``--double`` times double backward instead: forward, backward
with create_graph=True, and the backward of that gradient. At small N, where one call
takes microseconds, ``--calls`` times that many calls per round (``--n 8 --calls 1000``
measures the per-call cost).
Like bench.py, it runs on one thread and, unless ``--system-malloc`` is given, with glibc
told to keep freed buffers (see bench.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

# bench.py sits next to this script: its allocator setting, inputs and timed step.
from bench import keep_freed_buffers, make_inputs, module_metadata, step


def _load(path: Path, prefix: str):
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(torch, function, inputs, upstream, calls: int = 1, timed_step=step) -> float:
    """Seconds per call, over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        timed_step(torch, function, inputs, upstream)
    return (time.perf_counter() - start) / calls


def double_step(torch, fn, xs, upstream):
    """Forward, backward with create_graph=True, then the backward of that gradient (of
    sum(upstream * gradient)): what a gradient penalty or a Hessian-vector product runs."""
    out = fn(*xs)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    grads = torch.autograd.grad(outs, xs, [upstream if o.dim() else None for o in outs], create_graph=True)
    live = [g for g in grads if g is not None and g.requires_grad]
    weights = [upstream if g.shape == upstream.shape else torch.ones_like(g) for g in live]
    return torch.autograd.grad(live, xs, weights, allow_unused=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--n", type=float, default=1e7, help="elements per input (default 1e7)")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (default 9)")
    parser.add_argument("--calls", type=int, default=1, help="calls per timed round (default 1; 1000s at small N)")
    parser.add_argument("--double", action="store_true", help="time double backward (create_graph=True, then its backward)")
    parser.add_argument("--system-malloc", action="store_true", help="do not set MALLOC_MMAP_MAX_/MALLOC_TRIM_THRESHOLD_")
    args = parser.parse_args()
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds must be at least 1")
    keep_freed_buffers(args.system_malloc)
    import torch

    torch.set_num_threads(1)
    n = int(args.n)
    timed_step = double_step if args.double else step
    what = "double backward" if args.double else "forward plus backward"
    print(f"{what}, N={n:.0e}, {args.rounds} rounds of {args.calls} calls, allocator: {'glibc defaults' if args.system_malloc else 'buffers kept'}")
    for path in sorted(args.old.glob("*.py")):
        other = args.new / path.name
        if path.name == "__init__.py" or not other.exists():
            continue
        old, new = _load(path, "old"), _load(other, "new")
        if module_metadata(old)["inplace"]:
            print(f"{path.stem:16s} skipped: --inplace writes its input, which a leaf tensor refuses")
            continue
        params = list(module_metadata(old)["params"].values())
        functions = {
            label: (lambda *xs, f=getattr(m, module_metadata(m)["alias"]): f(*xs, *params))
            for label, m in (("old", old), ("new", new))
        }
        inputs = make_inputs(torch, old, n, "cpu")
        upstream = torch.rand(n, generator=torch.Generator().manual_seed(1)) + 0.5
        times: dict[str, list[float]] = {"old": [], "new": []}
        for label in ("old", "new", "old", "new"):  # warm-up
            _time(torch, functions[label], inputs, upstream, timed_step=timed_step)
        for round_ in range(args.rounds):
            for label in ("old", "new") if round_ % 2 else ("new", "old"):
                times[label].append(_time(torch, functions[label], inputs, upstream, args.calls, timed_step))
        old_ms, new_ms = (statistics.median(times[k]) * 1e3 for k in ("old", "new"))
        unit, scale = ("us", 1e3) if old_ms < 1 else ("ms", 1)
        same = path.read_text().splitlines()[6:] == other.read_text().splitlines()[6:]
        print(f"{path.stem:16s} old {old_ms * scale:9.2f} {unit}  new {new_ms * scale:9.2f} {unit}  new/old {new_ms / old_ms:.3f}" + ("  (same code)" if same else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
