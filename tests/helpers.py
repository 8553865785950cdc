"""Small helpers every tier shares: wait on a state (never on the clock) and a free port."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# What every JAX process the tests start gets: this session's environment (conftest.py), and
# the fleet's hosts through ``--env`` (the ``remote_jax`` fixture's XLA_FLAGS). XLA's backend
# (LLVM) optimisations are most of a small program's compile time on CPU: without them a
# payload test costs about a quarter to a third less CPU (benchmarks/RESULTS.md, "Test suite
# CPU"), and its results agree with an optimised build's far within the tests' tolerances. The
# tests check results, shardings and processes, never the speed of the code XLA generates.
JAX_TEST_ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_backend_optimization_level=0"}


def wait_for(
    predicate: Callable[[], T], timeout: float = 30, what: str = "condition", interval: float = 0.1
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail the test
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port nothing listens on right now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
