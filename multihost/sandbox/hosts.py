"""The sandbox's hosts: N OpenSSH ``sshd``s on loopback addresses, run as the user who runs the
sandbox. No root, no Unix user made, nothing outside the state dir.

Host ``i`` is ``h{i}``: an ``sshd`` on ``127.0.0.{2+i}`` at a free port, with its own host key,
that logs in only its user (an unprivileged ``sshd`` can log in no one else) with the
sandbox's client key. Every host being the same user, what makes each a machine of its own is
its session (``session.sh``, the ``ForceCommand``): its own ``HOME`` and ``TMPDIR`` under its
dir, and, while it is a pod's worker, its own metadata server and gcloud config (``vm.env``).
Each ``sshd`` runs below a ``vminit.py`` of its own, a child subreaper: every process of the
host, a detached job too, stays below it, so a host's processes are found, and killed, as the
processes below its init. Deleting the VM (a pod's deletion) kills them and wipes its disk
(``home``, ``tmp``, ``vm``).

The state dir's layout::

    client_key[.pub] authorized_keys known_hosts ssh_config guest_keys/
    hosts/h{i}/  sshd_config host_key[.pub] sshd.pid sshd.log env vm.env
                 home/ tmp/ vm/ (a worker's startup script, its gcloud configs, a job's work dir)
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from multihost.errors import UsageError
from multihost.sandbox import procs
from multihost.sandbox.standin.env import free_port

SESSION = Path(__file__).with_name("session.sh")
VMINIT = Path(__file__).with_name("vminit.py")
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")  # where sshd lives, off a user's PATH
SFTP_SERVERS = (  # OpenSSH's sftp-server, where distributions put it
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
)
VM_PATH = "/usr/local/bin:/usr/bin:/bin"  # a TPU VM's PATH, gcloud's folder put first
START_TIMEOUT = 30.0
MARK = "MULTIHOST_SANDBOX_VM"  # in every host process's environment: its host's dir
INSTALL_SSHD = (
    "install OpenSSH's server: apt-get install openssh-server (Debian, Ubuntu), "
    "dnf install openssh-server (Fedora, RHEL)"
)


def find_sshd(given: str | None = None) -> str:
    """The ``sshd`` to run, as an absolute path (sshd re-executes itself by it): ``given``,
    else the first on PATH or in the sbin folders."""
    if given:
        found = shutil.which(given) if "/" not in given else given
        if found is None or not os.access(found, os.X_OK) or os.path.isdir(found):
            raise UsageError(f"no sshd at {given}: {INSTALL_SSHD}")
        return os.path.abspath(found)
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    found = shutil.which("sshd", path=path)
    if found is None:
        raise UsageError(f"no sshd on PATH or in {', '.join(SBIN)}: {INSTALL_SSHD}")
    return os.path.abspath(found)


def find_client(name: str) -> str:
    """``ssh`` or ``ssh-keygen`` (OpenSSH's client: it starts the workers' startup scripts and
    makes the keys)."""
    found = shutil.which(name)
    if found is None:
        raise UsageError(
            f"no {name} on PATH: install OpenSSH's client: apt-get install openssh-client "
            "(Debian, Ubuntu), dnf install openssh-clients (Fedora, RHEL)"
        )
    return found


def sftp_server(sshd: str) -> str | None:
    """OpenSSH's sftp-server beside that sshd's installation (``pull`` reads files by SFTP)."""
    beside = Path(sshd).resolve().parent.parent / "lib" / "openssh" / "sftp-server"
    for path in (str(beside), *SFTP_SERVERS):
        if os.access(path, os.X_OK):
            return path
    return None


def sshd_version(sshd: str) -> tuple[int, int]:
    out = subprocess.run([sshd, "-V"], capture_output=True, text=True, timeout=10).stderr
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def login() -> str:
    """The user who runs the sandbox: every host's one user."""
    return pwd.getpwuid(os.getuid()).pw_name


def write(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomically: a session reading ``vm.env`` never sees half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def exports(env: Mapping[str, str]) -> str:
    """``export K=V`` lines a POSIX shell sources (values quoted)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


@dataclass(frozen=True)
class Host:
    """One sandbox host: where its sshd listens and where its files are."""

    index: int
    address: str
    port: int
    dir: Path

    @property
    def alias(self) -> str:
        return f"h{self.index}"

    @property
    def home(self) -> Path:
        return self.dir / "home"

    @property
    def tmp(self) -> Path:
        return self.dir / "tmp"

    @property
    def vm(self) -> Path:
        """The VM's own files: a worker's startup script and log, its gcloud configs, a job's
        work dir (``MULTIHOST_WORK_DIR``)."""
        return self.dir / "vm"

    @property
    def pidfile(self) -> Path:
        return self.dir / "sshd.pid"

    def host_key(self) -> str:
        """Its public host key, ``<type> <base64>``."""
        return " ".join((self.dir / "host_key.pub").read_text().split()[:2])


class Hosts:
    """The sandbox's N hosts under ``state``: prepared and started by :meth:`Hosts.start`, a VM
    wiped by :meth:`Hosts.clear`, all stopped by :meth:`Hosts.stop`."""

    def __init__(self, state: Path, n: int, sshd: str, path: str = VM_PATH) -> None:
        self.state = state
        self.sshd = sshd
        self.path = path  # the hosts' PATH
        self.user = login()
        self.hosts = tuple(
            Host(i, f"127.0.0.{2 + i}", free_port(f"127.0.0.{2 + i}"), state / "hosts" / f"h{i}")
            for i in range(n)
        )
        self.inits: list[subprocess.Popen[bytes]] = []

    # ---------------------------------------------------------------- files

    @property
    def client_key(self) -> Path:
        return self.state / "client_key"

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.state / "ssh_config"

    @property
    def guest_keys(self) -> Path:
        return self.state / "guest_keys"

    def _keygen(self, paths: Sequence[Path]) -> None:
        """ed25519 keys, made all at once by ssh-keygen."""
        keygen = find_client("ssh-keygen")
        running = [
            subprocess.Popen(
                [keygen, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(p)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for p in paths
        ]
        for proc, path in zip(running, paths, strict=True):
            _, err = proc.communicate(timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"ssh-keygen {path}: {err.decode(errors='replace').strip()}")

    def _sshd_config(self, h: Host, extra: str) -> str:
        session = f"/bin/sh {shlex.quote(str(SESSION))} {shlex.quote(str(h.dir))}"
        sftp = sftp_server(self.sshd)
        return f"""\
ListenAddress {h.address}:{h.port}
HostKey {h.dir}/host_key
PidFile {h.pidfile}
AuthorizedKeysFile {self.state}/authorized_keys {self.guest_keys}/{h.alias}
AllowUsers {self.user}
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
MaxStartups 200:30:1000
MaxSessions 100
AcceptEnv LANG LC_*
PermitUserEnvironment no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
ForceCommand {session}
{f"Subsystem sftp {sftp}" if sftp else ""}
{extra}"""

    def _client_config(self) -> str:
        blocks = [
            f"Host {h.alias} {h.address}\n  HostName {h.address}\n  Port {h.port}\n"
            f"  User {self.user}\n  UserKnownHostsFile {self.known_hosts}\n"
            for h in self.hosts
        ]
        blocks.append(
            f"Host *\n  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
            "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
            "  ConnectTimeout 10\n  LogLevel ERROR\n"
        )
        return "\n".join(blocks)

    def session_env(self, h: Host) -> dict[str, str]:
        """What makes the host a machine of its own in every session on it."""
        return {
            "HOME": str(h.home),
            "TMPDIR": str(h.tmp),
            "PATH": self.path,
            "MULTIHOST_SANDBOX_HOST": h.alias,
            MARK: str(h.dir),
        }

    def _prepare(self) -> None:
        for h in self.hosts:
            for d in (h.dir, h.home, h.tmp, h.vm):
                d.mkdir(mode=0o700, parents=True)
        self.guest_keys.mkdir(mode=0o700)
        self._keygen([self.client_key, *(h.dir / "host_key" for h in self.hosts)])
        write(self.state / "authorized_keys", (self.client_key.with_suffix(".pub")).read_text())
        # OpenSSH 9.8+ penalises sources that fail auth or crash: every client here is local
        extra = "PerSourcePenalties no\n" if sshd_version(self.sshd) >= (9, 8) else ""
        for h in self.hosts:
            write(h.dir / "sshd_config", self._sshd_config(h, extra))
            write(h.dir / "env", exports(self.session_env(h)))
        write(
            self.known_hosts,
            "".join(f"[{h.address}]:{h.port} {h.host_key()}\n" for h in self.hosts),
        )
        write(self.ssh_config, self._client_config())

    # ---------------------------------------------------------------- processes

    def start(self) -> None:
        """Every host's files, then its init and sshd; returns once each listens."""
        self._prepare()
        if os.geteuid() == 0:  # root's sshd drops its privileges into this empty dir
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for h in self.hosts:
            argv = [sys.executable, "-I", "-S", str(VMINIT), self.sshd, "-D"]
            argv += ["-f", str(h.dir / "sshd_config"), "-E", str(h.dir / "sshd.log")]
            self.inits.append(
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + START_TIMEOUT
        waiting = list(zip(self.hosts, self.inits, strict=True))
        while waiting:
            for h, init in list(waiting):
                if self.listener(h.index) is not None:
                    waiting.remove((h, init))
                elif init.poll() is not None or time.monotonic() > deadline:
                    log = h.dir / "sshd.log"
                    said = log.read_text(errors="replace").strip() if log.exists() else ""
                    code = init.poll()
                    why = said.splitlines()[-1] if said else f"exit {code}" if code else "no pid"
                    raise RuntimeError(f"{h.alias}'s sshd did not start: {why}")
            time.sleep(0.01)

    def listener(self, i: int) -> int | None:
        """Host ``i``'s listening sshd, once it has written its pidfile."""
        try:
            pid = int(self.hosts[i].pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if procs.alive(pid) else None

    def processes(self, i: int) -> set[int]:
        """What runs on host ``i``: everything below its init but its listening sshd."""
        if i >= len(self.inits):
            return set()
        return procs.below([self.inits[i].pid]) - {self.listener(i)}

    def set_vm_env(self, i: int, env: Mapping[str, str] | None) -> None:
        """What a session on host ``i`` has while it is a pod's worker (None: no longer)."""
        path = self.hosts[i].dir / "vm.env"
        if env is None:
            path.unlink(missing_ok=True)
        else:
            write(path, exports(env))

    def clear(self, indices: Sequence[int]) -> None:
        """The hosts' VMs deleted: their processes killed (sessions included: the listening
        sshd stays), their disks wiped."""
        procs.kill(set().union(*(self.processes(i) for i in indices)))
        for i in indices:
            h = self.hosts[i]
            self.set_vm_env(i, None)
            for d in (h.home, h.tmp, h.vm):
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(mode=0o700)

    def stop(self) -> None:
        """Every init told to stop (each kills what is below it, its sshd too), waited for."""
        for init in self.inits:
            if init.poll() is None:
                init.terminate()
        for init in self.inits:
            try:
                init.wait(timeout=20)
            except subprocess.TimeoutExpired:
                init.kill()
                init.wait()
