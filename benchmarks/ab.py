"""A/B timing of two folders of generated modules: one symgrad version against another.

    python benchmarks/ab.py OLD_DIR NEW_DIR [--n 1e7] [--rounds 9] [--system-malloc]

Each module present in both folders (same file name) is timed for one forward plus
backward, the two versions alternating in the same process, each round in the other
order; the median ratio new/old is printed. A module whose code is the same in both
folders is a noise control. Like bench.py, it runs on one thread and, unless
``--system-malloc`` is given, with glibc told to keep freed buffers (see bench.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}


def _load(path: Path, prefix: str):
    spec = importlib.util.spec_from_file_location(f"{prefix}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inputs(module, n: int):
    import torch

    meta = module.__symgrad__
    inputs = []
    for name in meta["inputs"]:
        low, high = meta["domain"][name]
        inputs.append((torch.rand(n) * (high - low) + low).requires_grad_())
    params = [value for value in meta["params"].values()]
    return inputs, params


def _time(function, inputs, params, upstream) -> float:
    start = time.perf_counter()
    out = function(*inputs, *params)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(upstream)
    for tensor in inputs:
        tensor.grad = None
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--n", type=float, default=1e7, help="elements per input (default 1e7)")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (default 9)")
    parser.add_argument("--system-malloc", action="store_true", help="do not set MALLOC_MMAP_MAX_/MALLOC_TRIM_THRESHOLD_")
    args = parser.parse_args()
    if not args.system_malloc and any(k not in os.environ for k in ALLOCATOR_ENV):
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, **ALLOCATOR_ENV))
    import torch

    torch.set_num_threads(1)
    n = int(args.n)
    print(f"N={n:.0e}, {args.rounds} rounds, allocator: {'glibc defaults' if args.system_malloc else 'buffers kept'}")
    for path in sorted(args.old.glob("*.py")):
        other = args.new / path.name
        if path.name == "__init__.py" or not other.exists():
            continue
        old, new = _load(path, "old"), _load(other, "new")
        functions = {"old": getattr(old, old.__symgrad__["alias"]), "new": getattr(new, new.__symgrad__["alias"])}
        inputs, params = _inputs(old, n)
        out = functions["old"](*inputs, *params)
        upstream = torch.rand_like(out[0] if isinstance(out, tuple) else out)
        times: dict[str, list[float]] = {"old": [], "new": []}
        for label in ("old", "new", "old", "new"):  # warm-up
            _time(functions[label], inputs, params, upstream)
        for round_ in range(args.rounds):
            for label in ("old", "new") if round_ % 2 else ("new", "old"):
                times[label].append(_time(functions[label], inputs, params, upstream))
        old_ms, new_ms = (statistics.median(times[k]) * 1e3 for k in ("old", "new"))
        same = path.read_text().splitlines()[6:] == other.read_text().splitlines()[6:]
        print(f"{path.stem:16s} old {old_ms:9.2f} ms  new {new_ms:9.2f} ms  new/old {new_ms / old_ms:.3f}" + ("  (same code)" if same else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
