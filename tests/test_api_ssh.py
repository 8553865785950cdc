"""``multihost.call`` against real OpenSSH hosts on loopback: the function travels by value,
its values come back over SSH, and a remote exception names its host."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

import multihost

pytestmark = [pytest.mark.ssh, pytest.mark.usefixtures("fresh_runs")]
SITE = Path("/opt/multihost-test-cloudpickle")  # world-readable, for the fleet's users


@pytest.fixture
def by_value() -> Iterator[None]:
    """This test module is not importable on the hosts: send its functions by value."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def hosts_python() -> dict[str, object]:
    """Keywords for the fleet's system python3, which gets cloudpickle from a world-readable
    copy of this interpreter's."""
    source = Path(cloudpickle.__file__).parent
    if not (SITE / "cloudpickle").is_dir():
        shutil.copytree(source, SITE / "cloudpickle")
    for path in (SITE, *SITE.rglob("*")):
        path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    return {"python": "/usr/bin/python3", "env": {"PYTHONPATH": str(SITE)}}


@pytest.fixture
def hosts_env(ssh_fleet, tmp_path: Path) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Keywords for the first two fleet hosts (their python3: :func:`hosts_python`)."""
    return {
        "hosts": ",".join(ssh_fleet.aliases[:2]),
        "ssh_config": ssh_fleet.ssh_config,
        **hosts_python(),
        "log_dir": tmp_path / "logs",
        "grace": 2,
    }


def _who(offset: int) -> tuple[int, str]:
    print("running as", os.environ["MULTIHOST_TEST_HOST"])
    return int(os.environ["JAX_PROCESS_ID"]) + offset, os.environ["MULTIHOST_TEST_HOST"]


def _fail_on_h1() -> None:
    if os.environ["MULTIHOST_TEST_HOST"] == "h1":
        raise RuntimeError("disk full on h1")


def test_module_not_on_the_hosts_is_said(hosts_env: dict[str, object]) -> None:
    with pytest.raises(multihost.RemoteCallError, match="pickled by reference") as info:
        multihost.call(_who, 1, **hosts_env)
    assert "No module named 'tests'" in str(info.value)


@pytest.mark.usefixtures("by_value")
def test_call_over_ssh(hosts_env: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    assert multihost.call(_who, 100, **hosts_env) == [(100, "h0"), (101, "h1")]
    assert "[s0/w1] running as h1" in capsys.readouterr().out
    with pytest.raises(multihost.RemoteCallError, match="disk full on h1") as info:
        multihost.call(_fail_on_h1, **hosts_env)
    assert info.value.host.name == "s0/w1"
    assert "remote traceback (s0/w1)" in str(info.value)


def test_run_refuses_a_busy_coordinator_port(
    hosts_env: dict[str, object], code: Path, tmp_path: Path
) -> None:
    """The API checks host 0's coordinator port as the CLI does: UsageError, nothing made."""
    with socket.socket() as s:  # the loopback hosts share this machine's ports
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        keywords = {k: v for k, v in hosts_env.items() if k not in ("python", "env")}
        with pytest.raises(multihost.UsageError, match=f"coordinator port {port} is busy"):
            multihost.run("true", coordinator_port=port, script_dir=code, **keywords)
    assert not Path(str(hosts_env["log_dir"])).exists()
