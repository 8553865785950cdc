"""A control plane that fails for a while is waited out, not believed.

``PatientGcloud`` is a ``Gcloud`` whose every call is retried while gcloud's failure is
transient (5xx, UNAVAILABLE, a reset or aborted connection, a timeout, a rate limit), with
jittered exponential backoff. The calls of one watcher share one *episode*: the first failure
says so once, the first success after it says how long it lasted; a failure that lasts past
``timeout`` seconds, or one that is not transient (403 PERMISSION_DENIED, a bucket that does
not exist), ends it with a ``CloudError`` that says which.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from multihost.cloud.gcloud import Gcloud, Ran, error_class, one_line
from multihost.errors import CloudTimeout, CloudUnavailable

# gcloud's words for a failure that should pass: the API's status, the HTTP code, the
# connection's fate (apitools and the storage client each say it their own way)
_TRANSIENT = re.compile(
    r"UNAVAILABLE|INTERNAL|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|"
    r"\b(429|500|502|503|504)\b|Connection ?(reset|aborted|refused|Error)|"
    r"RemoteDisconnected|timed out|Timeout|Temporary failure|Rate ?limit|took over",
    re.IGNORECASE,
)
_DENIED = re.compile(r"PERMISSION_DENIED|does not have permission|UNAUTHENTICATED|\b40[13]\b")
_NO_BUCKET = re.compile(r"gs://[^ /]+ not found: 404|bucket .* does not exist|NoSuchBucket", re.I)


def classify(message: str) -> str:
    """``denied``, ``no-bucket``, ``transient`` or ``other`` for gcloud's error text."""
    if _DENIED.search(message):
        return "denied"
    if _NO_BUCKET.search(message):
        return "no-bucket"
    if _TRANSIENT.search(message):
        return "transient"
    return "other"


def backoff(failures: int, timeout: float) -> float:
    """Seconds to wait before retry ``failures`` (1, 2, ...): full jitter on an exponential
    that starts at a tenth of its cap; the cap is 30 s, or a tenth of ``timeout`` if less."""
    cap = min(30.0, timeout / 10)
    return random.uniform(0, min(cap, cap / 10 * 2 ** (failures - 1)))


@dataclass
class Episode:
    """A run of transient failures shared by every call of one watcher (threads included)."""

    timeout: float
    warn: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    lock: threading.Lock = field(default_factory=threading.Lock)
    since: float | None = None
    failed_calls: int = 0

    def failed(self, message: str) -> float:
        """Count one transient failure; the wait before its retry (CloudError when over)."""
        with self.lock:
            now = self.clock()
            if self.since is None:
                self.since, self.failed_calls = now, 0
                self.warn(
                    f"the control plane is failing ({message}); retrying for up to "
                    f"{self.timeout:g}s (--control-plane-timeout), the job keeps its place"
                )
            self.failed_calls += 1
            lasted = now - self.since
        if lasted > self.timeout:
            raise CloudUnavailable(
                f"the control plane kept failing for {lasted:.0f}s (over "
                f"--control-plane-timeout {self.timeout:g}s); last: {message}. The job itself "
                "may still be running: multihost job watch NAME follows it again"
            )
        return min(backoff(self.failed_calls, self.timeout), self.timeout - lasted + 0.1)

    def ok(self) -> None:
        with self.lock:
            if self.since is None:
                return
            lasted, calls = self.clock() - self.since, self.failed_calls
            self.since = None
        self.warn(f"the control plane answers again after {lasted:.0f}s ({calls} failed calls)")


@dataclass(frozen=True)
class PatientGcloud(Gcloud):
    """``Gcloud`` that retries transient failures within one ``Episode``."""

    episode: Episode = field(default_factory=lambda: Episode(300.0, lambda _: None))
    sleep: Callable[[float], None] = time.sleep

    @classmethod
    def around(
        cls, gcloud: Gcloud, *, timeout: float, warn: Callable[[str], None]
    ) -> PatientGcloud:
        return cls(gcloud.binary, gcloud.timeout, Episode(timeout, warn), waiting=gcloud.waiting)

    def run(self, argv: list[str], *, check: bool = True) -> Ran[bytes]:
        while True:
            try:
                proc = super().run(argv, check=False)
            except CloudTimeout as exc:  # gcloud took too long: as transient as a 503
                self.sleep(self.episode.failed(str(exc)))
                continue
            if proc.returncode == 0:
                self.episode.ok()
                return proc
            message = one_line(proc.stderr.decode(errors="replace"))
            kind = classify(message)
            if kind == "transient":
                self.sleep(self.episode.failed(message))
                continue
            self.episode.ok()  # it answered, if not what we hoped
            typed = error_class(message)
            if kind == "denied":
                raise typed(
                    f"permission denied by the control plane: {message} — check the account "
                    "gcloud uses (gcloud auth list) and its roles on the project and bucket"
                )
            if kind == "no-bucket":
                raise typed(f"the job's bucket is gone: {message}")
            if not check:
                return proc
            raise typed(f"gcloud failed (exit {proc.returncode}): {message}")
