"""Shared test helpers for inputs that must never hang symgrad."""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def hang_guard(seconds: int):
    """Turn a hang into a test failure (SIGALRM; a no-op where unavailable)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):
        raise AssertionError(f"symgrad hung: no answer after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
