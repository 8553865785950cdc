"""First contact with Cloud TPU VMs: the user's key accepted, as gcloud does.

``gcloud compute tpus tpu-vm ssh`` (``command_lib/compute/tpus/tpu_vm/ssh.py``,
``AddSSHKeyIfNeeded``) creates ``~/.ssh/google_compute_engine`` when missing and, unless the
line ``USER:<type> <base64> USER`` is already in the project's ``commonInstanceMetadata`` or the
node's ``ssh-keys``, appends it to the node's ``ssh-keys``. We do the same through the real CLI:
``tpu-vm update --update-metadata ssh-keys=VALUE`` merges into the node's metadata (never
``--metadata-from-file``, which replaces the whole map). Under OS Login (node metadata
``enable-oslogin``, else the project's) the key goes to the user's profile instead and the login
name is the profile's primary POSIX username.

USER is the user the worker is logged into (the guest agent installs the key for the user its
line names, and for no one else): one line per distinct login user of a node
(``multihost.fleetops.contact`` works them out from ``--user`` and the ssh config).

The nodes' metadata comes from discovery's own list call: nothing more is asked of gcloud
when every node already has its lines.
"""

from __future__ import annotations

import getpass
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multihost.cloud import gcloud as runner
from multihost.cloud import tpus
from multihost.defaults import GOOGLE_KEY as GOOGLE_KEY  # gcloud's key: a --prefix fleet's
from multihost.errors import CloudError, CloudTimeout, DiscoveryError, GcloudMissing

SSH_KEYS = "ssh-keys"


@dataclass(frozen=True)
class KeyAdded:
    """What first contact changed: the nodes whose metadata got the key (or the OS Login
    profile), and the login name to use (OS Login's POSIX username; None: unchanged)."""

    nodes: tuple[str, ...] = ()
    oslogin: bool = False
    user: str | None = None
    profile: bool = False  # the key was added to the OS Login profile just now
    users: tuple[str, ...] = ()  # the login users the lines added to metadata are for


def ensure_key(private: str = GOOGLE_KEY) -> str:
    """The public key ``<type> <base64>`` of gcloud's key, created (as gcloud does) if missing."""
    path = Path(private).expanduser()
    pub = path.with_name(path.name + ".pub")
    if not path.is_file():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        proc = subprocess.run(
            ["ssh-keygen", "-t", "rsa", "-N", "", "-f", str(path), "-C", getpass.getuser()],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise DiscoveryError(f"ssh-keygen could not create {path}: {proc.stderr.strip()}")
    if not pub.is_file():
        proc = subprocess.run(
            ["ssh-keygen", "-y", "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise DiscoveryError(f"cannot read the public half of {path}: {proc.stderr.strip()}")
        pub.write_text(proc.stdout)
    fields = pub.read_text().split()
    if len(fields) < 2:
        raise DiscoveryError(f"{pub} is not an ssh public key")
    return f"{fields[0]} {fields[1]}"


def key_line(user: str, public: str) -> str:
    """The ``ssh-keys`` metadata line (``USER:<type> <base64> USER``), as gcloud writes it."""
    return f"{user}:{public} {user}"


def has_key(value: object, line: str) -> bool:
    """gcloud's test: the line is in the ``ssh-keys`` value (a substring match)."""
    return isinstance(value, str) and line in value


def _metadata(node: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = node.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _project_metadata(items: object) -> dict[str, str]:
    """``commonInstanceMetadata.items`` (a list of key/value) as a mapping."""
    out: dict[str, str] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, Mapping) and isinstance(item.get("key"), str):
            out[str(item["key"])] = str(item.get("value", ""))
    return out


def oslogin_on(node: Mapping[str, Any], project: Mapping[str, str] | None) -> bool:
    """OS Login decides: the node's ``enable-oslogin`` (case-insensitive TRUE), else the
    project's (``GetOsloginState``)."""
    value = _metadata(node).get("enable-oslogin")
    if value is None and project is not None:
        value = project.get("enable-oslogin")
    return str(value or "").strip().upper() == "TRUE"


def merged(existing: str, line: str) -> str:
    """The node's ``ssh-keys`` with the line appended, as gcloud does (``existing\\nline``)."""
    return f"{existing}\n{line}" if existing else line


def _gcloud(gcloud: str | None, argv: Sequence[str], what: str, timeout: float = 120) -> str:
    binary = gcloud or runner.binary()
    try:
        proc = runner.run(argv, gcloud=binary, timeout=timeout)
    except GcloudMissing:
        raise DiscoveryError(f"{binary!r} not found: install the Google Cloud CLI") from None
    except CloudTimeout:
        raise DiscoveryError(f"gcloud took more than {timeout:g}s to {what}") from None
    except CloudError as exc:
        raise DiscoveryError(f"cannot {what}: {exc}") from None
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        at = next((i for i, ln in enumerate(lines) if ln.startswith("ERROR:")), len(lines) - 1)
        message = " ".join(lines[max(at, 0) :]) or f"exit {proc.returncode}"
        raise DiscoveryError(f"cannot {what}: {message}")
    return proc.stdout.decode(errors="replace")


def project_metadata(gcloud: str | None, project: str | None) -> dict[str, str]:
    """The project's ``commonInstanceMetadata`` (``gcloud compute project-info describe``)."""
    argv = tpus.project_info_argv(project)
    try:
        info = json.loads(_gcloud(gcloud, argv, "read the project's metadata") or "{}")
    except json.JSONDecodeError as exc:
        raise DiscoveryError(f"cannot parse the project's metadata: {exc}") from None
    common = info.get("commonInstanceMetadata") if isinstance(info, dict) else None
    return _project_metadata(common.get("items") if isinstance(common, dict) else None)


def _profile(gcloud: str | None, project: str | None) -> dict[str, Any]:
    out = _gcloud(gcloud, tpus.oslogin_profile_argv(project), "read your OS Login profile")
    try:
        profile = json.loads(out or "{}")
    except json.JSONDecodeError as exc:
        raise DiscoveryError(f"cannot parse your OS Login profile: {exc}") from None
    return profile if isinstance(profile, dict) else {}


def oslogin_user(
    gcloud: str | None, public: str, public_file: Path, project: str | None
) -> tuple[str, bool]:
    """The OS Login profile's primary POSIX username, the key added to the profile first when
    it is not there (``os-login ssh-keys add``); and whether it was added."""
    profile = _profile(gcloud, project)
    keys = profile.get("sshPublicKeys")
    known = [
        str(k.get("key", ""))
        for k in (keys.values() if isinstance(keys, dict) else ())
        if isinstance(k, dict)
    ]
    added = not any(public in k for k in known)
    if added:
        _gcloud(
            gcloud,
            tpus.oslogin_add_key_argv(str(public_file), project),
            "add your key to your OS Login profile",
        )
        profile = _profile(gcloud, project) or profile
    accounts = profile.get("posixAccounts")
    accounts = [a for a in accounts or () if isinstance(a, dict) and a.get("username")]
    if not accounts:
        raise DiscoveryError("your OS Login profile has no POSIX account")
    primary = next((a for a in accounts if a.get("primary")), accounts[0])
    return str(primary["username"]), added


def _node_name(node: Mapping[str, Any]) -> str:
    return str(node.get("name", "")).rsplit("/", 1)[-1]


_USER = re.compile(r"[^a-z0-9_.-]")


def default_user() -> str:
    """The login name gcloud puts in the line: the local user name, lowercased."""
    return _USER.sub("", getpass.getuser().lower()) or "user"


def add_key(
    nodes: Sequence[Mapping[str, Any]],
    *,
    project: str | None,
    zone: str | None,
    logins: Mapping[str, Sequence[str]] | None = None,
    user: str | None = None,
    gcloud: str | None = None,
    private: str = GOOGLE_KEY,
) -> KeyAdded:
    """Make sure every node takes the user's key (created if missing) for each user its
    workers will be logged into (``logins``: node name -> those users; a node not in it, or
    with none: ``user``, else :func:`default_user`); what was changed. ``user`` given: the
    login name stays the caller's under OS Login too."""
    public = ensure_key(private)
    wanted = {
        _node_name(n): tuple(
            dict.fromkeys((logins or {}).get(_node_name(n)) or (user or default_user(),))
        )
        for n in nodes
    }
    lines = {name: [key_line(u, public) for u in users] for name, users in wanted.items()}

    def lacking(node: Mapping[str, Any], project_keys: object = None) -> list[str]:
        have = _metadata(node).get(SSH_KEYS)
        return [
            ln
            for ln in lines[_node_name(node)]
            if not has_key(have, ln) and not has_key(project_keys, ln)
        ]

    missing = [n for n in nodes if lacking(n)]
    node_oslogin = any(oslogin_on(n, None) for n in nodes)
    if not missing and not node_oslogin:
        return KeyAdded()  # every node has it: no gcloud call at all
    common = project_metadata(gcloud, project)
    if any(oslogin_on(n, common) for n in nodes):
        pub = Path(private).expanduser()
        name, new = oslogin_user(gcloud, public, pub.with_name(pub.name + ".pub"), project)
        return KeyAdded(oslogin=True, user=None if user else name, profile=new)
    added, users = [], []
    for node in missing:
        name = _node_name(node)
        needed = lacking(node, common.get(SSH_KEYS))
        if not needed:
            continue  # the project's metadata has them
        value = str(_metadata(node).get(SSH_KEYS) or "")
        for line in needed:
            value = merged(value, line)
        _gcloud(
            gcloud,
            tpus.update_metadata_argv(name, zone, project, SSH_KEYS, value),
            f"add your key to node {name}'s metadata",
        )
        added.append(name)
        users += [ln.split(":", 1)[0] for ln in needed]
    return KeyAdded(nodes=tuple(added), users=tuple(dict.fromkeys(users)))
