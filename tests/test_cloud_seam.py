"""The gcloud seam: only ``multihost.cloud`` spawns gcloud; its errors are typed by gcloud's
words; the real CLI parses every command line it builds."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from multihost import errors
from multihost.cloud import gcloud, queued, secretmanager, storage, tpus
from multihost.cloud.gcloud import error_class, error_for
from tests import gcloud_zygote
from tests.helpers import wait_for

PACKAGE = Path(__file__).resolve().parent.parent / "multihost"
SEAM = PACKAGE / "cloud"
# Calls that start a process, by their dotted name as written.
SPAWNERS = {
    "subprocess.run",
    "subprocess.Popen",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
    "os.system",
    "os.popen",
    "os.posix_spawn",
    "os.posix_spawnp",
    "os.execv",
    "os.execvp",
    "os.execvpe",
    "os.execl",
    "os.execlp",
    "os.spawnv",
    "os.spawnvp",
}
# Every module outside the seam that starts a process, and what it starts (none is gcloud).
SPAWNING = {
    "envsync/request.py": "uv (lock --check)",
    "envsync/uvbin.py": "uv (--version)",
    "fleetops/contact/keys.py": "ssh-keygen (gcloud's key, created as gcloud does)",
    "job/watch/watchers.py": "multihost itself (a detached job watch)",
    "remote/env_probe.py": "uv on the host (runs there, not here)",
    "sandbox/control.py": "the sandbox's background process (python -m multihost.sandbox.serve)",
    "sandbox/hosts.py": "ssh-keygen, sshd -V, and each host's init (vminit.py)",
    "sandbox/vminit.py": "a sandbox host's sshd",
    "sandbox/standin/gcs.py": "fake-gcs-server",
    "sandbox/standin/boot.py": "ssh (a worker's startup script, as the VM's boot runs it)",
    "staging/archive.py": "git (the files to pack)",
    "transport/local.py": "the user's command (--local)",
}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def test_only_the_seam_spawns_gcloud() -> None:
    """Outside ``multihost/cloud``: no code names the gcloud binary (``"gcloud"`` or its
    variable ``MULTIHOST_GCLOUD``: prose and the hosts' scripts do not count), and only the
    modules of ``SPAWNING`` start a process at all."""
    named, spawning = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if SEAM in path.parents:
            continue
        rel = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and id(node) not in docs
                and node.value in ("gcloud", "MULTIHOST_GCLOUD")
            ):
                named.append(f"{rel}:{node.lineno} names {node.value!r}")
            if isinstance(node, ast.Call) and _dotted(node.func) in SPAWNERS:
                spawning.add(rel)
    assert not named, "gcloud is run by multihost.cloud only:\n" + "\n".join(named)
    assert spawning == set(SPAWNING), "a new process-spawning module: does it run gcloud?"


def test_the_seam_is_where_gcloud_is_spawned() -> None:
    """The check above would see it: the seam itself names the binary and spawns."""
    text = (SEAM / "gcloud.py").read_text()
    assert '"MULTIHOST_GCLOUD"' in text
    assert "subprocess.Popen(" in text
    assert "asyncio.create_subprocess_exec(" in text


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (
            "ERROR: (gcloud.compute.tpus.queued-resources.create) RESOURCE_EXHAUSTED: Quota limit "
            "'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region "
            "us-east5",
            errors.CloudQuotaExhausted,
        ),
        (
            'There is no more capacity in the zone "us-east5-b"; you can try in another zone',
            errors.CloudNoCapacity,
        ),
        ("Insufficient reserved capacity", errors.CloudNoCapacity),
        ("INVALID_ARGUMENT: accelerator type v6e-7 not found in zone", errors.CloudInvalidArgument),
        (
            "PERMISSION_DENIED: Location us-x1-a not found or access is unauthorized",
            errors.CloudPermissionDenied,
        ),
        ("ALREADY_EXISTS: resource 'q' already exists", errors.CloudAlreadyExists),
        (
            "NOT_FOUND: Resource 'projects/p/locations/z/queuedResources/q' was not found",
            errors.CloudNotFound,
        ),
        ("One or more URLs matched no objects.", errors.CloudNotFound),
        ("UNAVAILABLE: HTTPError 503: backend unavailable", errors.CloudUnavailable),
        (
            "RESOURCE_EXHAUSTED: Quota exceeded for quota metric 'Read requests' and limit "
            "'Read requests per minute'",
            errors.CloudUnavailable,
        ),
        ("The required property [project] is not currently set.", errors.CloudError),
    ],
)
def test_error_classes_from_gclouds_words(message: str, kind: type[errors.CloudError]) -> None:
    assert error_class(message) is kind


def test_error_class_from_a_failed_requests_code() -> None:
    """A queued resource's ``failedData.error``: a google.rpc code and its message."""
    assert error_class("no more capacity in zone z", 8) is errors.CloudNoCapacity
    assert error_class("resource gone", 5) is errors.CloudNotFound
    assert error_class("something", 13) is errors.CloudUnavailable
    assert error_class("something", 99) is errors.CloudError


def test_error_for_keeps_gclouds_line_and_its_exit() -> None:
    bad = subprocess.CompletedProcess(["g"], 2, b"", b"ERROR: (gcloud.x) bad flag --nope\n")
    error = error_for(bad)
    assert isinstance(error, errors.CloudInvalidArgument)
    assert str(error) == "gcloud failed (exit 2): ERROR: (gcloud.x) bad flag --nope"
    assert issubclass(errors.CloudTimeout, TimeoutError)


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "gcloud"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_runners_sync_and_async(tmp_path: Path) -> None:
    """Both give gcloud's exit and output; both name a missing binary and a timeout."""
    echo = _script(tmp_path, 'echo "$@"; cat; echo oops >&2; exit 3\n')
    done = gcloud.run(["a", "b c"], gcloud=echo, input=b"in\n")
    assert (done.returncode, done.stdout, done.stderr) == (3, b"a b c\nin\n", b"oops\n")
    done = asyncio.run(gcloud.run_async(["a", "b c"], gcloud=echo))
    assert (done.returncode, done.stdout) == (3, b"a b c\n")
    with pytest.raises(errors.CloudError, match="exit 3"):
        gcloud.check(done)
    with pytest.raises(errors.GcloudMissing, match="install the Google Cloud CLI"):
        gcloud.run([], gcloud=str(tmp_path / "none"))
    with pytest.raises(errors.GcloudMissing):
        asyncio.run(gcloud.run_async([], gcloud=str(tmp_path / "none")))
    slow = _script(tmp_path, f"echo $$ > {tmp_path}/pid; exec sleep 30\n")
    with pytest.raises(errors.CloudTimeout, match=r"took over 0\.5s"):
        asyncio.run(gcloud.run_async([], gcloud=slow, timeout=0.5))
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    with pytest.raises(errors.CloudTimeout):
        gcloud.run([], gcloud=slow, timeout=0.5)


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for init (it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def test_a_hung_gcloud_and_what_it_started_are_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gcloud that hangs, having started a child of its own: past the timeout both are
    killed (its whole process group), and a waiting caller was told what it waited for."""
    hung = _script(
        tmp_path,
        f"sleep 300 & echo $! > {tmp_path}/child\necho $$ > {tmp_path}/pid\nexec sleep 301\n",
    )
    said: list[str] = []
    monkeypatch.setattr(gcloud, "NOTICE", 0.3)
    with pytest.raises(errors.CloudTimeout, match=r"took over 1s"):
        gcloud.run(["compute", "tpus", "x", "--zone", "z"], gcloud=hung, timeout=1,
                   waiting=said.append)  # fmt: skip
    pids = [int((tmp_path / name).read_text()) for name in ("pid", "child")]
    for pid in pids:
        wait_for(lambda pid=pid: _gone(pid), 10, f"process {pid} to go")
    assert said, "the caller was told nothing"
    assert said[0].startswith("waiting for gcloud (compute tpus x): 0 s so far, at most 1 s")
    asyncio.run(_async_hung(hung, tmp_path))


async def _async_hung(hung: str, tmp_path: Path) -> None:
    with pytest.raises(errors.CloudTimeout):
        await gcloud.run_async([], gcloud=hung, timeout=0.5)
    for name in ("pid", "child"):
        pid = int((tmp_path / name).read_text())
        wait_for(lambda pid=pid: _gone(pid), 10, f"process {pid} to go")


def test_a_missing_gcloud_is_named_first(tmp_path: Path) -> None:
    with pytest.raises(errors.GcloudMissing, match="'/nowhere/gcloud' not found"):
        gcloud.require("/nowhere/gcloud")
    assert issubclass(errors.GcloudMissing, errors.UsageError)  # exit 2, as for bad input
    assert gcloud.require(_script(tmp_path, "true\n")).endswith("gcloud")


def test_queued_resource_lines() -> None:
    one = queued.create_argv(
        "q",
        accelerator_type="v6e-8",
        runtime_version="v2-alpha-tpuv6e",
        zone="z",
        labels={"multihost-pod": "q", "owner": "ann"},
        valid_until="15m",
        metadata={"k": "a,b"},
        metadata_files={"startup-script": "/tmp/s.sh"},
        capacity="spot",
    )
    assert one == [
        "compute",
        "tpus",
        "queued-resources",
        "create",
        "q",
        "--accelerator-type",
        "v6e-8",
        "--runtime-version",
        "v2-alpha-tpuv6e",
        "--node-id",
        "q",
        "--spot",
        "--labels",
        "multihost-pod=q,owner=ann",
        "--valid-until-duration",
        "15m",
        "--metadata",
        "^:^k=a,b",
        "--metadata-from-file",
        "startup-script=/tmp/s.sh",
        "--async",
        "--zone",
        "z",
    ]
    many = queued.create_argv(
        "q",
        accelerator_type="v4-16",
        runtime_version="v",
        node_count=3,
        capacity="best-effort",
        run_async=False,
    )
    assert many[:4] == ["alpha", "compute", "tpus", "queued-resources"]  # GA has no best-effort
    assert many[-3:] == ["--node-prefix", "q", "--best-effort"]
    with pytest.raises(ValueError, match="capacity"):
        queued.create_argv("q", accelerator_type="v4-8", runtime_version="v", capacity="cheap")
    assert queued.delete_argv("q", "p", "z") == [
        "compute",
        "tpus",
        "queued-resources",
        "delete",
        "q",
        "--force",
        "--async",
        "--quiet",
        "--project",
        "p",
        "--zone",
        "z",
    ]
    assert queued.list_argv(None, "z", "labels.multihost-pod=q")[3:] == [
        "list",
        "--format",
        "json",
        "--filter",
        "labels.multihost-pod=q",
        "--zone",
        "z",
    ]


class _Api(BaseHTTPRequestHandler):
    """Every request recorded (with its JSON body) and answered 403: gcloud gets as far as the
    network, no further."""

    seen: list[tuple[str, str, Any]]

    def _refuse(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append((self.command, self.path, json.loads(body) if body else None))
        reply = b'{"error": {"code": 403, "message": "refused by the test"}}'
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST = do_PATCH = do_DELETE = _refuse

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _api() -> Iterator[tuple[str, list[tuple[str, str, Any]]]]:
    seen: list[tuple[str, str, Any]] = []
    handler = type("Handler", (_Api,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("gcloud"), reason="needs the Google Cloud CLI")
def test_the_real_cli_parses_every_line(tmp_path: Path) -> None:
    """Each builder's line, given to the real gcloud: none is refused at parsing (exit 2,
    "unrecognized arguments"); each reaches the API; create's flags arrive as meant."""
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    key = tmp_path / "k.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGr8 ann\n")
    gs = "gs://bkt/multihost/x"
    lines = {
        "create": queued.create_argv(
            "q",
            accelerator_type="v4-16",
            runtime_version="v",
            zone="z",
            node_count=2,
            capacity="spot",
            labels={"multihost-pod": "q"},
            valid_until="15m",
            metadata={"k": "a,b", "w": "x"},
            metadata_files={"startup-script": str(script)},
        ),
        "create-one": queued.create_argv(
            "q", accelerator_type="v4-8", runtime_version="v", zone="z", capacity="reserved"
        ),
        "create-best-effort": queued.create_argv(
            "q", accelerator_type="v4-8", runtime_version="v", zone="z", capacity="best-effort"
        ),
        "delete": queued.delete_argv("q", "p", "z"),
        "describe": queued.describe_argv("q", "p", "z"),
        "list": queued.list_argv("p", "z", "labels.multihost-pod=q"),
        "tpu-list": tpus.list_argv("p", "z"),
        "guest": tpus.guest_attributes_argv("n", "p", "z"),
        "update": tpus.update_metadata_argv("n", "z", "p", "ssh-keys", 'a:b c {"x":1,"y":2}'),
        "project": tpus.project_info_argv("p"),
        "profile": tpus.oslogin_profile_argv("p"),
        "add-key": tpus.oslogin_add_key_argv(str(key), "p"),
        "secret": secretmanager.access_argv("s", "p"),
        "objects": storage.list_objects_argv(gs),
        "cat": storage.cat_argv(f"{gs}/a", 5),
        "cat-many": storage.cat_many_argv([f"{gs}/a", f"{gs}/b"]),
        "cp": storage.cp_argv(str(script), f"{gs}/s.sh"),
        "default-zone": tpus.default_zone_argv(),
    }
    (tmp_path / "cfg").mkdir()
    with _api() as (endpoint, seen):
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "CLOUDSDK_CONFIG": str(tmp_path / "cfg"),
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": "p",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_CORE_ACCOUNT": "ann@example.com",
            **{
                f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api}": endpoint
                for api in ("TPU", "SECRETMANAGER", "OSLOGIN")
            },
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{endpoint}compute/v1/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{endpoint}storage/v1/",
            # the session's gcloud (the real SDK imported once, forked per line:
            # tests/gcloud_zygote.py), when there is one: the same code parses each line
            **{
                k: os.environ[k]
                for k in (gcloud_zygote.SOCKET_ENV, gcloud_zygote.OFF_ENV)
                if k in os.environ
            },
        }

        def one(item: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess[str]]:
            return item[0], subprocess.run(
                ["gcloud", *item[1]], capture_output=True, text=True, timeout=120, env=env
            )

        with ThreadPoolExecutor(4) as pool:
            done = dict(pool.map(one, lines.items()))
    for name, proc in done.items():
        assert proc.returncode != 2, f"{name}: {proc.stderr}"
        assert "unrecognized arguments" not in proc.stderr, f"{name}: {proc.stderr}"
    posts = [(path.split("?")[0], body) for method, path, body in seen if method == "POST"]
    create = next(b for p, b in posts if p.startswith("/v2/") and "spot" in b)
    node = create["tpu"]["nodeSpec"][0]
    assert node["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "q"}
    assert node["node"]["metadata"] == {"k": "a,b", "w": "x", "startup-script": "#!/bin/sh\ntrue\n"}
    assert node["node"]["labels"] == {"multihost-pod": "q"}
    assert create["spot"] == {}
    assert create["queueingPolicy"] == {"validUntilDuration": "900s"}
    alpha = [b for p, b in posts if p == "/v2alpha1/projects/p/locations/z/queuedResources"]
    assert "bestEffort" in alpha[0]  # best-effort: the alpha API only
    reserved = next(b for p, b in posts if "reservationName" in b)  # GA --reserved
    assert reserved["tpu"]["nodeSpec"][0]["nodeId"] == "q"
