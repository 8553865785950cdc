"""A pod's life from Python, against the stand-in cloud (the real gcloud CLI): ``up``, ``pods``,
``autodown``, ``down`` as values; ``with multihost.pod(...)`` deleting its pod however the
block ends (its end, an exception, Ctrl-C, SIGTERM to a real child process), its cost said;
``run(..., up=True, down=True)``; a warm ``multihost.session(..., up=True, down=True)`` whose
pod goes however the session ends (its block's end, an exception, this Python's end); a profile
that says what a pod is made of, for ``multihost up NAME`` and ``multihost.up``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

import multihost
from multihost.errors import UsageError
from tests.clitools import cli, no_processes
from tests.cloud.fixture import ZONE, Cloud
from tests.helpers import free_port, wait_for
from tests.test_api_ssh import hosts_python
from tests.test_pods_ssh import env, ssh_config

pytestmark = pytest.mark.usefixtures("fresh_runs")

POD = {"tpu_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base", "zone": ZONE}


@pytest.fixture
def standin(cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    """This process's gcloud pointed at the stand-in, its records in the test's own dir."""
    for key, value in env(cloud, tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return cloud


def _reach(cloud: Cloud, tmp_path: Path) -> dict[str, object]:
    return {"ssh_config": ssh_config(cloud.fleet, tmp_path), "no_add_key": True}


def test_up_pods_autodown_down_are_values(standin: Cloud, tmp_path: Path) -> None:
    said: list[str] = []
    reach = _reach(standin, tmp_path)
    pod = multihost.up("vals", **POD, **reach, say=said.append)
    assert isinstance(pod, multihost.Pod)
    assert (pod.name, pod.zone, pod.tpu_type, pod.num_slices, pod.state) == (
        "vals",
        ZONE,
        "v4-8",
        1,
        "ACTIVE",
    )
    assert (pod.capacity, pod.price_per_hour, pod.autodown) == ("on-demand", 12.88, None)
    assert "pod vals is up: 1/1 workers accept SSH" in said
    with pytest.raises(AttributeError):
        pod.state = "GONE"  # type: ignore[misc]  # frozen
    (listed,) = multihost.pods(say=said.append, ssh_config=reach["ssh_config"])
    assert (listed.name, listed.state, listed.recorded) == ("vals", "ACTIVE", True)
    assert listed.cost_so_far is not None
    armed = multihost.autodown("vals", "30m", say=said.append, **reach)
    assert armed.autodown == 1800
    (listed,) = multihost.pods(say=said.append, ssh_config=reach["ssh_config"])
    assert str(listed.autodown_status).startswith("1800s idle, fires in ")
    assert multihost.autodown("vals", None, say=said.append, **reach).autodown is None
    cost = multihost.down("vals", say=said.append)
    assert cost is not None
    assert cost >= 0
    assert any(s.startswith("deleted pod vals in us-central2-b (1 x v4-8, up ") for s in said)
    assert standin.tpu.resources == {}
    assert multihost.pods(say=said.append) == []
    assert multihost.gc(say=said.append) == []  # dry run by default: nothing to collect
    assert said[-1] == "nothing to collect"


def test_with_pod_deletes_it_when_the_block_ends_or_raises(standin: Cloud, tmp_path: Path) -> None:
    said: list[str] = []
    reach = _reach(standin, tmp_path)
    with multihost.pod("blk", **POD, **reach, say=said.append) as pod:
        assert pod.state == "ACTIVE"
        assert list(standin.tpu.resources) == ["blk"]
        code = tmp_path / "code"
        code.mkdir()
        r = multihost.run(
            "echo on $MULTIHOST_TEST_HOST",
            prefix="blk",
            script_dir=code,
            log_dir=tmp_path / "logs",
            coordinator_port=free_port(),
            stream="none",
            **reach,
        )
        assert r.ok, r
    assert standin.tpu.resources == {}
    assert any(
        s.startswith("the with block ended (done): deleted pod blk in us-central2-b (1 x v4-8, up ")
        and "cost about $" in s
        for s in said
    ), said
    inside: list[bool] = []

    def failing() -> None:  # an exception in the block: the pod goes, the exception goes on
        with multihost.pod("exc", **POD, **reach, say=said.append):
            inside.append("exc" in standin.tpu.resources)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        failing()
    assert inside == [True]
    assert standin.tpu.resources == {}
    ended = "the with block ended (ZeroDivisionError): deleted pod exc"
    assert any(s.startswith(ended) for s in said)
    with (  # a KeyboardInterrupt (Ctrl-C in a notebook cell)
        pytest.raises(KeyboardInterrupt),
        multihost.pod("ctl", **POD, **reach, say=said.append),
    ):
        raise KeyboardInterrupt
    assert standin.tpu.resources == {}
    assert any(s.startswith("the with block ended (interrupted): deleted pod ctl") for s in said)
    assert multihost.pods(say=said.append) == []


CHILD = """
import sys, time, multihost
with multihost.pod(sys.argv[1], tpu_type="v4-8", runtime_version="v", zone=sys.argv[2],
                   ssh_config=sys.argv[3], no_add_key=True) as pod:
    print("inside", pod.name, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_with_pod_in_a_process_that_is_signalled(
    cloud: Cloud, tmp_path: Path, sig: signal.Signals
) -> None:
    """A script using ``with multihost.pod(...)``, sent SIGTERM (or Ctrl-C, or SIGHUP) for real:
    the pod is deleted on the way out and its cost said; nothing is left in the cloud."""
    e = env(cloud, tmp_path)
    err = tmp_path / "err"
    config = ssh_config(cloud.fleet, tmp_path)
    with err.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, "sig", ZONE, str(config)],
            env=e,
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
        )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "inside sig\n", err.read_text()
        assert cloud.tpu.resources["sig"].state == "ACTIVE"
        proc.send_signal(sig)
        proc.wait(timeout=90)
    finally:
        proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
    text = err.read_text()
    assert proc.returncode != 0, text
    assert (
        "the with block ended (interrupted): deleted pod sig in us-central2-b (1 x v4-8, up "
        in (text)
    )
    assert "cost about $" in text
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []


def test_run_up_down_from_python(standin: Cloud, tmp_path: Path) -> None:
    said: list[str] = []
    code = tmp_path / "code"
    code.mkdir()
    kw = {
        "prefix": "eph",
        "up": True,
        "down": True,
        "script_dir": code,
        "log_dir": tmp_path / "logs",
        "coordinator_port": free_port(),
        "stream": "none",
        "say": said.append,
        **POD,
        **_reach(standin, tmp_path),
    }
    kw.pop("zone")
    with pytest.raises(UsageError, match="--tpu-type says what pod to make"):
        multihost.run("true", **{k: v for k, v in kw.items() if k != "up"})
    r = multihost.run("exit 3", zone=ZONE, **kw)
    assert r.exit_code == 1
    assert any(s.startswith("run ended (exit 1): deleted pod eph in us-central2-b") for s in said)
    assert standin.tpu.resources == {}
    with pytest.raises(UsageError, match="--dry-run makes, arms and deletes nothing"):
        multihost.run("true", zone=ZONE, dry_run=True, **kw)
    with pytest.raises(TypeError, match=r"run_async\(\) does not take up="):
        asyncio.run(multihost.run_async("true", up=True))
    assert standin.tpu.resources == {}


def _where() -> tuple[int, str, int]:
    """Which process of the job this is, on which worker, in which Python process."""
    return int(os.environ["JAX_PROCESS_ID"]), os.environ["MULTIHOST_TEST_HOST"], os.getpid()


def _session_kw(cloud: Cloud, tmp_path: Path, said: list[str]) -> dict[str, object]:
    """A warm session's keywords on the stand-in's pods: their workers' python3 has cloudpickle
    (this module's functions go by value), the output kept, what the pod's life says heard."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    return {
        "runtime_version": "tpu-ubuntu2204-base",
        "zone": ZONE,
        "script_dir": code,
        "log_dir": tmp_path / "logs",
        "coordinator_port": free_port(),
        "stream": "none",
        "grace": 2,
        "say": said.append,
        **hosts_python(),
        **_reach(cloud, tmp_path),
    }


def test_a_session_makes_its_pod_and_deletes_it_when_the_block_ends(
    standin: Cloud, tmp_path: Path
) -> None:
    """``with multihost.session(prefix=NAME, up=True, down=True, ...)``: the pod made, the
    warm processes on its workers (one Python each, every call in it), and after the block
    the processes gone and the queued resource deleted, its cost said."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    said: list[str] = []
    kw = _session_kw(standin, tmp_path, said)
    with pytest.raises(UsageError, match="--up and --down need --prefix NAME"):
        multihost.session(local=1, up=True, down=True)  # refused before anything is made
    assert standin.tpu.resources == {}
    with multihost.session(prefix="warm", up=True, down=True, tpu_type="v4-16", **kw) as s:
        assert standin.tpu.resources["warm"].state == "ACTIVE"
        first = s.call(_where)
        assert [(p, host) for p, host, _ in first] == [(0, "h0"), (1, "h1")]
        assert s.call(_where) == first  # the same processes: warm
    assert standin.tpu.resources == {}
    assert any(
        line.startswith("session ended (closed): deleted pod warm in us-central2-b (1 x v4-16, up ")
        and "cost about $" in line
        for line in said
    ), said
    wait_for(lambda: no_processes(standin.fleet, 2), 30, "the warm processes to end")
    assert multihost.pods(say=said.append) == []


def test_a_session_whose_block_raises_deletes_its_pod(standin: Cloud, tmp_path: Path) -> None:
    """An exception in the block: the processes end, the pod is deleted and said with it, the
    exception goes on. A second session naming the pod with another type is refused, the pod
    left to the first; one on a missing pod with a pod's flag but no ``up=`` is refused too."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    said: list[str] = []
    kw = _session_kw(standin, tmp_path, said)
    with pytest.raises(UsageError, match="--tpu-type says what pod to make"):
        multihost.session(prefix="small", down=True, tpu_type="v4-8", **kw)
    assert standin.tpu.resources == {}
    seen: list[object] = []
    with (  # noqa: PT012 (the block's work, then its exception)
        pytest.raises(ZeroDivisionError),
        multihost.session(prefix="small", up=True, down=True, tpu_type="v4-8", **kw) as s,
    ):
        seen.append([(p, host) for p, host, _ in s.call(_where)])
        with pytest.raises(UsageError, match="v4-16"):
            multihost.session(prefix="small", tpu_type="v4-16", **kw)
        seen.append(standin.tpu.resources["small"].state)
        raise ZeroDivisionError
    assert seen == [[(0, "h0")], "ACTIVE"]
    assert standin.tpu.resources == {}
    ended = "session ended (ZeroDivisionError): deleted pod small in us-central2-b (1 x v4-8, up "
    assert any(line.startswith(ended) for line in said), said
    wait_for(lambda: no_processes(standin.fleet, 1), 30, "the warm process to end")


SESSION_CHILD = """
import os, sys, time, multihost

def where():
    return os.environ["MULTIHOST_TEST_HOST"]

s = multihost.session(prefix="left", up=True, down=True, tpu_type="v4-8", zone=sys.argv[2],
                      runtime_version="v", ssh_config=sys.argv[3], no_add_key=True,
                      python="/usr/bin/python3", env={"PYTHONPATH": sys.argv[4]},
                      script_dir=sys.argv[5], stream="none", grace=2)
print("on", s.call(where), flush=True)
if sys.argv[1] == "signalled":
    with s:
        print("inside", flush=True)
        time.sleep(600)
"""


@pytest.mark.parametrize("end", ["at exit", "signalled"])
def test_a_session_s_pod_goes_with_its_python(cloud: Cloud, tmp_path: Path, end: str) -> None:
    """A script that makes a session with its pod and never closes it: at the script's end
    the processes end and the pod is deleted, said on stderr. One sent SIGTERM inside its block
    ends the block as Ctrl-C does: the same. Nothing is left in the cloud or on the worker."""
    e = env(cloud, tmp_path)
    code = tmp_path / "code"
    code.mkdir()
    site = hosts_python()["env"]["PYTHONPATH"]  # type: ignore[index]
    argv = [end, ZONE, str(ssh_config(cloud.fleet, tmp_path)), site, str(code)]
    err = tmp_path / "err"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", SESSION_CHILD, *argv],
            env=e,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=f,
            text=True,
        )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "on ['h0']\n", err.read_text()
        if end == "signalled":
            assert proc.stdout.readline() == "inside\n", err.read_text()
            assert cloud.tpu.resources["left"].state == "ACTIVE"
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
    text = err.read_text()
    assert (proc.returncode == 0) == (end == "at exit"), text
    ending = "at exit" if end == "at exit" else "interrupted"
    said = f"session ended ({ending}): deleted pod left in us-central2-b (1 x v4-8, up "
    assert said in text, text
    assert "cost about $" in text
    assert cloud.tpu.resources == {}
    wait_for(lambda: no_processes(cloud.fleet, 1), 30, "the warm process to end")


def test_a_profile_says_what_pod_up_makes(cloud: Cloud, tmp_path: Path) -> None:
    """``multihost up NAME`` (and ``multihost.up(NAME, profile=...)``) with a profile that says
    tpu-type, zones, runtime-version and autodown: made of them, no flags needed; a flag given
    wins over the profile's value."""
    cloud.tpu.capacity.refuse_quota("us-east1", "on-demand")
    cloud.tpu.vm_image = True  # autodown's daemon on worker 0: gcloud and the metadata server
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        "[tool.multihost.profiles.tpu]\n"
        'tpu-type = "v4-16"\n'
        f'zones = ["us-east1-d", "{ZONE}"]\n'
        'runtime-version = "tpu-ubuntu2204-base"\n'
        'autodown = "45m"\n'
        f'ssh-config = "{config}"\n'
        "no-add-key = true\n"
    )
    res = cli(["up", "prof", "--profile", "tpu"], cwd=tmp_path, **e)
    assert res.returncode == 0, res.stderr
    assert "us-east1-d: quota: " in res.stderr  # the profile's zones, in order
    assert "pod prof is ACTIVE: 1 x v4-16 in us-central2-b (on-demand)" in res.stderr
    assert "pod prof deletes itself once idle for 2700 s" in res.stderr
    qr = cloud.tpu.resources["prof"]
    assert qr.node_spec["node"]["runtimeVersion"] == "tpu-ubuntu2204-base"
    helped = cli(["up", "--help", "--profile", "tpu"], cwd=tmp_path, **e).stdout
    assert "v4-16, from" in " ".join(helped.split())
    assert cli(["down", "prof"], cwd=tmp_path, **e).returncode == 0
    # a flag wins over the profile: a type and a zone of its own
    res = cli(
        ["up", "prof2", "--profile", "tpu", "--tpu-type", "v4-8", "--zone", ZONE], cwd=tmp_path, **e
    )
    assert res.returncode == 0, res.stderr
    assert "us-east1-d" not in res.stderr
    assert "pod prof2 is ACTIVE: 1 x v4-8 in us-central2-b" in res.stderr
    assert cli(["down", "prof2"], cwd=tmp_path, **e).returncode == 0
    assert cloud.tpu.resources == {}
