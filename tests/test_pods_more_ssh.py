"""More of a pod's life against the stand-in cloud with the real gcloud CLI: ``sweep
--up/--down`` after success, a failed trial and Ctrl-C; ``pods``/``gc --zones`` seeing the
requests made from another machine (by their label); autodown after a simulated reboot."""

from __future__ import annotations

import calendar
import fcntl
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clitools import cli, wait_for
from tests.cloud.fixture import ZONE, Cloud
from tests.helpers import free_port
from tests.test_pods_ssh import STARVED_ZONE, env, ssh_config, up_args

pytestmark = pytest.mark.usefixtures("fresh_runs")

TRIAL = 'if [ "$JAX_PROCESS_ID" = 0 ]; then echo "MULTIHOST_RESULT {\\"x\\": $1}"; fi\nexit $2\n'


def sweep_args(tmp_path: Path, config: Path, name: str, run: str, *grid: str) -> list[str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "t.sh").write_text(TRIAL)
    return [
        "sweep",
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
        "--metric",
        "x",
        "--coordinator-port",
        str(free_port()),
        "--cmd",
        "sh t.sh {x} {code}",
        *grid,
    ]


def results(tmp_path: Path, run: str) -> dict[tuple[int, int], str]:
    """(x, code) -> the trial's status."""
    path = tmp_path / "logs" / run / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(int(r["x"]), int(r["code"])): str(r["status"]) for r in rows}


@pytest.mark.parametrize(("codes", "exit_code"), [("0", 0), ("0,3", 1)])
def test_sweep_up_down_after_success_and_a_failed_trial(
    cloud: Cloud, tmp_path: Path, codes: str, exit_code: int
) -> None:
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    res = cli(
        sweep_args(tmp_path, config, "swp", "s1", "--grid", "x=1,2", "--grid", f"code={codes}"), **e
    )
    assert res.returncode == exit_code, res.stderr
    assert "pod swp is ACTIVE: 1 x v4-8 in us-central2-b (on-demand), $12.88/h" in res.stderr
    assert f"run ended (exit {exit_code}): deleted pod swp in us-central2-b (1 x v4-8, up " in (
        res.stderr
    )
    status = results(tmp_path, "s1")
    assert status[(1, 0)] == status[(2, 0)] == "ok"
    assert len(status) == 2 * len(codes.split(","))
    if exit_code:
        assert status[(1, 3)] == status[(2, 3)] == "failed: s0/w0 exited with code 3"
    assert cloud.tpu.resources == {}
    assert [r.name for r in cloud.tpu.requests if r.method == "DELETE"] == ["swp"]
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []
    assert not any(cloud.fleet.user_processes(h) for h in range(8))


def test_sweep_down_after_ctrl_c(cloud: Cloud, tmp_path: Path) -> None:
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    err = tmp_path / "err"
    argv = sweep_args(tmp_path, config, "swp", "s2", "--grid", "x=1,2", "--grid", "code=0")
    argv[argv.index("--cmd") + 1] = "sleep 300; sh t.sh {x} {code}"
    with err.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "multihost", *argv],
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
            what="the first trial to start on the pod",
        )
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        proc.kill()
    text = err.read_text()
    assert proc.returncode == 130, text
    assert "run ended (exit 130): deleted pod swp in us-central2-b" in text
    assert cloud.tpu.resources == {}
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []
    wait_for(
        lambda: not any(cloud.fleet.user_processes(h) for h in range(8)),
        timeout=30,
        what="no process left on the workers",
    )


def gcloud(cloud: Cloud, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["gcloud", *argv], env=cloud.env, capture_output=True, text=True, timeout=60
    )


def test_pods_and_gc_see_requests_made_from_another_machine(cloud: Cloud, tmp_path: Path) -> None:
    """Requests created with gcloud as multihost makes them on another laptop (its label, no
    record here): ``pods --zones`` lists them, ``gc --zones`` deletes the dead one only; an
    unlabelled request is never shown nor touched."""
    from multihost.cloud import queued
    from multihost.pods import plan

    cloud.tpu.capacity.starve(STARVED_ZONE)
    cloud.tpu.held.add("alive")  # it stays ACCEPTED
    cloud.tpu.held.add("foreign")
    dead = plan.PodSpec(
        "elsewhere", "v4-16", "v", (STARVED_ZONE,), num_slices=2, capacity="spot", queue_timeout=2
    )
    alive = plan.PodSpec("alive", "v4-8", "v", (ZONE,), queue_timeout=600)
    for spec in (dead, alive):
        made = gcloud(cloud, plan.create_argv(spec, spec.zones[0]))
        assert made.returncode == 0, made.stderr
    foreign = queued.create_argv("foreign", accelerator_type="v4-8", runtime_version="v", zone=ZONE)
    assert gcloud(cloud, foreign).returncode == 0
    e = env(cloud, tmp_path)
    assert json.loads(cli(["pods", "--json"], **e).stdout) == []  # no record here
    zones = ["--zones", f"{ZONE},{STARVED_ZONE}"]
    cloud.tpu.wait_state("elsewhere", "FAILED", 30)
    listed = cli(["pods", "--json", *zones], **e)
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {"alive", "elsewhere"}
    a, d = rows["alive"], rows["elsewhere"]
    assert (a["zone"], a["state"], a["tpu_type"], a["num_slices"], a["recorded"]) == (
        ZONE,
        "ACCEPTED",
        "v4-8",
        1,
        False,
    )
    assert (d["zone"], d["state"], d["tpu_type"], d["num_slices"], d["capacity"]) == (
        STARVED_ZONE,
        "FAILED",
        "v4-16",
        2,
        "spot",
    )
    assert "There is no more capacity in the zone" in d["reason"]
    table = cli(["pods", *zones], **e)
    assert "no record here" in table.stdout
    dry = cli(["gc", "--dry-run", *zones], **e)
    assert dry.returncode == 0, dry.stderr
    assert f"would delete elsewhere in {STARVED_ZONE}: FAILED: There is no more" in dry.stderr
    assert "alive" not in dry.stderr
    assert set(cloud.tpu.resources) == {"alive", "elsewhere", "foreign"}
    res = cli(["gc", *zones], **e)
    assert res.returncode == 0, res.stderr
    assert f"deleted elsewhere in {STARVED_ZONE}: FAILED" in res.stderr
    wait_for(lambda: "elsewhere" not in cloud.tpu.resources, timeout=10, what="the delete")
    assert set(cloud.tpu.resources) == {"alive", "foreign"}
    deletes = [r.name for r in cloud.tpu.requests if r.method == "DELETE"]
    assert deletes == ["elsewhere"]
    bad = cli(["pods", "--zones", "nowhere"], **e)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.count("\n") == 1, bad.stderr


def test_autodown_after_a_simulated_reboot(cloud: Cloud, tmp_path: Path) -> None:
    """A reboot as the worker sees it: every process of the pod's user killed (the daemon's
    lock, an flock, goes with it), the state in ~/.multihost/autodown kept (a persistent disk),
    then the very command that arming wrote for the @reboot entry run on worker 0. The daemon
    is back, its idle timer starts at the reboot (an idle time carried over would fire at
    once), and it deletes the pod once idle. This host has no crontab: that the entry is in
    crontab, and that cron runs it at boot, is not exercised here."""
    cloud.tpu.vm_image = True  # workers: gcloud and the metadata server from an SSH session
    e = env(cloud, tmp_path)
    config = ssh_config(cloud.fleet, tmp_path)
    idle = 20
    res = cli([*up_args("boot", config, "--zone", ZONE, "--autodown", str(idle))], **e)
    assert res.returncode == 0, res.stderr
    assert f"pod boot deletes itself once idle for {idle} s (watched on s0/w0)" in res.stderr
    assert "s0/w0 has no crontab: after a reboot the pod is not watched" in res.stderr
    worker0 = cloud.fleet.hosts[cloud.tpu.resources["boot"].workers[0].host]
    state = worker0.home / ".multihost" / "autodown"

    def daemons() -> list[int]:
        return [p for p, c in cloud.fleet.user_processes(worker0.index) if "autodown.sh" in c]

    def locked() -> bool:
        """A daemon runs: it holds its lock (an flock, at most one per host)."""
        with (state / "lock").open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    wait_for(
        lambda: locked() and (state / "status").exists(), timeout=30, what="the daemon to start"
    )
    reboot_line = (state / "reboot").read_text().strip()
    assert reboot_line.startswith(f"sh '{state}/autodown.sh' '{state}' ")
    # the reboot: every process gone; the pod had been idle long before it
    cloud.fleet.kill_user_processes()
    wait_for(lambda: not daemons() and not locked(), timeout=10, what="the daemon to be gone")
    (state / "since").write_text(f"{int(time.time()) - 1000}\n")
    rebooted = int(time.time())
    before = (state / "status").read_text()  # the killed daemon's last word
    boot = subprocess.run(
        [
            "ssh",
            "-F",
            str(cloud.fleet.ssh_config),
            worker0.alias,
            'setsid sh -c "$(cat .multihost/autodown/reboot)" </dev/null >/dev/null 2>&1 &',
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert boot.returncode == 0, boot.stderr

    def since() -> int:
        """When the daemon's idle time began, from its status ("idle NOW since T", or
        "deleted NOW idle since T" once it has deleted the pod); 0 while it says neither."""
        words = (state / "status").read_text().split()
        return int(words[words.index("since") + 1]) if "since" in words[:-1] else 0

    def back() -> bool:
        text = (state / "status").read_text()
        return text != before and text.split()[:1] == ["idle"]

    wait_for(
        lambda: back() and since() >= rebooted,
        timeout=30,
        what="the daemon back, idle since the reboot",
    )
    assert locked()
    assert daemons()
    private = [p.name for p in state.iterdir() if p.stat().st_mode & 0o077]
    assert private == []  # no umask from the arm now: the daemon sets its own
    # not deleted on the idle time from before the reboot: the delete below comes a whole idle
    # time after the reboot (asserted from the daemon's own log, not by racing its timer)
    wait_for(lambda: "boot" not in cloud.tpu.resources, timeout=90, what="the pod to go")
    # the daemon's last look before its delete (deleting the pod ends the daemon with it)
    began = since()
    assert began >= rebooted
    line = [x for x in (state / "log").read_text().splitlines() if " idle: deleting " in x][-1]
    deleting = calendar.timegm(time.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%SZ"))
    assert deleting - began >= idle  # a whole idle time counted from the reboot
    deletes = [r for r in cloud.tpu.requests if r.method == "DELETE"]
    assert [r.name for r in deletes] == ["boot"]
    assert deletes[0].auth.startswith("Bearer ya29.vm-boot-")  # from the VM itself
