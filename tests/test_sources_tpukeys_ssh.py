"""First contact with TPU VMs: the user's key accepted, as gcloud does, on the real sshd fleet.

A fresh HOME (no ``~/.ssh/google_compute_engine``) and hosts that do not know it: ``run
--prefix`` creates the key, adds it to the node's metadata through the real gcloud CLI (merged:
every other key survives), waits for the stand-in's guest agent to install it, and runs. A
second run pushes nothing; ``--no-add-key`` never touches metadata; OS Login puts the key in the
profile and logs in as its POSIX user.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import fleet as loopback
from tests.clitools import cli
from tests.cloud.fixture import ZONE, Cloud
from tests.helpers import wait_for

pytestmark = pytest.mark.usefixtures("fresh_runs")

EXPIRY = 'google-ssh {"userName":"a@b.c","expireOn":"2030-01-01T00:00:00+0000"}'
OTHER = (
    f"other:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOtherKeyOtherKeyOtherKeyOther1 {EXPIRY}"
)


def ssh_config(fleet: loopback.Fleet, tmp_path: Path, users: bool = True) -> Path:
    """Host blocks for the workers' addresses, with no identity: only gcloud's key is tried."""
    lines = []
    for h in fleet.hosts:
        lines += [f"Host 127.0.0.{2 + h.index}", f"  Port {h.port}"]
        lines += [f"  User {h.user}"] if users else []
    path = tmp_path / "ssh_config"
    path.write_text("\n".join(lines) + "\n")
    return path


def multihost(
    cloud: Cloud, tmp_path: Path, home: Path, *args: str, cmd: str = "echo hi", **env_: str
) -> subprocess.CompletedProcess[str]:
    home.mkdir(exist_ok=True)
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    env = cloud.env | {
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "CLOUDSDK_CORE_ACCOUNT": "me@example.com",
        "COLUMNS": "300",
    }
    env |= env_
    argv = [
        sys.executable,
        "-m",
        "multihost",
        "run",
        "--prefix",
        "myqr",
        "--zone",
        ZONE,
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        *args,
        "--cmd",
        cmd,
    ]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def patches(cloud: Cloud) -> int:
    return len(cloud.requests("PATCH"))


def test_first_contact_adds_the_key_once_and_keeps_the_metadata(
    cloud: Cloud, tmp_path: Path
) -> None:
    cloud.tpu.add("myqr", "v4-16")
    qr = cloud.tpu.wait_state("myqr", "ACTIVE")
    kept = {"startup-script": "#!/bin/sh\necho up", "team": "a,b", "ssh-keys": OTHER}
    qr.metadata[0] = dict(kept)
    config = str(ssh_config(cloud.fleet, tmp_path))
    home = tmp_path / "home"
    res = multihost(cloud, tmp_path, home, "--ssh-config", config, "--run-name", "k1")
    assert res.returncode == 0, res.stderr
    assert (home / ".ssh" / "google_compute_engine").is_file()
    assert "adding your key to 1 node…" in res.stderr
    assert "accepted by 2/2 workers in" in res.stderr
    users = [cloud.fleet.hosts[w.host].user for w in qr.workers]
    assert f"was added to the metadata of myqr for {', '.join(users)}" in res.stderr
    assert patches(cloud) == 1
    meta = qr.metadata[0]
    for key in ("startup-script", "team"):
        assert meta[key] == kept[key]  # the CLI merged: nothing else replaced
    pub = " ".join((home / ".ssh" / "google_compute_engine.pub").read_text().split()[:2])
    lines = meta["ssh-keys"].split("\n")
    assert lines[0] == OTHER  # the comma-holding line survived whole (gcloud's ^DELIM^)
    # one line per user the workers are logged into (the ssh config's User), not the local one
    assert lines[1:] == [f"{u}:{pub} {u}" for u in users]
    # a second run pushes nothing and says nothing about keys
    res = multihost(cloud, tmp_path, home, "--ssh-config", config, "--run-name", "k2")
    assert res.returncode == 0, res.stderr
    assert "key" not in res.stderr
    assert patches(cloud) == 1
    # --no-add-key: another user's fresh HOME is refused, metadata untouched
    res = multihost(
        cloud,
        tmp_path,
        tmp_path / "home2",
        "--ssh-config",
        config,
        "--run-name",
        "k3",
        "--no-add-key",
        "--connect-timeout",
        "5",
    )
    assert res.returncode != 0
    assert "authentication failed" in res.stderr
    assert patches(cloud) == 1


def test_oslogin_key_goes_to_the_profile(cloud: Cloud, tmp_path: Path) -> None:
    user = cloud.fleet.hosts[0].user
    cloud.tpu.oslogin_profile = {
        "name": "me@example.com",
        "posixAccounts": [{"primary": True, "username": user, "uid": "1001"}],
    }
    cloud.tpu.project_metadata["enable-oslogin"] = "TRUE"  # the project's, not the node's
    cloud.tpu.add("myqr", "v4-8")
    cloud.tpu.wait_state("myqr", "ACTIVE")
    config = str(ssh_config(cloud.fleet, tmp_path, users=False))
    home = tmp_path / "home"
    res = multihost(cloud, tmp_path, home, "--ssh-config", config, "--run-name", "o1")
    assert res.returncode == 0, res.stderr
    assert f"OS Login: your key is in your profile; logging in as {user}" in res.stderr
    assert patches(cloud) == 0  # nothing in any node's metadata
    pub = (home / ".ssh" / "google_compute_engine.pub").read_text().split()
    keys = cloud.tpu.oslogin_profile["sshPublicKeys"].values()
    assert [k["key"].split()[:2] for k in keys] == [pub[:2]]


def test_host_keys_pinned_from_guest_attributes(cloud: Cloud, tmp_path: Path) -> None:
    """A worker whose key differs from its published one is refused, named, with both
    fingerprints, and nothing starts on any host; a node publishing none is TOFU, said."""
    cloud.tpu.add("myqr", "v4-16")
    qr = cloud.tpu.wait_state("myqr", "ACTIVE")
    bad = qr.workers[1].host
    cloud.tpu.wrong_host_keys.add(bad)
    config = str(ssh_config(cloud.fleet, tmp_path))
    home = tmp_path / "home"
    marks = [Path(f"/tmp/mh-pin-{h.alias}") for h in cloud.fleet.hosts]
    for m in marks:
        m.unlink(missing_ok=True)
    argv = ["--ssh-config", config, "--no-add-key", "--run-name", "p1"]
    cmd = "touch /tmp/mh-pin-$MULTIHOST_TEST_HOST; exec sleep 30"
    env_home = home / ".ssh"
    env_home.mkdir(parents=True)
    key = env_home / "google_compute_engine"  # the fleet's key: only host keys are at stake
    key.write_bytes(cloud.fleet.key.read_bytes())
    key.chmod(0o600)
    res = multihost(cloud, tmp_path, home, *argv, cmd=cmd)
    assert res.returncode != 0
    assert "s0/w1" in res.stderr
    assert "host key differs from the one its TPU node publishes" in res.stderr
    assert res.stderr.count("SHA256:") >= 2  # expected and presented
    assert not [m for m in marks if m.exists()]  # nothing started on any host
    for h in (w.host for w in qr.workers):
        assert not [p for p in cloud.fleet.user_processes(h) if "sleep" in p[1]]
    # the right keys: pinned, accepted, and recorded in multihost's own known-hosts file in
    # place of what was there (the wrong key published a run ago), for attach/status/kill
    cloud.tpu.wrong_host_keys.clear()
    res = multihost(
        cloud, tmp_path, home, "--ssh-config", config, "--no-add-key", "--run-name", "p2"
    )
    assert res.returncode == 0, res.stderr
    assert "trusting" not in res.stderr
    trust = home / "state" / "multihost" / "known_hosts"
    recorded = [line.split() for line in trust.read_text().splitlines()]
    names = [r[0] for r in recorded]
    assert len(names) == len(set(names)) >= len(qr.workers)  # one key per worker: replaced
    assert oct(trust.stat().st_mode & 0o777) == "0o600"
    status = cli(
        ["status", "p2", "--log-dir", str(tmp_path / "logs"), "--refresh"],
        HOME=str(home),
        XDG_STATE_HOME=str(home / "state"),
    )
    assert "host key" not in status.stderr, status.stderr
    # a node that publishes none: trust on first use, said
    cloud.tpu.no_host_keys.add("myqr")
    res = multihost(
        cloud, tmp_path, home, "--ssh-config", config, "--no-add-key", "--run-name", "p3"
    )
    assert res.returncode == 0, res.stderr
    assert "myqr publishes no host keys" in res.stderr
    assert "trusting their workers' keys on first use" in res.stderr


def test_hosts_check_adds_the_key_and_hosts_alone_does_not(cloud: Cloud, tmp_path: Path) -> None:
    cloud.tpu.add("myqr", "v4-8")
    cloud.tpu.wait_state("myqr", "ACTIVE")
    config = str(ssh_config(cloud.fleet, tmp_path))
    home = tmp_path / "home"
    home.mkdir()
    env = cloud.env | {"HOME": str(home), "XDG_STATE_HOME": str(home / "state")}
    base = [
        sys.executable,
        "-m",
        "multihost",
        "hosts",
        "--prefix",
        "myqr",
        "--zone",
        ZONE,
        "--ssh-config",
        config,
        "--json",
    ]
    listed = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert patches(cloud) == 0  # listing logs in nowhere: no key made, none pushed
    assert not (home / ".ssh").exists()
    checked = subprocess.run(
        [*base, "--check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stderr
    assert "accepted by 1/1 workers" in checked.stderr
    assert patches(cloud) == 1


def test_user_flag_names_the_line_and_the_login(cloud: Cloud, tmp_path: Path) -> None:
    """``--user``: the line is for that user (an ssh config that names none, a local user
    that is not it), and the worker is logged into as that user."""
    cloud.tpu.add("myqr", "v4-8")
    qr = cloud.tpu.wait_state("myqr", "ACTIVE")
    user = cloud.fleet.hosts[qr.workers[0].host].user
    config = str(ssh_config(cloud.fleet, tmp_path, users=False))
    home = tmp_path / "home"
    res = multihost(
        cloud,
        tmp_path,
        home,
        "--ssh-config",
        config,
        "--user",
        user,
        "--run-name",
        "u1",
        cmd="id -un",
    )
    assert res.returncode == 0, res.stderr
    assert f"was added to the metadata of myqr for {user}" in res.stderr
    assert res.stdout.split()[-1] == user
    assert [ln.split(":", 1)[0] for ln in qr.metadata[0]["ssh-keys"].split("\n")] == [user]


def test_key_still_refused_when_the_wait_ends(
    cloud: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers' guest agent never installs the key: when the wait ends the run stops
    before anything starts, naming the hosts and the cause, and counts no worker as accepted."""
    monkeypatch.setattr(cloud.tpu, "guest_agent", lambda workers, keys: None)
    cloud.tpu.add("myqr", "v4-16")
    qr = cloud.tpu.wait_state("myqr", "ACTIVE")
    config = str(ssh_config(cloud.fleet, tmp_path))
    home = tmp_path / "home"
    marks = [Path(f"/tmp/mh-refused-{h.alias}") for h in cloud.fleet.hosts]
    for m in marks:
        m.unlink(missing_ok=True)
    res = multihost(
        cloud,
        tmp_path,
        home,
        "--ssh-config",
        config,
        "--run-name",
        "r1",
        cmd="touch /tmp/mh-refused-$MULTIHOST_TEST_HOST",
        MULTIHOST_KEY_WAIT="3",
    )
    assert res.returncode == 1, res.stderr
    assert "accepted by 0/2 workers" in res.stderr
    users = [cloud.fleet.hosts[w.host].user for w in qr.workers]
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("multihost: your key is still refused after 3 s by "), error
    for w, user in zip(qr.workers, users, strict=True):
        assert f"s0/w{w.worker} ({user}@127.0.0.{2 + w.host})" in error
    assert "authentication failed" in error
    assert f"added to the metadata of myqr for {', '.join(users)}" in error
    assert "guest agent has not installed it" in error
    assert "nothing started" in error
    assert "Traceback" not in res.stderr
    assert not [m for m in marks if m.exists()]  # nothing launched
    assert not (tmp_path / "logs" / "r1").exists()
    for w in qr.workers:
        runs = cloud.fleet.hosts[w.host].home / ".multihost" / "runs"
        assert not runs.exists() or not any(runs.iterdir())


def test_internal_only_workers_are_said_at_once(cloud: Cloud, tmp_path: Path) -> None:
    """Workers with internal addresses only, no --tunnel-through-iap, a key just added: while
    the (long) wait for the key goes on, they are named at once with how to reach them."""
    cloud.tpu.add("myqr", "v4-16", internal_only=True)
    qr = cloud.tpu.wait_state("myqr", "ACTIVE")
    config = tmp_path / "ssh_config"
    config.write_text(
        "".join(
            f"Host 127.1.0.{2 + w.host}\n  User {cloud.fleet.hosts[w.host].user}"
            f"\n  Port {cloud.fleet.hosts[w.host].port}\n"
            for w in qr.workers
        )
    )
    home = tmp_path / "home"
    home.mkdir()
    code = tmp_path / "code"
    code.mkdir()
    env = cloud.env | {
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "MULTIHOST_KEY_WAIT": "600",
        "COLUMNS": "300",
    }
    argv = [
        sys.executable,
        "-m",
        "multihost",
        "run",
        "--prefix",
        "myqr",
        "--zone",
        ZONE,
        "--ssh-config",
        str(config),
        "--script-dir",
        str(code),
        "--log-dir",
        str(tmp_path / "logs"),
        "--run-name",
        "i1",
        "--cmd",
        "true",
    ]
    err = tmp_path / "err"
    with err.open("w") as f:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=f)
    try:
        wait_for(
            lambda: "do not answer" in err.read_text(),
            timeout=60,
            what="the internal-only addresses said",
        )
        assert proc.poll() is None  # said while still waiting
    finally:
        proc.kill()
        proc.wait()
    said = next(ln for ln in err.read_text().splitlines() if "do not answer" in ln)
    assert said.startswith("multihost: s0/w0-1 (127.1.0.2, 127.1.0.3) do not answer; "), said
    assert "only an internal address" in said
    assert "--tunnel-through-iap" in said
    assert "still waiting, up to 600 s" in said


def test_dry_run_makes_no_first_contact(cloud: Cloud, tmp_path: Path) -> None:
    """``run --dry-run`` on a fresh HOME: the plan printed from discovery alone; no key made
    or pushed, no project metadata, no guest attributes read, nothing connected to."""
    cloud.tpu.add("myqr", "v4-16")
    cloud.tpu.wait_state("myqr", "ACTIVE")
    cloud.tpu.requests.clear()
    config = str(ssh_config(cloud.fleet, tmp_path))
    home = tmp_path / "home"
    res = multihost(cloud, tmp_path, home, "--ssh-config", config, "--run-name", "d1", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "### s0/w1 (127.0.0.3)" in res.stdout
    assert cloud.requests() == [("GET", f"/v2/projects/p/locations/{ZONE}/nodes")]
    assert not (home / ".ssh").exists()
    assert res.stderr == ""
