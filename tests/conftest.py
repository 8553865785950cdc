"""Shared fixtures: the real OpenSSH loopback fleet (the machinery lives in tests/fleet.py)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from tests import fleet as loopback
from tests import gcloud_zygote
from tests.helpers import JAX_TEST_ENV

pytest_plugins = ["tests.cloud.fixture"]


_SCRATCH: list[Path] = []
_ZYGOTE = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    """The developer's own ~/.config/multihost/config.toml must not change what the CLI tests
    see: every test (and every CLI it starts) reads an empty user config dir unless it sets
    one; it is removed when the session ends. JAX runs on the CPU, compiled cheaply."""
    import tempfile

    _watch_mkdir()
    scratch = Path(tempfile.mkdtemp(prefix="multihost-test-xdg-"))
    _SCRATCH.append(scratch)
    os.environ["XDG_CONFIG_HOME"] = str(scratch)
    for key, value in JAX_TEST_ENV.items():  # every local JAX process inherits them
        os.environ.setdefault(key, value)
    _gcloud_zygote(scratch)
    if not hasattr(config, "workerinput"):  # once, before any worker starts
        _compile_sources()


def _compile_sources() -> None:
    """The clone's own modules compiled once: each Python the tests start (hundreds of CLIs,
    every --local host) then reads bytecode, even where PYTHONDONTWRITEBYTECODE keeps it
    from writing any (as on the machine CI runs on)."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for name in ("multihost", "payloads", "tests"):
        compileall.compile_dir(root / name, quiet=1)


def _gcloud_zygote(scratch: Path) -> None:
    """The runner's gcloud (this process's and every CLI's it starts) is the real Cloud SDK
    imported once and forked per command (tests/gcloud_zygote.py): about a fifth of a plain
    gcloud's CPU. ``MULTIHOST_TEST_GCLOUD_ZYGOTE=0``: plain gcloud. As root, the stand-in
    cloud's VMs (the fleet's hosts) reach it too, each call served as its host's user."""
    import tempfile

    os.environ.pop(gcloud_zygote.SOCKET_ENV, None)
    os.environ.pop(gcloud_zygote.VM_DIR_ENV, None)
    if os.environ.get(gcloud_zygote.OFF_ENV) == "0" or not shutil.which("gcloud"):
        return
    vm_dir = None
    if os.geteuid() == 0:
        vm_dir = Path(tempfile.mkdtemp(prefix="multihost-gcloud-vm-"))
        _SCRATCH.append(vm_dir)
    sock = _ZYGOTE.enter_context(gcloud_zygote.running(scratch, vm_dir))
    os.environ[gcloud_zygote.SOCKET_ENV] = str(sock)
    if vm_dir is not None:
        os.environ[gcloud_zygote.VM_DIR_ENV] = str(vm_dir)
    path = os.environ.get("PATH", "").split(os.pathsep)
    shim = str(gcloud_zygote.BIN_DIR)
    os.environ["PATH"] = os.pathsep.join([shim, *(p for p in path if p != shim)])


def pytest_unconfigure(config: pytest.Config) -> None:
    _ZYGOTE.close()
    for scratch in _SCRATCH:
        shutil.rmtree(scratch, ignore_errors=True)


# -- what a session leaves ----------------------------------------------------------------------
# The README's "Run the tests" says what stays after a session; this holds a session to it. A
# directory this process makes named multihost-* at the top of /tmp, /var/tmp or /opt is seen
# as it is made (an audit hook on os.mkdir); at the end, one still there that is not in STAYS,
# a multihost-* entry in /tmp or /var/tmp that the fleet's users did not own at the start (the
# stand-in VMs' scratch, a job's work dir: made over SSH, by other processes), or a Unix user of
# the tests' prefix that is no fleet's (the sandbox's) is listed, and the session fails.
_TOPS = {"/tmp", "/var/tmp", "/opt"}
_MADE: list[str] = []
_AT_START: dict[str, set[str]] = {}
_LEFT: list[str] = []


def _stays() -> set[Path]:
    """What a session may leave: the fleet's dir and users' lock, the test sites under /opt."""
    return {loopback.DEFAULT_DIR.resolve(), loopback.USERS_LOCK, *loopback.PURGED, *_SCRATCH}


def _watch_mkdir() -> None:
    def hook(event: str, args: tuple[object, ...]) -> None:
        if event != "os.mkdir":
            return
        try:  # an audit hook's error would fail the mkdir it watches
            path = os.path.abspath(os.fsdecode(args[0]))  # type: ignore[arg-type]
            head, name = os.path.split(path)
            if head in _TOPS and name.startswith("multihost-") and not os.path.exists(path):
                _MADE.append(path)
        except Exception:
            pass

    if not getattr(sys, "_multihost_mkdir_hook", False):  # once per process
        sys.addaudithook(hook)
        sys._multihost_mkdir_hook = True  # type: ignore[attr-defined]


def _fleet_users() -> list[str]:
    return [loopback.user(i) for i in range(int(os.environ.get("MULTIHOST_TEST_HOSTS", "8")))]


def _fleet_scratch() -> set[str]:
    return {str(p) for p in loopback.scratch_of(_fleet_users()) if p.name.startswith("multihost-")}


def _users() -> set[str]:
    import pwd

    return {pw.pw_name for pw in pwd.getpwall()}


def _xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.has_plugin("dsession")


def pytest_sessionstart(session: pytest.Session) -> None:
    _AT_START["users"] = _users()
    _AT_START["scratch"] = _fleet_scratch()


def _left() -> list[str]:
    import re

    stays = {str(p) for p in _stays()}
    left = [
        p
        for p in dict.fromkeys(_MADE)
        if os.path.lexists(p)
        and p not in stays
        # the product's own, removed when this process exits (transport/sshconfig.py)
        and not Path(p).name.startswith("multihost-sshconfig-")
    ]
    left += sorted(_fleet_scratch() - _AT_START["scratch"])
    fleets = re.compile(re.escape(loopback.USER_PREFIX) + r"(\d+x)?\d+")
    left += [
        f"Unix user {name}"
        for name in sorted(_users() - _AT_START["users"])
        if name.startswith(loopback.USER_PREFIX) and not fleets.fullmatch(name)
    ]
    return left


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if not _xdist_controller(config):
        _LEFT.extend(_left())
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its controller says it
        config.workeroutput["left"] = list(_LEFT)
        return
    if _LEFT and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist's controller: what a worker's session left."""
    _LEFT.extend(getattr(node, "workeroutput", {}).get("left", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LEFT:
        terminalreporter.section("left behind by this session (not in the README's list)", "!")
        for what in _LEFT:
            terminalreporter.line(what)


def _install_sshd() -> str | None:
    """As root on a Debian/Ubuntu machine without sshd, install openssh-server (what .ci/run
    does), so that ``python -m pytest`` alone runs the SSH tier; the reason when it cannot."""
    if os.access(loopback.SSHD, os.X_OK) or os.geteuid() != 0 or not shutil.which("apt-get"):
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
    ):
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            return f"{' '.join(cmd[:2])} failed: {done.stderr.strip()[-300:]}"
    return None


def _unavailable() -> str | None:
    """Why this machine cannot run the fleet, or None."""
    failed = _install_sshd()
    if not os.access(loopback.SSHD, os.X_OK):
        why = f": {failed}" if failed else ""
        return f"{loopback.SSHD} missing (apt-get install openssh-server){why}"
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


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME (no XDG_CACHE_HOME): ``--local`` workers keep their runs under it, and
    nothing leaks between tests. A test module may define its own."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return h


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """A fresh code dir to stage: ``tmp_path/code`` holding one small file, ``x.txt``. A module
    whose jobs need files of their own asks for this fixture in its own ``code`` and adds them."""
    d = tmp_path / "code"
    d.mkdir()
    (d / "x.txt").write_text("staged\n")
    return d


@pytest.fixture
def fresh_runs(ssh_fleet: loopback.Fleet) -> None:
    """Run names are reused across tests (a host refuses to reuse a run directory), and a
    failed test must not leave jobs running for the next one."""
    for host in ssh_fleet.hosts:
        shutil.rmtree(host.home / ".multihost" / "runs", ignore_errors=True)
    ssh_fleet.kill_user_processes()


REMOTE_SITES = {
    Path("/opt/multihost-test-site"): (
        "jax",
        "jaxlib",
        "numpy",
        "ml_dtypes",
        "opt_einsum",
        "scipy",
    ),
    # payloads/train.py's (flax NNX + optax, and what they import), kept apart so a checkout
    # that does not know them leaves them be
    Path("/opt/multihost-test-site-flax"): (
        "flax",
        "optax",
        "msgpack",
        "PyYAML",
        "absl-py",
        "rich",
        "markdown-it-py",
        "mdurl",
        "Pygments",
        "treescope",
        "typing_extensions",
        "etils",
    ),
}


def _remote_site(site: Path, packages: tuple[str, ...]) -> None:
    """Made once for every session and test worker on this machine (one at a time)."""
    with open(site.with_name(f"{site.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _make_site(site, packages)


def _make_site(site: Path, packages: tuple[str, ...]) -> None:
    pins = [f"{name}=={metadata.version(name)}" for name in packages]
    stamp = site / ".multihost-pins"
    if not stamp.is_file() or stamp.read_text() != "\n".join(pins):
        shutil.rmtree(site, ignore_errors=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(site),
                *pins,
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        stamp.write_text("\n".join(pins))
    for path in (site, *site.rglob("*")):
        path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))


@pytest.fixture(scope="session")
def remote_jax(ssh_fleet: loopback.Fleet) -> dict[str, str]:
    """Env that lets the fleet's users run JAX payloads: the system python3 plus a world-readable
    copy of this interpreter's JAX (and flax) packages (this Python may live under a private
    /root)."""
    for site, packages in REMOTE_SITES.items():
        _remote_site(site, packages)
    return {
        "PYTHONPATH": ":".join(map(str, REMOTE_SITES)),
        "PYTHON": "/usr/bin/python3",
        "XLA_FLAGS": JAX_TEST_ENV["XLA_FLAGS"],  # for --env: the hosts do not get this session's
    }


def _tier(item: pytest.Item) -> int:
    """0: pure and local pipeline (no root, seconds); 1: the sshd fleet; 2: real JAX."""
    if item.get_closest_marker("jax"):
        return 2
    return 1 if item.get_closest_marker("ssh") else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the fleet (directly or through another fixture) ``ssh``, and
    run the fast tier first: a break there shows in seconds, before the slow tiers start."""
    for item in items:
        if "ssh_fleet" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ssh)
    items.sort(key=_tier)
