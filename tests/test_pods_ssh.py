"""A pod's whole life against the stand-in cloud, with the real gcloud CLI: ``up`` failing
over a quota zone and a starved zone, ``down``, ``pods``, ``gc``, ``run --down``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fleet as loopback
from tests.clitools import cli, wait_for
from tests.cloud.fixture import ZONE, Cloud
from tests.helpers import free_port

pytestmark = pytest.mark.usefixtures("fresh_runs")

QUOTA_ZONE = "us-east1-d"  # its region refuses on-demand TPUs for quota
STARVED_ZONE = "us-central1-a"  # no capacity: the request waits, then FAILs at its valid-until


def ssh_config(fleet: loopback.Fleet, tmp_path: Path) -> Path:
    """Host blocks for the workers' addresses, as a user has them."""
    lines = []
    for h in fleet.hosts:
        lines += [
            f"Host 127.0.0.{2 + h.index}",
            f"  User {h.user}",
            f"  Port {h.port}",
            f"  IdentityFile {fleet.key}",
            "  IdentitiesOnly yes",
        ]
    path = tmp_path / "ssh_config"
    path.write_text("\n".join(lines) + "\n")
    return path


def env(cloud: Cloud, tmp_path: Path) -> dict[str, str]:
    return cloud.env | {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "MULTIHOST_WAIT_POLL": "0.5",
        "MULTIHOST_LOG_DIR": str(tmp_path / "mh"),
    }


def up_args(name: str, config: Path, *extra: str) -> list[str]:
    return [
        "up",
        name,
        "--tpu-type",
        "v4-16",
        "--runtime-version",
        "tpu-ubuntu2204-base",
        "--ssh-config",
        str(config),
        "--no-add-key",
        *extra,
    ]


def creates(cloud: Cloud) -> list[tuple[str, str]]:
    """(zone, name) of every create request the API received, in order."""
    posts = [r for r in cloud.tpu.requests if r.method == "POST"]
    return [
        (r.path.split("/")[5], r.query["queuedResourceId"][0])
        for r in posts
        if r.path.endswith("queuedResources")
    ]


def test_up_fails_over_quota_and_starved_zones_then_down(cloud: Cloud, tmp_path: Path) -> None:
    cloud.tpu.capacity.refuse_quota("us-east1", "on-demand")
    cloud.tpu.capacity.starve(STARVED_ZONE)
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    zones = f"{QUOTA_ZONE},us-east1-b,{STARVED_ZONE},{ZONE}"
    res = cli(
        [*up_args("pod1", config, "--num-slices", "2", "--zones", zones, "--queue-timeout", "3")],
        **e,
    )
    assert res.returncode == 0, res.stderr
    err = res.stderr
    assert f"{QUOTA_ZONE}: quota: ERROR: (gcloud.compute.tpus.queued-resources.create)" in err
    assert "RESOURCE_EXHAUSTED" in err or "Quota limit" in err
    assert "us-east1-b" not in [z for z, _ in creates(cloud)]  # the region was skipped at once
    starved = f'{STARVED_ZONE}: capacity: There is no more capacity in the zone "{STARVED_ZONE}"'
    assert starved in err
    assert "pod pod1 is ACTIVE: 2 x v4-16 in us-central2-b (on-demand), $51.52/h" in err
    assert "pod pod1 is up: 4/4 workers accept SSH" in err
    # the starved zone's request was deleted, and seen gone, before the next zone was asked
    assert creates(cloud) == [(QUOTA_ZONE, "pod1"), (STARVED_ZONE, "pod1"), (ZONE, "pod1")]
    kinds = [
        (r.method, r.path.split("/")[5])
        for r in cloud.tpu.requests
        if r.method in ("POST", "DELETE") and "queuedResources" in r.path
    ]
    assert kinds.index(("DELETE", STARVED_ZONE)) < kinds.index(("POST", ZONE))
    assert list(cloud.tpu.resources) == ["pod1"]
    qr = cloud.tpu.resources["pod1"]
    assert (qr.zone, qr.state) == (ZONE, "ACTIVE")
    node = qr.node_spec["node"]
    assert node["labels"] == {"multihost": "pod1"}
    assert qr.body["queueingPolicy"] == {"validUntilDuration": "3s"}
    # pods: where it is and what it costs
    listed = cli(["pods", "--json"], **e)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["name"], row["zone"], row["state"], row["price_per_hour"]) == (
        "pod1",
        ZONE,
        "ACTIVE",
        51.52,
    )
    assert row["cost_so_far"] is not None
    # down: gone, and said so
    res = cli(["down", "pod1"], **e)
    assert res.returncode == 0, res.stderr
    assert "deleted pod pod1 in us-central2-b (2 x v4-16, up 00:00:" in res.stderr
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []
    again = cli(["down", "pod1"], **e)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1
    assert "no pod 'pod1'" in again.stderr


def test_no_zone_works_leaves_nothing(cloud: Cloud, tmp_path: Path) -> None:
    cloud.tpu.capacity.refuse_quota("us-central2", "spot")
    cloud.tpu.capacity.starve(STARVED_ZONE)
    e = env(cloud, tmp_path)
    res = cli(
        [
            *up_args(
                "pod2",
                tmp_path / "none",
                "--spot",
                "--zones",
                f"{ZONE},{STARVED_ZONE}",
                "--queue-timeout",
                "2",
            )
        ],
        **e,
    )
    assert res.returncode == 1, res.stderr
    assert "no zone could give pod2 (1 x v4-16, spot); nothing is left behind:" in res.stderr
    assert f"  {ZONE}: quota: " in res.stderr
    assert f"  {STARVED_ZONE}: capacity: There is no more capacity" in res.stderr
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["up", "p3", "--tpu-type", "v9-12", "--runtime-version", "v", "--zone", ZONE],
        ["up", "p3", "--tpu-type", "v4-16", "--zone", ZONE],
        ["up", "Bad_Name", "--tpu-type", "v4-16", "--runtime-version", "v", "--zone", ZONE],
        [
            "up",
            "p3",
            "--tpu-type",
            "v4-16",
            "--runtime-version",
            "v",
            "--zone",
            ZONE,
            "--queue-timeout",
            "soon",
        ],
        ["down", "nosuchpod"],
        ["autodown", "nosuchpod", "30"],
        ["run", "--prefix", "x", "--down", "--hosts", "h", "--cmd", "true"],
    ],
)
def test_bad_input_one_line_exit_2_nothing_created(
    cloud: Cloud, tmp_path: Path, argv: list[str]
) -> None:
    res = cli(argv, **env(cloud, tmp_path))
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert [r for r in cloud.tpu.requests if r.method in ("POST", "DELETE")] == []


def run_args(tmp_path: Path, config: Path, name: str, run: str, cmd: str) -> list[str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    return [
        "run",
        "--prefix",
        name,
        "--up",
        "--down",
        "--tpu-type",
        "v4-8",
        "--runtime-version",
        "tpu-ubuntu2204-base",
        "--zone",
        ZONE,
        "--ssh-config",
        str(config),
        "--no-add-key",
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        "--run-name",
        run,
        "--coordinator-port",
        str(free_port()),
        "--cmd",
        cmd,
    ]


@pytest.mark.parametrize(("cmd", "code"), [("echo hi from $MULTIHOST_TEST_HOST", 0), ("exit 3", 1)])
def test_run_up_down_after_success_and_failure(
    cloud: Cloud, tmp_path: Path, cmd: str, code: int
) -> None:
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    res = cli(run_args(tmp_path, config, "eph", "r1", cmd), **e)
    assert res.returncode == code, res.stderr
    assert "pod eph is ACTIVE: 1 x v4-8 in us-central2-b (on-demand), $12.88/h" in res.stderr
    assert f"run ended (exit {code}): deleted pod eph in us-central2-b (1 x v4-8, up " in (
        res.stderr
    )
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []


def test_run_down_after_ctrl_c(cloud: Cloud, tmp_path: Path) -> None:
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    err = tmp_path / "err"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "multihost",
                *run_args(tmp_path, config, "eph", "r2", "sleep 300"),
            ],
            env=e | {"COLUMNS": "200"},
            stdout=subprocess.DEVNULL,
            stderr=f,
            text=True,
        )
    try:
        wait_for(
            lambda: any(
                "sleep 300" in c for h in range(8) for _, c in cloud.fleet.user_processes(h)
            ),
            timeout=90,
            what="the run to start on the pod",
        )
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        proc.kill()
    text = err.read_text()
    assert proc.returncode == 130, text
    assert "run ended (exit 130): deleted pod eph in us-central2-b" in text
    assert cloud.tpu.resources == {}
    assert not any(cloud.fleet.user_processes(h) for h in range(8))


def test_up_killed_mid_wait_then_pods_and_gc(cloud: Cloud, tmp_path: Path) -> None:
    cloud.tpu.capacity.starve(ZONE)
    e = env(cloud, tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "multihost",
            *up_args("orphan", tmp_path / "none", "--zone", ZONE, "--queue-timeout", "15"),
        ],
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        cloud.tpu.wait_state("orphan", "WAITING_FOR_RESOURCES", 60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    (row,) = json.loads(cli(["pods", "--json"], **e).stdout)
    assert (row["name"], row["state"]) == ("orphan", "WAITING_FOR_RESOURCES")
    # the service gives up at the request's valid-until, on its own
    cloud.tpu.wait_state("orphan", "FAILED", 30)
    (row,) = json.loads(cli(["pods", "--json"], **e).stdout)
    assert row["state"] == "FAILED"
    assert "There is no more capacity in the zone" in row["reason"]
    dry = cli(["gc", "--dry-run"], **e)
    assert "would delete orphan in us-central2-b: FAILED: There is no more capacity" in dry.stderr
    assert "orphan" in cloud.tpu.resources
    res = cli(["gc"], **e)
    assert res.returncode == 0, res.stderr
    assert "deleted orphan in us-central2-b: FAILED" in res.stderr
    wait_for(lambda: cloud.tpu.resources == {}, timeout=10, what="the request to go")
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []


def test_autodown_two_slices_kept_by_a_run_then_deleted_by_the_pod(
    cloud: Cloud, tmp_path: Path
) -> None:
    cloud.tpu.vm_image = True  # workers: gcloud and the metadata server from an SSH session
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    res = cli([*up_args("auto", config, "--num-slices", "2", "--zone", ZONE)], **e)
    assert res.returncode == 0, res.stderr
    code = tmp_path / "code"
    code.mkdir()
    logs = str(tmp_path / "logs")
    run = cli(
        [
            "run",
            "--prefix",
            "auto",
            "--zone",
            ZONE,
            "--ssh-config",
            str(config),
            "--no-add-key",
            "--script-dir",
            str(code),
            "--log-dir",
            logs,
            "--run-name",
            "long",
            "--coordinator-port",
            str(free_port()),
            "--detach",
            "--cmd",
            "sleep 600",
        ],
        **e,
    )
    assert run.returncode == 0, run.stderr
    res = cli(["autodown", "auto", "3", "--ssh-config", str(config), "--no-add-key"], **e)
    assert res.returncode == 0, res.stderr
    assert "pod auto deletes itself once idle for 3 s (watched on s0/w0)" in res.stderr
    worker0 = cloud.fleet.hosts[cloud.tpu.resources["auto"].workers[0].host]
    status = worker0.home / ".multihost" / "autodown" / "status"

    def busy_at() -> float:
        words = status.read_text().split() if status.exists() else []
        return float(words[1]) if words[:1] == ["busy"] else 0.0

    wait_for(lambda: busy_at() > 0, timeout=60, what="autodown to see the run")
    first = busy_at()
    listed = cli(["pods", "--json", "--ssh-config", str(config)], **e)
    assert "3s idle; busy: multihost run long" in json.loads(listed.stdout)[0]["autodown"]
    # busy for longer than the idle time: the pod stays
    wait_for(lambda: busy_at() >= first + 5, timeout=60, what="autodown to look again")
    assert [r for r in cloud.tpu.requests if r.method == "DELETE"] == []
    assert cloud.tpu.resources["auto"].state == "ACTIVE"
    killed = cli(["kill", "long", "--log-dir", logs], **e)
    assert killed.returncode == 0, killed.stderr
    wait_for(lambda: "auto" not in cloud.tpu.resources, timeout=90, what="the pod to go")
    deletes = [r for r in cloud.tpu.requests if r.method == "DELETE"]
    assert [r.name for r in deletes] == ["auto"]
    assert deletes[0].auth == "Bearer ya29.vm-auto-s0-w0"  # from the VM, not the runner
    assert deletes[0].query.get("force") == ["True"]  # as gcloud sends --force


@pytest.mark.parametrize("capacity", ["on-demand", "spot", "reserved", "best-effort"])
@pytest.mark.parametrize("slices", [1, 2])
def test_gcloud_accepts_every_command_line(cloud: Cloud, capacity: str, slices: int) -> None:
    """Each command line multihost makes, replayed with the real gcloud against the stand-in."""
    from multihost.pods import plan

    spec = plan.PodSpec(
        "cl",
        "v4-8",
        "v",
        (ZONE,),
        num_slices=slices,
        capacity=capacity,
        project="p",
        queue_timeout=120,
    )
    cloud.tpu.held.add("cl")  # it stays ACCEPTED: only the command lines are under test

    def gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["gcloud", *argv], env=cloud.env, capture_output=True, text=True, timeout=60
        )

    res = gcloud(plan.create_argv(spec, ZONE))
    assert res.returncode == 0, res.stderr
    body = cloud.tpu.resources["cl"].body
    extra = {k: v for k, v in body.items() if k not in ("tpu", "queueingPolicy")}
    expected: dict[str, object] = {
        "on-demand": {},
        "spot": {"spot": {}},
        "reserved": {"reservationName": f"projects/p/locations/{ZONE}/reservations/-"},
        "best-effort": {"bestEffort": {}, "provisioningModel": "STANDARD"},  # alpha track
    }
    assert extra == expected[capacity]
    assert body["queueingPolicy"] == {"validUntilDuration": "120s"}
    node_spec = body["tpu"]["nodeSpec"][0]
    assert node_spec["node"]["labels"] == {"multihost": "cl"}
    if slices > 1:
        assert node_spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "cl"}
    else:
        assert node_spec["nodeId"] == "cl"
    described = gcloud(plan.describe_argv("cl", ZONE, "p"))
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["state"]["state"] == "ACCEPTED"
    elsewhere = gcloud(plan.describe_argv("cl", "us-east1-d", "p"))
    assert elsewhere.returncode != 0
    assert "NOT_FOUND" in elsewhere.stderr  # a resource lives in its zone
    listed = gcloud(plan.list_argv(ZONE, "p"))
    assert listed.returncode == 0, listed.stderr
    assert [plan.ours(qr) for qr in json.loads(listed.stdout)] == ["cl"]
    deleted = gcloud(plan.delete_argv("cl", ZONE, "p"))
    assert deleted.returncode == 0, deleted.stderr
    wait_for(lambda: "cl" not in cloud.tpu.resources, timeout=10, what="the delete")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_interrupted_deletes_its_request(cloud: Cloud, tmp_path: Path, sig: int) -> None:
    cloud.tpu.capacity.starve(ZONE)
    e = env(cloud, tmp_path)
    err = tmp_path / "err"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "multihost",
                *up_args("stop", tmp_path / "none", "--zone", ZONE, "--queue-timeout", "600"),
            ],
            env=e,
            stdout=subprocess.DEVNULL,
            stderr=f,
        )
    try:
        cloud.tpu.wait_state("stop", "WAITING_FOR_RESOURCES", 60)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.read_text()
    assert "interrupted: deleting the request in us-central2-b" in err.read_text()
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []


def _proc_children(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parents[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, grew = {pid}, True
    while grew:
        more = {c for c, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found - {pid}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_interrupted_while_reaching_the_workers_deletes_the_pod(
    cloud: Cloud, tmp_path: Path, sig: int
) -> None:
    """The pod is ACTIVE and ``up`` is reaching its workers (their SSH held up in a
    ProxyCommand that never connects): Ctrl-C or SIGTERM deletes the pod, says so, and
    exits 130; nothing of it is left, in the cloud or here."""
    e = env(cloud, tmp_path)
    config = tmp_path / "ssh_config"
    config.write_text("Host 127.0.0.*\n  ProxyCommand sleep 7007\n")
    err = tmp_path / "err"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "multihost",
                *up_args("reach", config, "--zone", ZONE, "--connect-timeout", "300"),
            ],
            env=e,
            stdout=subprocess.DEVNULL,
            stderr=f,
        )
    try:

        def proxies() -> list[int]:
            return [p for p in _proc_children(proc.pid) if "sleep 7007" in _cmdline(p)]

        held = wait_for(proxies, timeout=90, what="up to be reaching the workers")
        assert cloud.tpu.resources["reach"].state == "ACTIVE"
        proc.send_signal(sig)
        proc.wait(timeout=90)
    finally:
        proc.kill()
    text = err.read_text()
    assert proc.returncode == 130, text
    assert "pod reach is ACTIVE: 1 x v4-16 in us-central2-b (on-demand), $25.76/h" in text
    assert "interrupted: deleting pod reach in us-central2-b, made by this command" in text
    assert "deleted pod reach in us-central2-b (1 x v4-16, up 00:00:" in text
    assert "Traceback" not in text
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []
    wait_for(lambda: not any(_cmdline(p) for p in held), 10, "the ProxyCommands to go")


def test_a_pod_is_found_where_failover_put_it(cloud: Cloud, tmp_path: Path) -> None:
    """The one rule: ``up`` with no zone asks in gcloud's default zone; a pod that failover
    put elsewhere is found by its record: ``run``, ``hosts`` and ``sweep --prefix NAME`` need
    no --zone for it (gcloud's default zone here is another one)."""
    cloud.tpu.capacity.refuse_quota("us-east1", "on-demand")
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    there = "us-west4-a"
    res = cli([*up_args("far", config, "--zones", f"{QUOTA_ZONE},{there}")], **e)
    assert res.returncode == 0, res.stderr
    assert f"pod far is ACTIVE: 1 x v4-16 in {there} (on-demand)" in res.stderr
    assert cloud.tpu.resources["far"].zone == there != e["CLOUDSDK_COMPUTE_ZONE"]
    code = tmp_path / "code"
    code.mkdir()
    (code / "t.sh").write_text('echo "MULTIHOST_RESULT {\\"x\\": $1}"\n')
    reach = ["--ssh-config", str(config), "--no-add-key"]
    run = cli(
        ["run", "--prefix", "far", *reach, "--script-dir", str(code), "--log-dir",
         str(tmp_path / "logs"), "--coordinator-port", str(free_port()),
         "--cmd", "echo on $MULTIHOST_TEST_HOST"],
        **e,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "all 2 hosts succeeded" in run.stdout + run.stderr
    hosts = cli(["hosts", "--prefix", "far", "--ssh-config", str(config)], **e)
    assert hosts.returncode == 0, hosts.stderr
    assert "127.0.0.2" in hosts.stdout
    sweep = cli(
        ["sweep", "--prefix", "far", *reach, "--script-dir", str(code), "--log-dir",
         str(tmp_path / "logs"), "--coordinator-port", str(free_port()), "--metric", "x",
         "--cmd", "sh t.sh {x}", "--grid", "x=1"],
        **e,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    # up with no zone at all: gcloud's default zone (as run --prefix uses it for an unknown pod)
    res = cli([*up_args("near", config)], **e)
    assert res.returncode == 0, res.stderr
    assert cloud.tpu.resources["near"].zone == e["CLOUDSDK_COMPUTE_ZONE"] == ZONE
    for name in ("far", "near"):
        assert cli(["down", name], **e).returncode == 0
    assert cloud.tpu.resources == {}


def test_up_in_a_zone_that_does_not_exist_is_refused_and_leaves_nothing(
    cloud: Cloud, tmp_path: Path
) -> None:
    """The stand-in refuses a location it does not have, as the service does."""
    e = env(cloud, tmp_path)
    res = cli([*up_args("nozone", tmp_path / "none", "--zone", "us-central2-z")], **e)
    assert res.returncode == 1, res.stderr
    assert "us-central2-z: error: ERROR: (gcloud.compute.tpus.queued-resources.create)" in (
        res.stderr
    )
    assert "Location us-central2-z is not found or access is unauthorized" in res.stderr
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []


def test_autodown_on_an_existing_pod_from_run_and_a_reused_hosts_state(
    cloud: Cloud, tmp_path: Path
) -> None:
    """``run --prefix NAME --autodown D`` arms the existing pod (without --up, and with --up
    on a pod that exists), ``--autodown off`` stops it: never ignored. A host that a later pod
    reuses shows nothing of the earlier pod's autodown, and a daemon that is gone is said."""
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    reach = ["--ssh-config", str(config), "--no-add-key"]
    code = tmp_path / "code"
    code.mkdir()

    def run(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return cli(
            ["run", "--prefix", name, *reach, "--script-dir", str(code), "--log-dir",
             str(tmp_path / "logs"), "--coordinator-port", str(free_port()), *extra,
             "--cmd", "true"],
            **e,
        )  # fmt: skip

    def autodown_of(name: str) -> str:
        listed = cli(["pods", "--json", "--ssh-config", str(config)], **e)
        assert listed.returncode == 0, listed.stderr
        return str(next(r for r in json.loads(listed.stdout) if r["name"] == name)["autodown"])

    res = cli([*up_args("first", config, "--tpu-type", "v4-8", "--zone", ZONE)], **e)
    assert res.returncode == 0, res.stderr
    armed = run("first", "--autodown", "600")
    assert armed.returncode == 0, armed.stderr
    assert "pod first deletes itself once idle for 600 s (watched on s0/w0)" in armed.stderr
    assert autodown_of("first").startswith("600s idle, fires in ")
    off = run("first", "--up", "--tpu-type", "v4-8", "--autodown", "off")
    assert off.returncode == 0, off.stderr
    assert "pod first exists (active in us-central2-b): using it" in off.stderr
    assert "autodown of pod first is off" in off.stderr
    assert autodown_of("first") == "None"
    assert run("first", "--autodown", "900").returncode == 0
    host = cloud.tpu.resources["first"].workers[0].host
    assert cli(["down", "first"], **e).returncode == 0
    # a later pod on the same host; its record says autodown, but it was never armed there
    # (the state a failed or interrupted arm leaves): the earlier pod's state is not its own
    res = cli([*up_args("second", config, "--tpu-type", "v4-8", "--zone", ZONE)], **e)
    assert res.returncode == 0, res.stderr
    assert cloud.tpu.resources["second"].workers[0].host == host
    path = Path(e["MULTIHOST_LOG_DIR"]) / "pods" / "second" / "pod.json"
    from multihost.pods import records

    record = records.PodRecord.from_json(path.read_text())
    path.write_text(record.evolve(autodown=1800.0).to_json())
    assert autodown_of("second") == "not armed on the pod"
    assert cli(["autodown", "second", "1800", *reach], **e).returncode == 0
    assert autodown_of("second").startswith("1800s idle, fires in ")
    # its daemon gone (the host rebooted, say): its last word is not taken for a live timer
    cloud.fleet.kill_user_processes([host])
    assert autodown_of("second").startswith("1800s idle; its daemon is not running")
