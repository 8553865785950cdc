"""``--workers`` on the real OpenSSH fleet: a run on some hosts runs only there (their /proc and
homes say so), ``pull``/``status``/``logs``/``stack`` of a run on some of its hosts, a JAX
launch on a subset refused before any host is touched, and a JAX program on a subset failing
at once instead of waiting for processes that never come."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clitools import cli, fleet_run_args, host_logs, manifest, no_processes, spawn, wait_for

pytestmark = pytest.mark.usefixtures("fresh_runs")


def _run_dirs(fleet, run: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The hosts (indices) that hold the run's directory."""
    return [i for i, h in enumerate(fleet.hosts) if (h.home / ".multihost" / "runs" / run).exists()]


def test_a_run_on_some_hosts_runs_only_there(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    cmd = (
        'echo "p=$MULTIHOST_PROCESS_ID w=$MULTIHOST_WORKERS j=${JAX_PROCESS_ID-none}"; '
        "exec python3 -c 'import time; time.sleep(60)'"
    )
    args = fleet_run_args(
        ssh_fleet, code, logs, "some", cmd, 6, "--workers", "s0/w[1,3-4]", "--detach"
    )
    res = cli(args)
    assert res.returncode == 0, res.stderr
    assert "started on 3 host(s)" in res.stdout
    # /proc: the job runs under the chosen hosts' users only
    wait_for(lambda: all(ssh_fleet.user_processes(i) for i in (1, 3, 4)), 20)
    assert not any(ssh_fleet.user_processes(i) for i in (0, 2, 5))
    assert _run_dirs(ssh_fleet, "some") == [1, 3, 4]
    record = manifest(logs, "some")
    assert [h["host"]["process_id"] for h in record["hosts"]] == [1, 3, 4]
    status = cli(["status", "some", "--log-dir", str(logs), "--json", "--workers", "3-4"])
    assert [(r["host"], r["state"]) for r in json.loads(status.stdout)] == [
        ("s0/w3", "running"),
        ("s0/w4", "running"),
    ]
    wait_for(
        lambda: "p=4" in cli(["logs", "some", "--log-dir", str(logs), "--host", "s0/w4"]).stdout, 20
    )
    seen = cli(["logs", "some", "--log-dir", str(logs), "--all", "--exclude-workers", "s0/w4"])
    assert seen.stdout.splitlines() == [
        "[s0/w1] p=1 w=s0/w1,s0/w3-4 j=none",
        "[s0/w3] p=3 w=s0/w1,s0/w3-4 j=none",
    ]
    stacks = cli(["stack", "some", "--log-dir", str(logs), "--workers", "1", "--json"])
    taken = json.loads(stacks.stdout)
    assert taken["errors"] == {}, stacks.stdout
    assert [g["hosts"] for g in taken["groups"]] == ["s0/w1"]
    kill = cli(["kill", "some", "--log-dir", str(logs)])
    assert kill.returncode == 0, kill.stderr
    wait_for(lambda: no_processes(ssh_fleet, 6), 20)
    assert {h["state"] for h in manifest(logs, "some")["hosts"]} == {"killed"}


def test_pull_from_some_hosts(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logs, dest = tmp_path / "logs", tmp_path / "pulled"
    cmd = "mkdir -p out && echo $MULTIHOST_WORKER_ID > out/who.txt"
    res = cli(fleet_run_args(ssh_fleet, code, logs, "pl", cmd, 4))
    assert res.returncode == 0, res.stderr
    got = cli(
        [
            "pull",
            "pl",
            "out",
            "--log-dir",
            str(logs),
            "--to",
            str(dest),
            "--workers",
            "s0/w[1,3]",
            "--json",
        ]
    )
    assert got.returncode == 0, got.stderr
    assert [r["host"] for r in json.loads(got.stdout)] == ["s0/w1", "s0/w3"]
    assert sorted(str(p.relative_to(dest)) for p in dest.glob("*/*")) == ["s0/w1", "s0/w3"]
    assert (dest / "s0" / "w3" / "out" / "who.txt").read_text() == "3\n"
    rest = cli(
        [
            "pull",
            "pl",
            "out/who.txt",
            "--log-dir",
            str(logs),
            "--to",
            str(tmp_path / "b"),
            "--exclude-workers",
            "1-3",
        ]
    )
    assert rest.returncode == 0, rest.stderr
    assert [str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b").glob("*/*")] == ["s0/w0"]
    bad = cli(["pull", "pl", "out", "--log-dir", str(logs), "--workers", "7"])
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "multihost: error: --workers 7: no process 7 (run pl: s0/w0-3, processes 0-3)"
    )
    assert (manifest(logs, "pl")["hosts"][0]["state"]) == "done"


@pytest.mark.parametrize(
    "extra",
    [
        ["--workers", "0,1", "--payload", "shardings"],
        ["--exclude-workers", "s0/w2", "--trace", "3", "--cmd", "true"],
    ],
    ids=["payload", "trace"],
)
def test_a_jax_launch_on_some_hosts_is_refused(
    ssh_fleet, tmp_path: Path, code: Path, extra: list[str]
) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    hosts = ["--hosts", ",".join(ssh_fleet.aliases[:3]), "--ssh-config", str(ssh_fleet.ssh_config)]
    where = [] if "--payload" in extra else ["--script-dir", str(code)]
    res = cli(["run", *hosts, *where, "--log-dir", str(logs), "--run-name", "jx", *extra])
    assert res.returncode == 2, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "needs a JAX job on every process" in line
    assert "On some hosts run a plain --cmd" in line
    assert not logs.exists()
    assert _run_dirs(ssh_fleet, "jx") == []


@pytest.mark.jax
def test_a_jax_program_on_some_hosts_fails_at_once(
    ssh_fleet, remote_jax: dict[str, str], code: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """No JAX_* variables on a subset: a bare initialize() is told so, not left waiting at a
    coordinator for processes that were never started."""
    logs = tmp_path / "logs"
    prog = "import jax; jax.distributed.initialize(); print('joined')"
    args = fleet_run_args(
        ssh_fleet,
        code,
        logs,
        "jx-some",
        f'{remote_jax["PYTHON"]} -c "{prog}"',
        3,
        "--workers",
        "0,2",
        "--env",
        "JAX_PLATFORMS=cpu",
        "--env",
        f"PYTHONPATH={remote_jax['PYTHONPATH']}",
        "--timeout",
        "60",
        "--no-fail-fast",
    )
    proc = spawn(args)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err
    assert "timeout" not in err
    assert "joined" not in out
    record = manifest(logs, "jx-some")
    assert [(h["host"]["process_id"], h["state"]) for h in record["hosts"]] == [
        (0, "failed"),
        (2, "failed"),
    ]
    for text in host_logs(logs, "jx-some").values():
        assert "coordinator_address should be defined" in text
    assert no_processes(ssh_fleet, 3)


def test_some_workers_of_a_multislice_prefix(ssh_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Discovered as a whole (two slices of two), run on slice 1 and s0/w0: each keeps its
    slice and worker, nobody gets Megascale or JAX wiring."""
    from tests.gcloud_fixtures import make_nodes
    from tests.test_sources_tpu_ssh import _run_args, _setup

    nodes = make_nodes("myqr", 2, 2, "v4-16", internal_ips=[f"127.0.0.{k}" for k in (2, 3, 4, 5)])
    config, env = _setup(ssh_fleet, tmp_path, nodes)
    cmd = (
        'echo "$MULTIHOST_SLICE_ID $MULTIHOST_WORKER_ID $MULTIHOST_PROCESS_ID '
        '${MEGASCALE_SLICE_ID:-none} ${JAX_COORDINATOR_ADDRESS:-none} $MULTIHOST_TEST_HOST"'
    )
    args = [*_run_args(config, tmp_path, "ms-some", cmd), "--host-keys", "strict"]
    res = cli([*args, "--workers", "s1,s0/w0"], **env)
    assert res.returncode == 0, res.stderr
    assert host_logs(tmp_path / "logs", "ms-some") == {
        "slice_0000_worker_0000": "0 0 0 none none h0\n",
        "slice_0001_worker_0000": "1 0 2 none none h2\n",
        "slice_0001_worker_0001": "1 1 3 none none h3\n",
    }
    assert _run_dirs(ssh_fleet, "ms-some") == [0, 2, 3]
    bad = cli([*args, "--run-name", "ms-bad", "--workers", "s2"], **env)
    assert bad.returncode == 2
    assert "--workers s2: no slice 2 (the fleet: s0/w0-1,s1/w0-1, processes 0-3)" in bad.stderr


def test_kill_and_follow_some_hosts_of_a_run(ssh_fleet, code: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``kill --workers`` stops those hosts only, ``logs --follow --workers`` follows those only;
    run.json keeps every host, the others as they were."""
    logs = tmp_path / "logs"
    (code / "go.sh").write_text(
        'echo "start $MULTIHOST_WORKER_ID"\n'
        'while [ ! -e "$HOME/.multihost/runs/$MULTIHOST_RUN/stop" ]; do sleep 0.2; done\n'
        'echo "end $MULTIHOST_WORKER_ID"\n'
    )
    res = cli(fleet_run_args(ssh_fleet, code, logs, "part", "sh go.sh", 4, "--detach"))
    assert res.returncode == 0, res.stderr
    wait_for(lambda: all(ssh_fleet.user_processes(i) for i in range(4)), 20)
    kill = cli(["kill", "part", "--log-dir", str(logs), "--workers", "s0/w3"])
    assert kill.returncode == 0, kill.stderr
    wait_for(lambda: not ssh_fleet.user_processes(3), 20)
    assert all(ssh_fleet.user_processes(i) for i in range(3))
    states = [h["state"] for h in manifest(logs, "part")["hosts"]]
    assert states == ["running", "running", "running", "killed"]
    assert not manifest(logs, "part")["interrupted"]
    wait_for(
        lambda: "start" in cli(["logs", "part", "--log-dir", str(logs), "--host", "s0/w2"]).stdout,
        20,
    )
    follow = spawn(["logs", "part", "--log-dir", str(logs), "--follow", "--workers", "1-2"])
    for i in (1, 2):
        (ssh_fleet.hosts[i].home / ".multihost" / "runs" / "part" / "stop").touch()
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    assert sorted(line for line in out.splitlines() if "end" in line) == [
        "[s0/w1] end 1",
        "[s0/w2] end 2",
    ]
    assert "s0/w0" not in out
    states = [h["state"] for h in manifest(logs, "part")["hosts"]]
    assert states == ["running", "done", "done", "killed"]
    rest = cli(["kill", "part", "--log-dir", str(logs)])
    assert rest.returncode == 0, rest.stderr
    wait_for(lambda: no_processes(ssh_fleet, 4), 20)
    assert [h["state"] for h in manifest(logs, "part")["hosts"]] == [
        "killed",
        "done",
        "done",
        "killed",
    ]


def test_first_contact_only_where_the_chosen_hosts_are(cloud, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two slices on the stand-in cloud, ``--workers s1``: the key goes into slice 1's node
    metadata only (the real gcloud CLI, one PATCH), and the run is there only."""
    from tests.test_sources_tpukeys_ssh import multihost, patches, ssh_config

    cloud.tpu.add("myqr", "v4-16", 2)
    qr = cloud.tpu.wait_state("myqr", "ACTIVE")
    config = str(ssh_config(cloud.fleet, tmp_path))
    res = multihost(
        cloud,
        tmp_path,
        tmp_path / "home",
        "--ssh-config",
        config,
        "--run-name",
        "fc",
        "--workers",
        "s1",
        cmd="echo $MULTIHOST_SLICE_ID",
    )
    assert res.returncode == 0, res.stderr
    assert "adding your key to 1 node…" in res.stderr
    assert "was added to the metadata of myqr-1" in res.stderr
    assert patches(cloud) == 1
    assert "ssh-keys" not in qr.node_metadata(0)
    assert "ssh-keys" in qr.node_metadata(1)
    assert sorted(host_logs(tmp_path / "logs", "fc")) == [
        "slice_0001_worker_0000",
        "slice_0001_worker_0001",
    ]
