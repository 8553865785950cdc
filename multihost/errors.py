"""One small exception tree; every per-host error carries its host.

MultihostError
 ├── UsageError                bad input or configuration (exit 2)
 │    ├── InventoryError       a host list or inventory file that cannot be used
 │    ├── DiscoveryError       gcloud missing, failing, or no matching TPU slices
 │    └── SettingError         a setting that cannot be used (also a ValueError)
 ├── KeyRefused                the key first contact added is still refused (.hosts)
 └── HostError                 something went wrong on one host (.host)
      ├── ConnectError         could not connect or log in
      │    ├── HostKeyError    the host key is unknown or does not match
      │    └── ConnectTimeout  (also a TimeoutError)
      ├── RemoteError          a step the runner ran on the host failed
      │    ├── RunNameTaken    the run's directory already exists there
      │    ├── RunDirGone      the run's directory was removed under it
      │    └── EnvFailed       the locked environment could not be built or installed there
      ├── RemoteCallError      a function sent by multihost.call raised there (.results)
      └── HostLost             the connection went away and did not come back
 ├── WarmError                 warm processes did not start, or were used once stopped
 └── CloudError                a gcloud call failed (gcloud's own words, one line)
      ├── GcloudMissing        the Google Cloud CLI is not installed (also a UsageError: exit 2)
      ├── CloudNotFound        the resource, object or bucket does not exist
      ├── CloudPermissionDenied  the account may not do this (or is not logged in)
      ├── CloudQuotaExhausted  the project's quota for this (region, capacity type) is used up
      ├── CloudNoCapacity      the zone has no capacity left (a stockout): try another zone
      ├── CloudInvalidArgument the request (or gcloud's command line) is malformed
      ├── CloudAlreadyExists   a resource of that name exists already
      └── CloudUnavailable     a failure that should pass: 5xx, rate limits, lost connections
           └── CloudTimeout    gcloud took longer than its timeout (also a TimeoutError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multihost.model import Host
    from multihost.results.records import RunResult


class MultihostError(Exception):
    """Base of every error multihost raises on purpose."""


class UsageError(MultihostError):
    """Bad input or configuration: the CLI prints one line and exits 2."""


class InventoryError(UsageError):
    """A host list or inventory file that cannot be used."""


class DiscoveryError(UsageError):
    """Cloud discovery failed: gcloud missing or failing, or no matching slices."""


class SettingError(UsageError, ValueError):
    """A setting that cannot be used (a missing ssh config or code dir): exit 2 on the command
    line, a ValueError to the API's callers."""


class KeyRefused(MultihostError):
    """The key first contact added to a cloud fleet is still refused when the wait for it
    ends: nothing started; ``hosts`` are those that refuse it."""

    def __init__(self, hosts: tuple[Host, ...], message: str) -> None:
        super().__init__(message)
        self.hosts = hosts


class HostError(MultihostError):
    """Something went wrong on one host."""

    def __init__(self, host: Host, message: str) -> None:
        super().__init__(f"{host.name} ({host.target}): {message}")
        self.host = host
        self.message = message


class ConnectError(HostError):
    """Could not connect to or log in to the host."""


class HostKeyError(ConnectError):
    """The host's key is not known, or differs from the recorded one."""


class ConnectTimeout(ConnectError, TimeoutError):
    """Connecting took longer than the connect timeout."""


class RemoteError(HostError):
    """A command the runner itself ran on the host failed."""


class RunDirGone(RemoteError):
    """The run's directory is gone from the host (its processes may live on: ``kill`` finds
    them by the ``MULTIHOST_RUN_DIR`` in their environment)."""


class EnvFailed(RemoteError):
    """The locked environment could not be built, packed or installed on the host (uv's
    cause in the message): nothing started, and trying again without a change fails again."""


class StaleLock(EnvFailed):
    """The builder found ``uv.lock`` out of date with (or unreadable beside) pyproject.toml:
    the run stops as for bad input (exit 2). ``stderr``: what uv said."""

    def __init__(self, host: Host, message: str, stderr: str) -> None:
        super().__init__(host, message)
        self.stderr = stderr


class PortBusy(RemoteError):
    """Host 0 cannot bind the job's coordinator port: nothing may start."""


class RunNameTaken(RemoteError):
    """Claiming the run's directory failed: it exists on the host (or is a symbolic link)."""


class RemoteCallError(HostError):
    """A function sent by ``multihost.call`` raised on a host (the first that failed); the
    message carries its remote traceback, ``.results`` every host's outcome."""

    def __init__(
        self, host: Host, message: str, results: tuple[Any, ...], run: RunResult | None = None
    ) -> None:
        super().__init__(host, message)
        self.results = results
        self.run = run


class HostLost(HostError):
    """The connection to the host was lost and could not be re-established."""


class WarmError(MultihostError):
    """Warm processes (``multihost.session``, ``sweep --warm``) did not start, or were used
    after they were stopped; the message says why, in words."""


class CloudError(MultihostError):
    """A gcloud call failed; the message is gcloud's own, on one line (``multihost.cloud``
    raises the subclass its words name)."""


class GcloudMissing(CloudError, UsageError):
    """The Google Cloud CLI is not installed (``$MULTIHOST_GCLOUD``, default ``gcloud``): a
    UsageError too, so every command says it in one line and exits 2, as for bad input."""


class CloudNotFound(CloudError):
    """NOT_FOUND: the resource, object or bucket does not exist."""


class CloudPermissionDenied(CloudError):
    """PERMISSION_DENIED or UNAUTHENTICATED: the account gcloud uses may not do this."""


class CloudQuotaExhausted(CloudError):
    """RESOURCE_EXHAUSTED for a quota: the project's limit for the region (and that capacity
    type) is used up; another zone of the region does not help."""


class CloudNoCapacity(CloudError):
    """No capacity in the zone (code 8 "no more capacity", code 9 "Insufficient reserved
    capacity"): a stockout of that zone; another zone may have some."""


class CloudInvalidArgument(CloudError):
    """INVALID_ARGUMENT, or a command line gcloud does not understand (its exit 2)."""


class CloudAlreadyExists(CloudError):
    """ALREADY_EXISTS: a resource of that name exists (right after a create, maybe the
    service's own retry of it)."""


class CloudUnavailable(CloudError):
    """A failure that should pass: UNAVAILABLE, 5xx, a rate limit, a lost connection."""


class CloudTimeout(CloudUnavailable, TimeoutError):
    """gcloud took longer than its timeout (and was killed)."""
