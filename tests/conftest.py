"""Shared fixtures: the real OpenSSH loopback fleet (the machinery lives in tests/fleet.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import fleet as loopback


def _unavailable() -> str | None:
    """Why this machine cannot run the fleet, or None."""
    if not os.access(loopback.SSHD, os.X_OK):
        return f"{loopback.SSHD} missing (apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "the OpenSSH fleet needs root (one Unix user and one sshd per host)"
    return None


@pytest.fixture(scope="session")
def ssh_fleet() -> Iterator[loopback.Fleet]:
    """A running loopback fleet of $MULTIHOST_TEST_HOSTS hosts (default 8)."""
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SSH tier, but: {reason}")
        pytest.skip(reason)
    found_running = bool(loopback.running())
    fleet = loopback.up(int(os.environ.get("MULTIHOST_TEST_HOSTS", "8")))
    yield fleet
    if not found_running:
        loopback.down()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the fleet (directly or through another fixture) ``ssh``."""
    for item in items:
        if "ssh_fleet" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ssh)
