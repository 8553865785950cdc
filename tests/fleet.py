"""A real OpenSSH test fleet on loopback: one sshd and one Unix user per host.

Host ``i`` is alias ``h{i}``: sshd on ``127.0.0.{2+i}:2222`` (hosts 250 and up on
``127.0.{1+k//250}.{2+k%250}``, ``k = i - 250``), user ``mhw{i}``, its own host key, and
``MULTIHOST_TEST_HOST=h{i}`` in every session. Every host takes the fleet's client key
(``authorized_keys``) and, for its user only, the keys in ``guest_keys/<user>`` (where the
cloud stand-in's guest agent installs a TPU node's ``ssh-keys``). Two extra aliases exist for
failure tests: ``dead`` (nothing listens) and ``badkey`` (h0 with a wrong known_hosts entry).

Library: ``up(n)``, ``down()``, ``load()``, ``stop_host(i)``, ``start_host(i)``,
``user_processes(i)``, ``home(i)``, ``signal_host(i, sig)`` (freeze/thaw).
CLI: ``python tests/fleet.py up N | down | status``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("MULTIHOST_FLEET_DIR", "/tmp/multihost-fleet"))
SSHD = "/usr/sbin/sshd"
# Several fleets can run side by side (one per checkout being worked on): each its own dir,
# port and user names.
PORT = int(os.environ.get("MULTIHOST_FLEET_PORT", "2222"))
USER_PREFIX = os.environ.get("MULTIHOST_FLEET_USER", "mhw")
# Under pytest-xdist each worker process has a fleet of its own (a test kills every process of
# its fleet's users): the dir, port and user names above, told apart by the worker's number.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if re.fullmatch(r"gw\d+", _WORKER):
    DEFAULT_DIR = DEFAULT_DIR.with_name(f"{DEFAULT_DIR.name}-{_WORKER}")
    PORT += 1000 * (int(_WORKER[2:]) + 1)
    USER_PREFIX = f"{USER_PREFIX}{_WORKER[2:]}x"
MAX_HOSTS = 1000
PER_OCTET = 250  # hosts per /24 of 127.0.0.0/8 (.2 to .251)
DEAD_ADDRESS = "127.0.0.254"
START_TIMEOUT = 15.0
_START_FAILED = re.compile(r"Cannot bind|fatal|Bad configuration|terminating")
STOP_TIMEOUT = 5.0
# what the test session installs for the fleet's users (tests/conftest.py REMOTE_SITES, and
# tests/test_api_ssh.py's cloudpickle), each made under a lock file beside it
PURGED = (
    Path("/opt/multihost-test-site"),
    Path("/opt/multihost-test-site-flax"),
    Path("/opt/multihost-test-cloudpickle"),
)
USERS_LOCK = Path("/tmp/multihost-fleet-users")  # one fleet at a time adds users; it stays
# Where a host's user leaves files of its own outside its home: a job's work dir
# (/var/tmp/multihost-UID), the stand-in VMs' gcloud config, uv's lock files. A fleet taken
# down loses them, as a rebooted machine loses its /tmp.
SCRATCH = (Path("/tmp"), Path("/var/tmp"))


@dataclass(frozen=True)
class FleetHost:
    """One loopback host: its ssh alias and where it really is."""

    index: int
    alias: str
    address: str
    port: int
    user: str
    home: Path


@dataclass(frozen=True)
class Fleet:
    """A running loopback fleet and the client files that reach it."""

    dir: Path
    ssh_config: Path
    known_hosts: Path
    key: Path
    hosts: tuple[FleetHost, ...]

    @property
    def aliases(self) -> list[str]:
        """The ssh aliases of the hosts, ``h0`` … ``h{n-1}``."""
        return [h.alias for h in self.hosts]

    def head(self, n: int) -> Fleet:
        """The same fleet restricted to its first ``n`` hosts."""
        if n > len(self.hosts):
            raise ValueError(f"fleet has {len(self.hosts)} hosts, asked for {n}")
        return Fleet(self.dir, self.ssh_config, self.known_hosts, self.key, self.hosts[:n])

    def stop_host(self, i: int) -> None:
        """Kill host ``i``'s sshd and its open sessions (its user's jobs keep running)."""
        stop_host(i, self.dir)

    def start_host(self, i: int) -> None:
        """Start host ``i``'s sshd again."""
        start_host(i, self.dir)

    def freeze_host(self, i: int) -> None:
        """SIGSTOP host ``i``'s sshd and its sessions: a host that hangs (its jobs run on)."""
        signal_host(i, signal.SIGSTOP, self.dir)

    def thaw_host(self, i: int) -> None:
        """SIGCONT what ``freeze_host`` stopped."""
        signal_host(i, signal.SIGCONT, self.dir)

    def user_processes(self, i: int) -> list[tuple[int, str]]:
        """Live (pid, cmdline) of host ``i``'s user, sshd session processes left out."""
        return user_processes(i)

    def kill_user_processes(self, indices: Sequence[int] | None = None) -> None:
        """SIGKILL everything the given hosts' users run (default: every host)."""
        kill_user_processes([h.index for h in self.hosts] if indices is None else indices)

    def to_json(self) -> str:
        """Serialise for ``fleet.json``."""
        data = asdict(self)
        return json.dumps(data, default=str, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Fleet:
        """Parse what ``to_json`` wrote."""
        d = json.loads(text)
        hosts = tuple(FleetHost(**{**h, "home": Path(h["home"])}) for h in d["hosts"])
        return cls(
            Path(d["dir"]), Path(d["ssh_config"]), Path(d["known_hosts"]), Path(d["key"]), hosts
        )


# ---------------------------------------------------------------- naming


def alias(i: int) -> str:
    """Ssh alias of host ``i``."""
    return f"h{i}"


def user(i: int) -> str:
    """Unix user of host ``i``."""
    return f"{USER_PREFIX}{i}"


def address(i: int) -> str:
    """Loopback address sshd of host ``i`` listens on: ``127.0.0.{2+i}`` for the first 250
    (unchanged for the hosts other tests use), then ``127.0.1.2`` … and so on."""
    return f"127.0.{i // PER_OCTET}.{2 + i % PER_OCTET}"


def home(i: int) -> Path:
    """Home directory of host ``i``'s user."""
    try:
        return Path(pwd.getpwnam(user(i)).pw_dir)
    except KeyError:
        return Path("/home") / user(i)


def _host_dir(d: Path, i: int) -> Path:
    return d / "hosts" / alias(i)


def _pidfile(d: Path, i: int) -> Path:
    return _host_dir(d, i) / "sshd.pid"


def _describe(d: Path, n: int) -> Fleet:
    hosts = tuple(FleetHost(i, alias(i), address(i), PORT, user(i), home(i)) for i in range(n))
    return Fleet(d, d / "ssh_config", d / "known_hosts", d / "client_key", hosts)


# ---------------------------------------------------------------- processes


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _is_sshd(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == SSHD
    except OSError:
        return False


def _alive(pid: int) -> bool:
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _read_pid(d: Path, i: int) -> int | None:
    try:
        return int(_pidfile(d, i).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _listener(d: Path, i: int) -> int | None:
    """Pid of host ``i``'s listening sshd, if it is running."""
    pid = _read_pid(d, i)
    if pid is not None and _alive(pid) and _is_sshd(pid):
        return pid
    return None


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for pid in _all_pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            out[pid] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _uid_processes(uid: int) -> list[int]:
    out = []
    for pid in _all_pids():
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}").st_uid == uid and _alive(pid):
                out.append(pid)
    return out


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _kill(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_dead(pids: Sequence[int], timeout: float = STOP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def user_processes(i: int) -> list[tuple[int, str]]:
    """Live processes of host ``i``'s user other than sshd session processes."""
    try:
        uid = pwd.getpwnam(user(i)).pw_uid
    except KeyError:
        return []
    return [(p, _cmdline(p)) for p in _uid_processes(uid) if not _is_sshd(p)]


# ---------------------------------------------------------------- users and keys


def _ensure_user(i: int) -> None:
    name = user(i)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "-m", "-p", "*", "-s", "/bin/sh", name], check=True, capture_output=True
        )
        pw = pwd.getpwnam(name)
    h = Path(pw.pw_dir)
    if not h.is_dir():
        h.mkdir(parents=True, mode=0o750)
        os.chown(h, pw.pw_uid, pw.pw_gid)
        h.chmod(0o750)


def _unlock_users(names: set[str]) -> None:
    """Give locked accounts a ``*`` password: with ``UsePAM no`` a ``!`` account cannot log in."""
    locked = []
    for line in Path("/etc/shadow").read_text().splitlines():
        fields = line.split(":")
        if fields[0] in names and fields[1].startswith("!"):
            locked.append(fields[0])
    for name in locked:
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)


def _new_key() -> tuple[str, str]:
    """A fresh ed25519 key pair as (private OpenSSH text, public line)."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    priv = key.export_private_key("openssh").decode()
    pub = key.export_public_key("openssh").decode().strip()
    return priv, pub


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    """Atomically replace ``path`` so concurrent readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _ensure_keypair(path: Path) -> str:
    """Create ``path`` / ``path.pub`` if missing; return the public line."""
    pub = path.with_name(path.name + ".pub")
    if not (path.exists() and pub.exists()):
        priv, line = _new_key()
        _write(path, priv, 0o600)
        _write(pub, line + "\n")
    return pub.read_text().strip()


# ---------------------------------------------------------------- config files


def _sshd_version() -> tuple[int, int]:
    out = subprocess.run([SSHD, "-V"], capture_output=True, text=True).stderr
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _sftp_server() -> str:
    path = "/usr/lib/openssh/sftp-server"
    return path if os.access(path, os.X_OK) else "internal-sftp"


def _sshd_config(d: Path, i: int, extra: str) -> str:
    hd = _host_dir(d, i)
    return f"""\
ListenAddress {address(i)}:{PORT}
HostKey {hd}/host_key
PidFile {hd}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys {d}/guest_keys/%u
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
StrictModes no
AllowUsers {user(i)}
MaxStartups 200:30:1000
MaxSessions 100
SetEnv MULTIHOST_TEST_HOST={alias(i)}
AcceptEnv LANG LC_*
PermitUserEnvironment GCE_METADATA_HOST,GCE_METADATA_ROOT,CLOUDSDK_*
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp {_sftp_server()}
{extra}"""


def _client_block(name: str, addr: str, login: str, known_hosts: Path) -> str:
    return f"""\
Host {name}
  HostName {addr}
  Port {PORT}
  User {login}
  UserKnownHostsFile {known_hosts}
"""


def _ssh_config(d: Path, n: int) -> str:
    blocks = [_client_block(alias(i), address(i), user(i), d / "known_hosts") for i in range(n)]
    blocks.append(_client_block("dead", DEAD_ADDRESS, user(0), d / "known_hosts"))
    blocks.append(_client_block("badkey", address(0), user(0), d / "known_hosts_bad"))
    blocks.append(_defaults_block(d / "client_key"))
    return "\n".join(blocks)


def _defaults_block(key: Path) -> str:
    return f"""\
Host *
  IdentityFile {key}
  IdentitiesOnly yes
  StrictHostKeyChecking yes
  GlobalKnownHostsFile /dev/null
  BatchMode yes
  ConnectTimeout 10
  LogLevel ERROR
"""


def _known_hosts(d: Path, n: int) -> str:
    lines = []
    for i in range(n):
        key = (_host_dir(d, i) / "host_key.pub").read_text().split()[:2]
        lines.append(f"[{address(i)}]:{PORT} {' '.join(key)}\n")
    return "".join(lines)


def private_client(fleet: Fleet, out: Path) -> Fleet:
    """``fleet`` with its own ssh config and known_hosts written in ``out``: a benchmark on a
    big fleet keeps working while other processes rewrite the shared client files."""
    out.mkdir(parents=True, exist_ok=True)
    known = out / "known_hosts"
    lines = []
    for h in fleet.hosts:
        key = (_host_dir(fleet.dir, h.index) / "host_key.pub").read_text().split()[:2]
        lines.append(f"[{h.address}]:{h.port} {' '.join(key)}\n")
    _write(known, "".join(lines))
    blocks = [_client_block(h.alias, h.address, h.user, known) for h in fleet.hosts]
    blocks.append(_defaults_block(fleet.key))
    _write(out / "ssh_config", "\n".join(blocks))
    private = Fleet(fleet.dir, out / "ssh_config", known, fleet.key, fleet.hosts)
    _write(out / "fleet.json", private.to_json() + "\n")
    return private


def _write_client_files(d: Path, n: int) -> None:
    bad = " ".join(_ensure_keypair(d / "wrong_key").split()[:2])
    _write(d / "known_hosts_bad", f"[{address(0)}]:{PORT} {bad}\n")
    _write(d / "known_hosts", _known_hosts(d, n))
    _write(d / "ssh_config", _ssh_config(d, n))
    _write(d / "fleet.json", _describe(d, n).to_json() + "\n")


# ---------------------------------------------------------------- sshd lifecycle


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _prepare_host(d: Path, i: int, extra: str) -> bool:
    """Write host ``i``'s key and config; True if the config text changed."""
    hd = _host_dir(d, i)
    hd.mkdir(parents=True, exist_ok=True)
    _ensure_keypair(hd / "host_key")
    conf = hd / "sshd_config"
    text = _sshd_config(d, i, extra)
    if conf.exists() and conf.read_text() == text:
        return False
    _write(conf, text)
    return True


def _kill_host(d: Path, i: int) -> None:
    """Kill host ``i``'s listener and its session sshds (not the user's jobs)."""
    pid = _read_pid(d, i)
    if pid is not None and _alive(pid) and _is_sshd(pid):
        victims = [pid] + [p for p in _descendants(pid) if _is_sshd(p)]
        _kill(victims)
        _wait_dead(victims)
    _pidfile(d, i).unlink(missing_ok=True)


def _spawn(d: Path, i: int) -> tuple[subprocess.Popen[bytes], int]:
    hd = _host_dir(d, i)
    log = hd / "sshd.log"
    offset = log.stat().st_size if log.exists() else 0
    _pidfile(d, i).unlink(missing_ok=True)
    cmd = [SSHD, "-f", str(hd / "sshd_config"), "-E", str(log)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc, offset


def _log_since(d: Path, i: int, offset: int) -> str:
    try:
        with open(_host_dir(d, i) / "sshd.log", "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _start_hosts(d: Path, indices: Sequence[int]) -> None:
    """Start sshd for every index at once, then wait until each has written its pidfile."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    started = {i: _spawn(d, i) for i in indices}
    errors: dict[int, str] = {}
    for i, (proc, _) in started.items():
        _, err = proc.communicate()
        if proc.returncode != 0:
            errors[i] = err.decode(errors="replace").strip()
    pending = {i for i in indices if i not in errors}
    deadline = time.monotonic() + START_TIMEOUT
    while pending and time.monotonic() < deadline:
        for i in list(pending):
            if _listener(d, i) is not None:
                pending.discard(i)
            elif _START_FAILED.search(log := _log_since(d, i, started[i][1])):
                errors[i] = log.strip()
                pending.discard(i)
        time.sleep(0.01)
    for i in pending:
        errors[i] = f"no pidfile after {START_TIMEOUT:.0f}s: {_log_since(d, i, started[i][1])}"
    if errors:
        first = min(errors)
        detail = f"{alias(first)}: {errors[first]}"
        raise RuntimeError(f"{len(errors)} sshd(s) failed to start; {detail}")


def _known_size(d: Path) -> int:
    try:
        return len(load(d).hosts)
    except (OSError, ValueError, KeyError):
        return 0


def _check_environment() -> None:
    if os.geteuid() != 0:
        raise PermissionError("the loopback fleet needs root (useradd, one sshd per user)")
    if not os.access(SSHD, os.X_OK):
        raise FileNotFoundError(f"{SSHD} not found: apt-get install openssh-server")


def _extra_options() -> str:
    """Options only some OpenSSH versions know."""
    # 9.8+ penalises sources that fail auth or crash; every client here is 127.0.0.1.
    return "PerSourcePenalties no\n" if _sshd_version() >= (9, 8) else ""


def up(n: int, d: Path = DEFAULT_DIR) -> Fleet:
    """Make hosts ``0..n-1`` run (reusing live ones); return them as a fleet.

    The client files keep covering hosts a bigger earlier ``up`` created.
    """
    _check_environment()
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"fleet size must be 1..{MAX_HOSTS}, not {n}")
    if re.search(r"\s", str(d)):
        raise ValueError(f"fleet dir must not contain whitespace: {d}")
    d = d.resolve()
    with _locked(d):
        size = max(n, _known_size(d))
        _ensure_users(n)
        client_pub = _ensure_keypair(d / "client_key")
        _write(d / "authorized_keys", client_pub + "\n")
        extra = _extra_options()
        to_start = []
        for i in range(n):
            changed = _prepare_host(d, i, extra)
            if changed or _listener(d, i) is None:
                _kill_host(d, i)
                to_start.append(i)
        _start_hosts(d, to_start)
        _write_client_files(d, size)
    return _describe(d, n)


def _ensure_users(n: int) -> None:
    # useradd refuses to run while another holds /etc/passwd: one fleet at a time adds users
    with _locked(USERS_LOCK):
        for i in range(n):
            _ensure_user(i)
        _unlock_users({user(i) for i in range(n)})


def load(d: Path = DEFAULT_DIR) -> Fleet:
    """The fleet described by ``fleet.json`` in ``d`` (running or not)."""
    return Fleet.from_json((d / "fleet.json").read_text())


def running(d: Path = DEFAULT_DIR) -> list[int]:
    """Indices of hosts whose sshd is running."""
    return [i for i in _host_indices(d) if _listener(d, i) is not None]


def _host_indices(d: Path) -> list[int]:
    hosts = d / "hosts"
    if not hosts.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in hosts.iterdir() if re.fullmatch(r"h\d+", p.name))


def down(d: Path = DEFAULT_DIR, purge: bool = False) -> None:
    """Stop every sshd of the fleet, kill whatever the fleet's users still run and remove what
    they left in /tmp and /var/tmp; ``purge``: the users too, the test sites and the dir."""
    d = d.resolve()
    if not d.exists():
        return
    with _locked(d):
        indices = _host_indices(d)
        for i in indices:
            _kill_host(d, i)
        kill_user_processes(indices)
        remove_scratch([user(i) for i in indices])
        if purge:
            shutil.rmtree(d / "hosts", ignore_errors=True)
            (d / "fleet.json").unlink(missing_ok=True)
    if purge:  # everything the tests set up: the users and their homes, the test sites
        remove_users([user(i) for i in indices])
        for site in PURGED:
            shutil.rmtree(site, ignore_errors=True)
            site.with_name(f"{site.name}.lock").unlink(missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)


def _uids(names: Sequence[str]) -> set[int]:
    uids = set()
    for name in names:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    return uids


def scratch_of(names: Sequence[str]) -> list[Path]:
    """What the given users own at the top of /tmp and /var/tmp."""
    uids = _uids(names)
    found = []
    for base in SCRATCH:
        with contextlib.suppress(OSError):
            for entry in base.iterdir():
                with contextlib.suppress(OSError):
                    if entry.lstat().st_uid in uids:
                        found.append(entry)
    return sorted(found)


def remove_scratch(names: Sequence[str]) -> None:
    """Remove what the given users own at the top of /tmp and /var/tmp (see ``SCRATCH``)."""
    for entry in scratch_of(names):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def remove_users(names: Sequence[str]) -> None:
    """Delete the given users: their processes killed, their scratch, homes and accounts."""
    _kill_owned(_uids(names))
    remove_scratch(names)
    with _locked(USERS_LOCK):  # userdel, as useradd, refuses while another holds /etc/passwd
        for name in names:
            subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


def kill_user_processes(indices: Sequence[int]) -> None:
    """SIGKILL every process owned by the given hosts' users."""
    _kill_owned(_uids([user(i) for i in indices]))


def _kill_owned(uids: set[int]) -> None:
    for _ in range(20):
        victims = [p for p in _all_pids() if _owner(p) in uids and _alive(p)]
        if not victims:
            return
        _kill(victims)
        _wait_dead(victims, 1.0)


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def stop_host(i: int, d: Path = DEFAULT_DIR) -> None:
    """Kill host ``i``'s sshd and its open sessions, as if the host dropped off the network."""
    d = d.resolve()
    with _locked(d):
        _kill_host(d, i)


def signal_host(i: int, sig: int, d: Path = DEFAULT_DIR) -> None:
    """Send ``sig`` to host ``i``'s listening sshd and every process under it (its sessions
    and what they run; detached jobs are not under it)."""
    d = d.resolve()
    with _locked(d):
        root = _listener(d, i)
        if root is None:
            raise RuntimeError(f"host {i} has no running sshd")
        _kill([root, *_descendants(root)], sig)


def start_host(i: int, d: Path = DEFAULT_DIR) -> None:
    """Start host ``i``'s sshd again (same key and config); no-op if it is running."""
    d = d.resolve()
    with _locked(d):
        if _listener(d, i) is None:
            _start_hosts(d, [i])


# ---------------------------------------------------------------- CLI


def _status(d: Path) -> int:
    indices = _host_indices(d)
    alive = running(d)
    print(f"fleet dir {d}: {len(alive)}/{len(indices)} hosts running")
    if alive:
        print(f"ssh -F {d / 'ssh_config'} h0 'echo $MULTIHOST_TEST_HOST'")
    return 0 if alive else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``up N`` / ``down`` / ``status``."""
    parser = argparse.ArgumentParser(prog="tests/fleet.py", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("n", nargs="?", type=int, default=8, help="hosts for 'up' (default 8)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="fleet dir")
    parser.add_argument(
        "--purge",
        action="store_true",
        help="down: also delete the host keys, the fleet's Unix users and their "
        "homes, the test sites under /opt (JAX, flax, cloudpickle) and the fleet dir",
    )
    args = parser.parse_args(argv)
    if args.action == "up":
        t0 = time.monotonic()
        fleet = up(args.n, args.dir)
        took = time.monotonic() - t0
        print(f"{len(fleet.hosts)} hosts up in {took:.2f}s; ssh config: {fleet.ssh_config}")
        return 0
    if args.action == "down":
        down(args.dir, purge=args.purge)
        return 0
    return _status(args.dir.resolve())


if __name__ == "__main__":
    sys.exit(main())
