"""The Python API over real local workers: event loops, names, keywords, output, results, call,
and runs after the fact. Each test has its own HOME (local workers' state) and log dir."""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import cloudpickle
import pytest

import multihost
from multihost.api.call import RUNNER, SCRIPT
from multihost.api.runs import plan_run
from multihost.options import default_run_name
from multihost.remote.commands import check_run_name
from tests.gcloud_fixtures import FAKE_GCLOUD_DIR, FIXTURE_DIR

# The functions below are sent to local workers, which cannot import this test package: by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def home(tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("MULTIHOST_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.chdir(code)
    return h


def test_default_run_names_sort_by_time_and_differ() -> None:
    names = {default_run_name() for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert check_run_name(name) == name
        stamp, _, suffix = name.rpartition("-")
        assert len(stamp) == len("20261123-054213")
        assert len(suffix) == 6


def test_run_inside_a_running_loop_and_gathered_runs(home: Path) -> None:
    """Jupyter's case: ``run`` is called while a loop runs (no 'never awaited' warning: the
    suite turns warnings into errors); gathered ``run_async`` calls get distinct names."""

    async def main() -> tuple[multihost.RunResult, ...]:
        inside = multihost.run("echo $JAX_PROCESS_ID", local=2, stream="none")
        a, b = await asyncio.gather(
            multihost.run_async("true", local=1, stream="none"),
            multihost.run_async("true", local=1, stream="none"),
        )
        return inside, a, b

    inside, a, b = asyncio.run(main())
    assert inside.exit_code == 0
    assert a.ok
    assert b.ok
    assert len({inside.run_name, a.run_name, b.run_name}) == 3


def test_unknown_keyword_names_it_and_the_accepted_ones(home: Path) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'fail_fats'") as info:
        multihost.run("true", local=1, fail_fats=False)
    for accepted in ("fail_fast", "prefix", "ssh_config", "env", "script_dir", "timeout", "zone"):
        assert accepted in str(info.value)
    with pytest.raises(ValueError, match="ssh config nope does not exist"):
        multihost.run("true", hosts="h0", ssh_config="nope")
    with pytest.raises(TypeError, match=r"call\(\) does not take script_dir=: call\(\) stages"):
        multihost.call(print, local=1, script_dir=".")
    with pytest.raises(TypeError, match=r"call\(\) got an unexpected keyword argument 'bogus'"):
        multihost.call(print, local=1, bogus=1)


def test_output_default_prefixes_and_callback(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    multihost.run("echo hi $JAX_PROCESS_ID", local=2)
    out = capsys.readouterr().out
    assert "[s0/w0] hi 0" in out
    assert "[s0/w1] hi 1" in out
    seen: list[tuple[str, str]] = []
    multihost.run(
        "echo hi $JAX_PROCESS_ID",
        local=2,
        stream="host0",
        on_output=lambda host, line: seen.append((host, line)),
    )
    assert seen == [("s0/w0", "hi 0")]
    assert capsys.readouterr().out == ""


def test_result_line_and_reprs(home: Path) -> None:
    cmd = 'echo "MULTIHOST_RESULT {\\"p\\": 0}"; echo "MULTIHOST_RESULT {\\"last\\": 1}"'
    r = multihost.run(cmd, local=2, stream="none", run_name="res")
    assert r.result() == {"last": 1}
    assert [h.result() for h in r.hosts] == [{"last": 1}, {"last": 1}]
    assert multihost.run("echo no result", local=1, stream="none").result() is None
    html = r._repr_html_()
    assert "<table>" in html
    assert "s0/w1" in html
    assert "all 2 hosts succeeded" in html
    assert "<td" in r.hosts[0]._repr_html_()
    text = str(r)
    assert text.splitlines()[0] == "run res"
    assert "s0/w1  local1   done   0" in text
    assert repr(r) == "<RunResult res: exit 0; s0/w0 done, s0/w1 done>"
    failed = multihost.run("exit 3", local=1, stream="none")
    assert repr(failed.hosts[0]) == "<HostResult s0/w0 failed exited with code 3>"
    assert "0/1 host succeeded" in failed._repr_html_()


def _twice_plus_id(x: int) -> int:
    print("computing on", os.environ["JAX_PROCESS_ID"])
    return x * 2 + int(os.environ["JAX_PROCESS_ID"])


def _raise_on_1() -> str:
    if os.environ["JAX_PROCESS_ID"] == "1":
        raise ValueError("boom on host one")
    return "fine"


def test_call_returns_values_in_process_order(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert multihost.call(_twice_plus_id, 10, local=2) == [20, 21]
    assert "[s0/w1] computing on 1" in capsys.readouterr().out
    assert multihost.call(lambda **kw: sorted(kw), local=1, kwargs={"b": 1, "a": 2}) == [["a", "b"]]


def test_call_raising_on_a_host(home: Path) -> None:
    with pytest.raises(multihost.RemoteCallError) as info:
        multihost.call(_raise_on_1, local=2, fail_fast=False, stream="none")
    err = info.value
    assert err.host.name == "s0/w1"
    assert "ValueError: boom on host one" in str(err)
    assert "remote traceback (s0/w1)" in str(err)
    assert "in _raise_on_1" in str(err)
    assert [(o.host.name, o.ok, o.value) for o in err.results] == [
        ("s0/w0", True, "fine"),
        ("s0/w1", False, None),
    ]


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no /usr/bin/python3")
def test_call_without_cloudpickle_on_the_host_says_so(home: Path) -> None:
    probe = subprocess.run(["/usr/bin/python3", "-c", "import cloudpickle"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("/usr/bin/python3 has cloudpickle")
    with pytest.raises(multihost.RemoteCallError, match="cloudpickle is not installed"):
        multihost.call(int, local=1, python="/usr/bin/python3", stream="none")


def test_runner_refuses_another_python_minor(tmp_path: Path) -> None:
    """The host-side script itself, as a host runs it: a version mismatch is said plainly."""
    code, run = tmp_path / "code" / "h", tmp_path / "runs" / "r"
    code.mkdir(parents=True)
    run.mkdir(parents=True)
    (code / SCRIPT).write_text(RUNNER)
    (code / "_multihost_call.pkl").write_bytes(pickle.dumps({"python": (3, 1), "call": b""}))
    env = {**os.environ, "MULTIHOST_RUN": "r"}
    res = subprocess.run([sys.executable, SCRIPT], cwd=code, env=env, capture_output=True)
    assert res.returncode == 3
    error = pickle.loads((run / "call.out").read_bytes())["error"]
    assert "Python version mismatch" in error
    assert "pickled by Python 3.1" in error


def test_status_attach_kill(home: Path, tmp_path: Path) -> None:
    r = multihost.run("sleep 30", local=2, detach=True, run_name="bg", grace=2)
    assert [s.state for s in multihost.status("bg")] == [multihost.State.RUNNING] * 2
    killed = multihost.kill("bg", grace=2)
    assert [h.state for h in killed.hosts] == [multihost.State.KILLED] * 2
    assert [s.state for s in multihost.status("bg")] == [multihost.State.KILLED] * 2
    assert r.run_name == "bg"
    multihost.run("sleep 0.5; echo late $JAX_PROCESS_ID", local=2, detach=True, run_name="att")
    lines: list[tuple[str, str]] = []
    done = multihost.attach("att", on_output=lambda h, line: lines.append((h, line)))
    assert done.ok
    assert sorted(lines) == [("s0/w0", "late 0"), ("s0/w1", "late 1")]
    logs = multihost.pull_logs("att")
    logs["s0/w1"].write_text("")  # a local log lost: pulled again from the host
    assert multihost.pull_logs("att")["s0/w1"].read_text() == "late 1\n"
    with pytest.raises(multihost.UsageError, match="no run 'nope'"):
        multihost.status("nope")
    shutil.rmtree(tmp_path / "logs")


def _interrupt_soon(delay: float = 1.5) -> None:
    """Ctrl-C as a kernel interrupt delivers it: SIGINT to this process's main thread."""
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()


def test_ctrl_c_stops_every_host_in_a_script_and_inside_a_loop(home: Path) -> None:
    _interrupt_soon()
    plain = multihost.run("sleep 30", local=2, stream="none", grace=2)
    loop = asyncio.new_event_loop()  # a loop as Jupyter's: no SIGINT handler of its own

    async def inside() -> multihost.RunResult:
        _interrupt_soon()
        return multihost.run("sleep 30", local=2, stream="none", grace=2)

    try:
        in_loop = loop.run_until_complete(inside())
    finally:
        loop.close()
    for r in (plain, in_loop):
        assert r.interrupted
        assert r.exit_code == 130
        assert [h.state for h in r.hosts] == [multihost.State.KILLED] * 2


def test_run_sweep_ranks_points(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cmd = 'echo "MULTIHOST_RESULT {{\\"score\\": $(({a} * {b}))}}"'
    result = multihost.run_sweep(
        cmd, {"a": [1, 2, 3], "b": [5]}, where="a != 2", metric="score", local=1, run_name="sw"
    )
    assert [(r["values"], r["metric"], r["rank"]) for r in result.summary] == [
        ({"a": 3, "b": 5}, 15, 1),
        ({"a": 1, "b": 5}, 5, 2),
    ]
    assert result.ok
    assert result.best is not None
    assert result.best["label"] == "a=3 b=5"
    assert (result.dir / "results.jsonl").is_file()
    assert "score=15" in capsys.readouterr().out
    assert "<table>" in result._repr_html_()
    assert str(result).splitlines()[1].split()[:4] == ["#", "a", "b", "score"]
    with pytest.raises(TypeError, match=r"accepts: .*minimize"):
        multihost.run_sweep(cmd, {"a": [1], "b": [1]}, local=1, minimise=True)


def _host_only_value() -> object:
    import only_on_the_host  # type: ignore[import-not-found]

    return only_on_the_host.Thing()


def test_call_value_that_cannot_come_back_is_said(home: Path, tmp_path: Path) -> None:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "only_on_the_host.py").write_text("class Thing:\n    pass\n")
    path = f"{tmp_path / 'mods'}:{Path(__file__).resolve().parent.parent}"
    with pytest.raises(multihost.RemoteCallError, match="cannot be unpickled here"):
        multihost.call(_host_only_value, local=1, stream="none", env={"PYTHONPATH": path})


def test_prefix_keywords_reach_discovery_and_cloud_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prefix=`` (with project/zone/ip/user) resolves through gcloud as the CLI's flags do,
    with the cloud defaults: trust on first use, the gcloud key, stale-holder warnings."""
    monkeypatch.setenv("PATH", f"{FAKE_GCLOUD_DIR}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_GCLOUD_LOG", str(tmp_path / "gcloud.log"))
    monkeypatch.setenv("FAKE_GCLOUD_NODES", str(FIXTURE_DIR / "myqr.json"))
    # no_add_key: the fake gcloud only lists (first contact: test_sources_tpukeys_ssh)
    plan = plan_run(
        "true",
        {
            "prefix": "myqr",
            "project": "p",
            "zone": "z",
            "ip": "internal",
            "user": "ml",
            "script_dir": tmp_path,
            "no_add_key": True,
        },
    )
    assert len(plan.fleet) == 4
    assert plan.fleet.num_slices == 2
    assert {h.user for h in plan.fleet} == {"ml"}
    assert plan.options.ssh.host_keys == "accept-new"
    assert plan.options.ssh.fallback_identity == "~/.ssh/google_compute_engine"
    assert plan.options.stale == "warn"
    call = (tmp_path / "gcloud.log").read_text()
    assert '"--project", "p"' in call
    assert '"--zone", "z"' in call


def test_import_is_light_and_results_render_without_rich() -> None:
    code = (
        "import sys, multihost; heavy = ('asyncssh', 'rich', 'cloudpickle')\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in heavy], 'import multihost'\n"
        "from multihost.results import faces, records\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in heavy], 'result'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
