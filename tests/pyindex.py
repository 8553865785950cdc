"""A PEP 503 simple index on 127.0.0.1 for environment tests: pure-python wheels built here,
served by ``http.server``, every request counted per path.

``Index(root).add("name", "1.0", files={...}, requires=[...])`` builds a wheel;
``with index.serving(): ... index.url`` serves it; ``index.hits`` counts requests per path;
``index.hold`` (an Event) keeps wheel downloads waiting until it is set;
``tinyab(root, blob)`` is the usual two wheels (tinya needs tinyb, which carries ``blob``
random bytes); ``uv_project(root, index.url)`` writes a uv project that depends on the index
and locks it.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import http.server
import json
import os
import secrets
import subprocess
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from multihost.envsync.uvbin import uv_binary


def build_wheel(
    out: Path,
    name: str,
    version: str,
    files: Mapping[str, bytes],
    requires: Sequence[str] = (),
    tag: str = "py3-none-any",
) -> Path:
    """A wheel of ``files`` (paths inside site-packages, or ``<dist>.data/scripts/...``)."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"]
    meta += [f"Requires-Dist: {r}\n" for r in requires]
    entries = dict(files) | {
        f"{dist}.dist-info/METADATA": "".join(meta).encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
        + (b"true" if tag.endswith("-any") else b"false")
        + f"\nTag: {tag}\n".encode(),
    }
    record = []
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}\n")
    record.append(f"{dist}.dist-info/RECORD,,\n")
    wheel = out / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for path, data in entries.items():
            z.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), data)
        z.writestr(
            zipfile.ZipInfo(f"{dist}.dist-info/RECORD", (2020, 1, 1, 0, 0, 0)), "".join(record)
        )
    return wheel


class Index:
    """Wheels under ``root/<name>/``, served as ``/simple/<name>/`` and ``/files/<wheel>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hits: collections.Counter[str] = collections.Counter()
        self.url = ""
        # in every URL: no host's uv cache (kept between tests) holds a wheel under one of
        # this index's URLs, even where a port of an earlier index comes round again
        self.token = secrets.token_hex(4)
        self.down = False  # answer 404 to everything (files gone: uv fails at once, no retries)
        # while not set, a wheel's download waits (counted first): a test acts mid-build
        self.hold: threading.Event | None = None

    def add(
        self,
        name: str,
        version: str,
        files: Mapping[str, bytes],
        requires: Sequence[str] = (),
        tag: str = "py3-none-any",
    ) -> Path:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        return build_wheel(d, name, version, files, requires, tag)

    def files(self) -> list[str]:
        """Every wheel's request path."""
        return sorted(f"/files/{w.name}" for w in self.root.glob("*/*.whl"))

    def downloads(self) -> int:
        return sum(n for p, n in self.hits.items() if p.startswith("/files/"))

    @contextlib.contextmanager
    def serving(self) -> Iterator[Index]:
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(head=True)

            def do_GET(self) -> None:
                self._answer(head=False)

            def _answer(self, *, head: bool) -> None:
                path = self.path.split("?", 1)[0].removeprefix(f"/{index.token}")
                if not head:
                    index.hits[path] += 1
                if index.hold is not None and path.startswith("/files/"):
                    index.hold.wait(120)
                if index.down:
                    self.send_error(404)
                    return
                body = index._page(path)
                if body is None:
                    self.send_error(404)
                    return
                data, kind = body
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{server.server_address[1]}/{self.token}/simple"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()

    def _page(self, path: str) -> tuple[bytes, str] | None:
        if path.startswith("/files/"):
            found = list(self.root.glob(f"*/{path.removeprefix('/files/')}"))
            return (found[0].read_bytes(), "application/octet-stream") if found else None
        if path.startswith("/simple/"):
            name = path.removeprefix("/simple/").strip("/")
            d = self.root / name
            if not name or not d.is_dir():
                return None
            links = []
            for w in sorted(d.glob("*.whl")):
                h = hashlib.sha256(w.read_bytes()).hexdigest()
                href = f"/{self.token}/files/{w.name}#sha256={h}"
                links.append(f'<a href="{href}">{w.name}</a><br>')
            return f"<html><body>{''.join(links)}</body></html>".encode(), "text/html"
        return None


def uv_project(
    root: Path,
    index_url: str,
    deps: Sequence[str] = ("tinya",),
    *,
    requires: str | None = ">=3.9",
    tail: str = "",
    cache: Path | None = None,
) -> Path:
    """A uv project at ``root`` (made when missing) that depends on ``deps`` from the index at
    ``index_url`` alone (``tail``: TOML tables before ``[tool.uv]``), locked with the real uv
    without interpreter downloads (its cache: ``cache``, else beside ``root``)."""
    root.mkdir(parents=True, exist_ok=True)
    python = f'requires-python = "{requires}"\n' if requires else ""
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\nversion = "0.1"\n{python}'
        f"dependencies = {json.dumps(list(deps))}\n{tail}[tool.uv]\npackage = false\n"
        f'[[tool.uv.index]]\nurl = "{index_url}"\ndefault = true\n'
    )
    uvc = cache or root.parent / "uvc"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_CACHE_DIR=str(uvc))
    subprocess.run([uv(), "lock", "-q"], cwd=root, env=env, check=True, timeout=60)
    return root


def uv() -> str:
    """The uv the tests lock with: the runner's own (on PATH, else the ``uv`` package's binary,
    which the ``dev`` extra installs), so a fresh venv that was never activated still has it."""
    found = uv_binary()
    assert found, "uv is missing: pip install -e '.[dev]' brings it"
    return found


def tinyab(root: Path, blob: int = 0) -> Index:
    """An index of the tests' usual two wheels: tinya 1.0 (``X = 1``), which needs tinyb 2.0
    (``Y = 2``, plus ``blob`` random bytes in ``tinyb/blob.bin`` when asked)."""
    idx = Index(root)
    idx.add("tinya", "1.0", {"tinya/__init__.py": b"X = 1\n"}, ["tinyb"])
    files = {"tinyb/__init__.py": b"Y = 2\n"}
    if blob:
        files["tinyb/blob.bin"] = os.urandom(blob)
    idx.add("tinyb", "2.0", files)
    return idx
