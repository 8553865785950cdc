"""The one place gcloud runs: a sync and an async runner, and gcloud's words read as errors.

The binary is ``$MULTIHOST_GCLOUD`` (default ``gcloud``). Every call gets its own timeout and
no stdin. A failed call becomes the :class:`~multihost.errors.CloudError` subclass its words
name (:func:`error_class`: not found, permission denied, quota, no capacity, invalid,
already exists, unavailable); callers that want gcloud's exit status ask with ``check=False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from multihost.cloud import queued, storage
from multihost.defaults import DEFAULTS
from multihost.errors import (
    CloudAlreadyExists,
    CloudError,
    CloudInvalidArgument,
    CloudNoCapacity,
    CloudNotFound,
    CloudPermissionDenied,
    CloudQuotaExhausted,
    CloudTimeout,
    CloudUnavailable,
    GcloudMissing,
)

ENV = "MULTIHOST_GCLOUD"  # the gcloud binary to run
TIMEOUT_ENV = "MULTIHOST_GCLOUD_TIMEOUT"  # s one call may take (tests shorten it)
TIMEOUT = DEFAULTS.gcloud_timeout  # s one call may take unless its caller says otherwise
NOTICE = 10.0  # s after which a call still running is said (and again each time as long)

Ran = subprocess.CompletedProcess  # what a call gives back: argv, returncode, stdout, stderr
Waiting = Callable[[str], None]  # told, in words, what a slow call is waiting for


def binary() -> str:
    """The gcloud to run: ``$MULTIHOST_GCLOUD``, else ``gcloud`` on PATH."""
    return os.environ.get(ENV, "gcloud")


def timeout_from_env() -> float:
    """``$MULTIHOST_GCLOUD_TIMEOUT`` when set (a number of seconds), else :data:`TIMEOUT`."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        return float(text) if text and float(text) > 0 else TIMEOUT
    except ValueError:
        return TIMEOUT


def require(gcloud: str | None = None) -> str:
    """The gcloud binary, found before anything is asked of it: ``GcloudMissing`` (exit 2)
    names it when it is not there, so no command starts half way and then finds out."""
    name = gcloud or binary()
    if shutil.which(name) is None:
        raise GcloudMissing(f"{name!r} not found: install the Google Cloud CLI") from None
    return name


def what(argv: Sequence[str]) -> str:
    """A call in words: its command and operand, before the first flag
    (``compute tpus queued-resources describe exp1``)."""
    words = []
    for arg in argv:
        if arg.startswith("-"):
            break
        words.append(arg)
    return " ".join(words) or "gcloud"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """gcloud and whatever it started (it runs in a process group of its own): killed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def run(
    argv: Sequence[str],
    *,
    gcloud: str | None = None,
    timeout: float = TIMEOUT,
    input: bytes | None = None,
    waiting: Waiting | None = None,
) -> Ran[bytes]:
    """``gcloud ARGV...`` once, its exit status not checked (see :func:`check`). Raises
    ``GcloudMissing`` when there is no such binary, ``CloudTimeout`` past ``timeout``,
    ``CloudError`` when it cannot be started at all. gcloud runs in a process group of its
    own: past the timeout, or when the caller is interrupted, the whole group is killed (what
    gcloud started too). ``waiting`` is told what the call waits for once it has run
    :data:`NOTICE` seconds (half the timeout, if that is less), and again as often."""
    full = [gcloud or binary(), *argv]
    try:
        proc = subprocess.Popen(
            full,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise GcloudMissing(f"{full[0]!r} not found: install the Google Cloud CLI") from None
    except OSError as exc:
        raise CloudError(f"cannot run {shlex.join(full)}: {exc}") from None
    started = time.monotonic()
    with proc:  # its pipes closed, and it reaped, however this ends
        try:
            return _communicate(proc, full, input, timeout, started, waiting)
        except BaseException:
            _kill_group(proc)
            raise


def _communicate(
    proc: subprocess.Popen[bytes],
    full: list[str],
    input: bytes | None,
    timeout: float,
    started: float,
    waiting: Waiting | None,
) -> Ran[bytes]:
    pending = input
    every = min(NOTICE, timeout / 2)  # a short timeout is said once, half way
    while True:
        left = timeout - (time.monotonic() - started)
        try:
            out, err = proc.communicate(
                pending, timeout=max(0.0, min(left, every) if waiting else left)
            )
            return subprocess.CompletedProcess(full, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pending = None  # communicate() keeps what it has not written yet
            ran = time.monotonic() - started
            if ran >= timeout:
                raise CloudTimeout(f"gcloud took over {timeout:g}s: {shlex.join(full)}") from None
            assert waiting is not None
            waiting(
                f"waiting for gcloud ({what(full[1:])}): {ran:.0f} s so far, at most {timeout:g} s"
            )


async def run_async(
    argv: Sequence[str],
    *,
    gcloud: str | None = None,
    timeout: float = TIMEOUT,
    input: bytes | None = None,
) -> Ran[bytes]:
    """:func:`run` for the event loop: the same errors; gcloud's process group is killed (and
    gcloud reaped) when the timeout passes or the caller is cancelled."""
    full = [gcloud or binary(), *argv]
    try:
        proc = await asyncio.create_subprocess_exec(
            *full,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise GcloudMissing(f"{full[0]!r} not found: install the Google Cloud CLI") from None
    except OSError as exc:
        raise CloudError(f"cannot run {shlex.join(full)}: {exc}") from None
    done = False
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(input)
        done = True
    except TimeoutError:
        raise CloudTimeout(f"gcloud took over {timeout:g}s: {shlex.join(full)}") from None
    finally:
        if not done:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
    assert proc.returncode is not None
    return subprocess.CompletedProcess(full, proc.returncode, out, err)


def one_line(
    stderr: str | bytes, *, tail: int = 2, limit: int = 300, empty: str = "(no message)"
) -> str:
    """gcloud's own error on one line: from its first ``ERROR:`` line on, else its last
    ``tail`` lines; cut to ``limit`` characters."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("ERROR:")]
    picked = " ".join(lines[starts[0] :] if starts else lines[-tail:]) or empty
    return picked if len(picked) <= limit else picked[: limit - 3] + "..."


# gcloud's (and the APIs') words for each kind of failure; the first that matches wins.
_CAPACITY = re.compile(r"no more capacity|insufficient (reserved )?capacity|stockout", re.I)
_QUOTA = re.compile(r"quota", re.I)
_RATE = re.compile(r"per (minute|second|100 seconds)|rate ?limit|too many requests", re.I)
_DENIED = re.compile(r"PERMISSION_DENIED|does not have permission|UNAUTHENTICATED|\b40[13]\b")
_INVALID = re.compile(r"INVALID_ARGUMENT|unrecognized arguments|\b400\b")
_EXISTS = re.compile(r"ALREADY_EXISTS|\b409\b|already exists", re.I)
_NOT_FOUND = re.compile(r"NOT_FOUND|\b404\b|not found|matched no objects|does not exist", re.I)
_UNAVAILABLE = re.compile(
    r"UNAVAILABLE|INTERNAL|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|"
    r"\b(429|500|502|503|504)\b|Connection ?(reset|aborted|refused|Error)|"
    r"RemoteDisconnected|timed out|Timeout|Temporary failure|Rate ?limit",
    re.I,
)
# google.rpc.Code, for an error that comes as {code, message} (a queued resource's failedData)
_CODES: dict[int, type[CloudError]] = {
    3: CloudInvalidArgument,
    5: CloudNotFound,
    6: CloudAlreadyExists,
    7: CloudPermissionDenied,
    16: CloudPermissionDenied,
    4: CloudUnavailable,
    10: CloudUnavailable,
    13: CloudUnavailable,
    14: CloudUnavailable,
}


def error_class(message: str, code: int | None = None) -> type[CloudError]:
    """The :class:`CloudError` subclass gcloud's (or the API's) words name; ``code``: the
    google.rpc code where one is given (8 and 9 with capacity words are a stockout)."""
    if _CAPACITY.search(message):
        return CloudNoCapacity
    quota = _QUOTA.search(message) and (
        "RESOURCE_EXHAUSTED" in message or code == 8 or "exceeded" in message.lower()
    )
    if quota and not _RATE.search(message):
        return CloudQuotaExhausted
    for pattern, kind in (
        (_DENIED, CloudPermissionDenied),
        (_INVALID, CloudInvalidArgument),
        (_EXISTS, CloudAlreadyExists),
        (_NOT_FOUND, CloudNotFound),
        (_UNAVAILABLE, CloudUnavailable),
    ):
        if pattern.search(message):
            return kind
    return _CODES.get(code, CloudError) if code is not None else CloudError


def error_for(proc: Ran[bytes], *, what: str = "gcloud failed") -> CloudError:
    """The error for a failed call: ``WHAT (exit N): gcloud's words``, typed by them (an
    unexplained exit 2 is gcloud refusing its command line)."""
    message = one_line(proc.stderr)
    kind = error_class(message)
    if kind is CloudError and proc.returncode == 2:
        kind = CloudInvalidArgument
    return kind(f"{what} (exit {proc.returncode}): {message}")


def check(proc: Ran[bytes], *, what: str = "gcloud failed") -> Ran[bytes]:
    """``proc`` when it succeeded; else its typed error (:func:`error_for`) is raised."""
    if proc.returncode != 0:
        raise error_for(proc, what=what)
    return proc


@dataclass(frozen=True)
class Gcloud:
    """A gcloud client: one binary and timeout, calls that raise typed ``CloudError``s, and the
    few Cloud Storage and queued-resource operations the tool makes."""

    binary: str = "gcloud"
    timeout: float = TIMEOUT
    waiting: Waiting | None = field(default=None, compare=False, kw_only=True)  # of a slow call

    @classmethod
    def from_env(cls, waiting: Waiting | None = None) -> Gcloud:
        """``$MULTIHOST_GCLOUD`` and ``$MULTIHOST_GCLOUD_TIMEOUT`` (or their defaults)."""
        return cls(binary(), timeout_from_env(), waiting=waiting)

    def run(self, argv: list[str], *, check: bool = True) -> Ran[bytes]:
        proc = run(argv, gcloud=self.binary, timeout=self.timeout, waiting=self.waiting)
        if check and proc.returncode != 0:
            raise error_for(proc)
        return proc

    def objects(self, prefix: str) -> dict[str, int]:
        """Object URL → size for everything directly under ``prefix``."""
        return self._listed(prefix, storage.list_objects_argv(prefix))

    def existing(self, *urls: str) -> set[str]:
        """Which of these objects (all in one bucket) exist: one gcloud call."""
        return set(self._listed(urls[0], storage.list_urls_argv(list(urls))))

    def _listed(self, url: str, argv: list[str]) -> dict[str, int]:
        out = self.run(argv).stdout
        root = "/".join(url.split("/", 3)[:3])  # gs://BUCKET
        return {f"{root}/{o['name']}": int(o.get("size", 0)) for o in json.loads(out or b"[]")}

    def cat(self, url: str, start: int = 0) -> bytes:
        return self.run(storage.cat_argv(url, start)).stdout

    def cat_many(self, urls: list[str]) -> bytes:
        """The objects' bytes, concatenated in the order given."""
        return self.run(storage.cat_many_argv(urls)).stdout

    def put_bytes(self, data: bytes, url: str) -> None:
        with tempfile.NamedTemporaryFile(prefix="multihost-", suffix=".tmp") as f:
            f.write(data)
            f.flush()
            self.run(storage.cp_argv(f.name, url))

    def queued_state(self, name: str, project: str | None, zone: str | None) -> str | None:
        """The queued resource's ``state.state``; None when it does not exist."""
        proc = self.run(queued.describe_argv(name, project, zone), check=False)
        if proc.returncode != 0:
            error = error_for(proc)
            if "NOT_FOUND" in proc.stderr.decode(
                errors="replace"
            ):  # the API's status, as gcloud prints it
                return None
            raise error
        state: str = json.loads(proc.stdout).get("state", {}).get("state", "UNKNOWN")
        return state

    def delete_queued(self, name: str, project: str | None, zone: str | None) -> bool:
        """Delete the queued resource (its nodes go too); False if it was gone."""
        proc = self.run(queued.delete_argv(name, project, zone), check=False)
        if proc.returncode == 0:
            return True
        error = error_for(proc)
        if "NOT_FOUND" in proc.stderr.decode(
            errors="replace"
        ):  # the API's status, as gcloud prints it
            return False
        raise error
