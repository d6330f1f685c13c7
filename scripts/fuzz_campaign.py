#!/usr/bin/env python
"""The long fuzz campaign (outside CI): thousands of random expressions, each checked in a
worker process with a timeout, then counts.

    python scripts/fuzz_campaign.py --count 4000 --workers 2 --timeout 120

Each expression is drawn by the same hypothesis grammar as tests/test_fuzz.py (half from
the smooth grammar, half from the whole grammar) and must either be refused with a
SymgradError or generate a module that imports and passes gradcheck and gradgradcheck
(see test_fuzz.py for how kinks are handled). Printed at the end (and every --report
seconds):

* passed;
* refused, grouped by reason (the message's first words, numbers blanked);
* kink artefacts (no sample point away from the kinks: not informative);
* failures: crashes (any exception other than SymgradError), hangs (over --timeout),
  and gradcheck failures, each with the expression and the error's last lines.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import queue
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def draw_expressions(count: int, seed: int | None) -> list[tuple[str, bool, int]]:
    """``count`` (text, smooth, sample seed) triples from the test grammar."""
    import random

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from test_fuzz import expressions

    drawn: list[tuple[str, bool, int]] = []
    for smooth, n in ((True, count // 2), (False, count - count // 2)):

        @settings(
            max_examples=n,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=expressions(smooth=smooth), sample_seed=st.integers(0, 2**31 - 1))
        def collect(case, sample_seed):
            drawn.append((case[0], smooth, sample_seed))

        if seed is not None:
            collect = __import__("hypothesis").seed(seed + int(smooth))(collect)
        collect()
    random.Random(seed).shuffle(drawn)
    return drawn


# Messages that quote the user's expression: the quoted part is blanked before grouping.
_QUOTING = (
    (r"^the constant .*? is (complex|infinite|too large|too small)", r"the constant … is \1"),
    (r"^.* is infinite or undefined for some inputs.*", "… is infinite or undefined for some inputs"),
    (r"^.* is complex for most values.*", "… is complex for most values (negative constant to a variable power)"),
    (r"^the derivative of .* is complex or undefined.*", "the derivative of … is complex or undefined"),
    (r"^SymPy cannot differentiate .*", "SymPy cannot differentiate …"),
    (r"^cannot build .*", "cannot build …"),
    (r"^cannot compare in .*", "cannot compare in …"),
    (r"^the exponent in .* is too large.*", "the exponent in … is too large"),
    (r"^output \d+ does not depend.*", "output N does not depend on any input"),
    (r"^the expression does not depend.*", "the expression does not depend on any input"),
)


def reason_of(message: str, words: int = 8) -> str:
    """Group refusals by the first words of the message, quoted expressions and numbers blanked."""
    for pattern, replacement in _QUOTING:
        if re.search(pattern, message):
            message = re.sub(pattern, replacement, message)
            break
    message = re.sub(r"\(at column \d+\)", "", message)
    message = re.sub(r"'[^']*'", "'…'", message)
    message = re.sub(r"\d+(\.\d+)?", "N", message)
    return " ".join(message.split()[:words])


def _worker(tasks, results, fuse: bool = False) -> None:
    import tempfile

    import torch

    torch.set_num_threads(1)
    from torch.autograd.gradcheck import GradcheckError

    from test_fuzz import KinkArtefact, Refused, check_expression, known_bug, uncompiled

    if fuse:
        torch.compile = uncompiled

    with tempfile.TemporaryDirectory(prefix="symgrad-campaign-") as directory:
        while True:
            task = tasks.get()
            if task is None:
                return
            index, text, smooth, seed = task
            started = time.monotonic()
            try:
                outcome = ("passed", check_expression(text, Path(directory), seed, smooth, fuse=fuse))
            except Refused as exc:
                outcome = ("refused", str(exc))
            except KinkArtefact:
                outcome = ("kink", "")
            except BaseException as exc:  # noqa: BLE001 - a crash is exactly what we look for
                known = known_bug(exc) if isinstance(exc, Exception) else None
                if known:
                    kind = f"known bug {known}"
                elif isinstance(exc, GradcheckError):
                    kind = "gradcheck"
                else:
                    kind = "assertion" if isinstance(exc, AssertionError) else "crash"
                outcome = (kind, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-2500:])
            results.put((index, outcome[0], outcome[1], time.monotonic() - started))


class Pool:
    """Worker processes fed one expression at a time; a worker past the timeout is killed."""

    def __init__(self, workers: int, timeout: float, fuse: bool = False) -> None:
        self.context = mp.get_context("spawn")
        self.timeout = timeout
        self.fuse = fuse
        self.results = self.context.Queue()
        self.slots = [self._start() for _ in range(workers)]

    def _start(self):
        tasks = self.context.Queue()
        process = self.context.Process(target=_worker, args=(tasks, self.results, self.fuse), daemon=True)
        process.start()
        return {"process": process, "tasks": tasks, "task": None, "since": 0.0}

    def run(self, items, on_result, on_tick) -> None:
        pending = list(enumerate(items))[::-1]
        busy = 0
        while pending or busy:
            for k, slot in enumerate(self.slots):
                if slot["task"] is None and pending:
                    index, (text, smooth, seed) = pending.pop()
                    slot.update(task=index, since=time.monotonic())
                    slot["tasks"].put((index, text, smooth, seed))
                    busy += 1
            try:
                index, kind, detail, seconds = self.results.get(timeout=1.0)
                for slot in self.slots:
                    if slot["task"] == index:
                        slot["task"] = None
                busy -= 1
                on_result(index, kind, detail, seconds)
            except queue.Empty:
                pass
            now = time.monotonic()
            for k, slot in enumerate(self.slots):
                if slot["task"] is not None and now - slot["since"] > self.timeout:
                    index = slot["task"]
                    slot["process"].kill()
                    slot["process"].join()
                    self.slots[k] = self._start()
                    busy -= 1
                    on_result(index, "hang", f"no result after {self.timeout:.0f} s", now - slot["since"])
            on_tick()

    def close(self) -> None:
        for slot in self.slots:
            slot["tasks"].put(None)
        for slot in self.slots:
            slot["process"].join(timeout=10)
            if slot["process"].is_alive():
                slot["process"].kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=4000, help="expressions to check (default 4000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per expression before it is a hang")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed, for a reproducible campaign")
    parser.add_argument("--minutes", type=float, default=None, help="stop taking new expressions after this long")
    parser.add_argument("--report", type=float, default=60.0, help="print interim counts every N seconds")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--fuse", action="store_true", help="generate with --fuse (the bodies run uncompiled: see test_fuzz.uncompiled)"
    )
    options = parser.parse_args()

    items = draw_expressions(options.count, options.seed)
    print(f"drew {len(items)} expressions; checking with {options.workers} workers", flush=True)
    started = time.monotonic()
    counts: collections.Counter[str] = collections.Counter()
    refused: collections.Counter[str] = collections.Counter()
    failures: list[dict] = []
    slowest: list[tuple[float, str]] = []
    last_report = [started]

    def summary() -> str:
        done = sum(counts.values())
        lines = [f"after {time.monotonic() - started:.0f} s: {done} checked: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
        lines += [f"  refused {n:5d}  {reason}" for reason, n in refused.most_common()]
        return "\n".join(lines)

    def on_result(index, kind, detail, seconds):
        text, smooth, seed = items[index]
        counts[kind] += 1
        slowest.append((seconds, text))
        if kind == "refused":
            refused[reason_of(detail)] += 1
        elif kind not in ("passed", "kink"):
            failures.append({"kind": kind, "expr": text, "smooth": smooth, "seed": seed, "detail": detail})
            print(f"FAILURE ({kind}) {text!r} seed={seed}\n{detail}\n", flush=True)

    def on_tick():
        now = time.monotonic()
        if now - last_report[0] > options.report:
            last_report[0] = now
            print(summary(), flush=True)
        if options.minutes is not None and now - started > options.minutes * 60:
            raise TimeoutError

    pool = Pool(options.workers, options.timeout, fuse=options.fuse)
    try:
        pool.run(items, on_result, on_tick)
    except (TimeoutError, KeyboardInterrupt):
        print("stopped early", flush=True)
    finally:
        pool.close()
    print("=" * 72)
    print(summary())
    print(f"failures: {len(failures)}")
    for failure in failures:
        print(f"  [{failure['kind']}] {failure['expr']!r} (seed {failure['seed']})")
    slowest.sort(reverse=True)
    print("slowest: " + "; ".join(f"{s:.1f} s {t!r}" for s, t in slowest[:5]))
    if options.json:
        options.json.write_text(json.dumps({"counts": counts, "refused": refused, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
