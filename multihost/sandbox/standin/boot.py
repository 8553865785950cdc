"""How a stand-in TPU VM boots: its startup script started on its loopback host over real ssh,
detached, as a systemd unit starts it (from ``/``, a clean environment, no ``HOME``)."""

from __future__ import annotations

import shlex
import subprocess


def ssh_launch_command(
    env: dict[str, str], scratch: str, path: str = "/usr/local/bin:/usr/bin:/bin"
) -> str:
    """What runs on a loopback host: the script (on stdin) saved, then started detached as a
    systemd unit would start it: from ``/``, with a clean environment (``path``, ``env``) and
    no ``HOME``."""
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    d = shlex.quote(scratch)
    return (
        f"mkdir -p {d}/gcloud && cat > {d}/startup.sh || exit 1; cd / || exit 1; "
        f"env -i PATH={shlex.quote(path)} {assigns} CLOUDSDK_CONFIG={d}/gcloud "
        f"setsid sh {d}/startup.sh </dev/null >{d}/startup.log 2>&1 &"
    )


def run_ssh(ssh_config: str, alias: str, command: str, stdin: str) -> None:
    subprocess.run(
        ["ssh", "-F", ssh_config, alias, command],
        input=stdin.encode(),
        check=True,
        capture_output=True,
        timeout=60,
    )
