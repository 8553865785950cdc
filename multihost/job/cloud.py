"""Every gcloud command line of the job path (pure builders) and the one class that runs them.

The ``gcloud`` binary is ``$MULTIHOST_GCLOUD`` (default ``gcloud``), as for discovery.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass

from multihost.errors import MultihostError
from multihost.job.record import JobRecord, JobRecordError, resource_name, save_local

QR = ("compute", "tpus", "queued-resources")
GONE_STATES = ("SUSPENDING", "SUSPENDED", "FAILED")


class CloudError(MultihostError):
    """A gcloud call failed (the message is gcloud's own, on one line)."""


def _where(project: str | None, zone: str | None) -> list[str]:
    return [*(["--project", project] if project else []), *(["--zone", zone] if zone else [])]


def create_argv(record: JobRecord, script: str) -> list[str]:
    """``queued-resources create`` for the record's current attempt; ``script``: a file."""
    name = record.resource
    argv = [*QR, "create", name, "--accelerator-type", record.tpu_type,
            "--runtime-version", record.runtime_version]  # fmt: skip
    if record.num_slices > 1:
        argv += ["--node-count", str(record.num_slices), "--node-prefix", name]
    else:
        argv += ["--node-id", name]
    if record.capacity != "on-demand":
        argv.append(f"--{record.capacity}")
    argv += ["--metadata-from-file", f"startup-script={script}", "--async"]
    return argv + _where(record.project, record.zone)


def describe_argv(record: JobRecord) -> list[str]:
    return [*QR, "describe", record.resource, "--format", "json",
            *_where(record.project, record.zone)]  # fmt: skip


def delete_argv(record: JobRecord, attempt: int | None = None) -> list[str]:
    name = resource_name(record.name, record.attempt if attempt is None else attempt)
    return [*QR, "delete", name, "--force", "--async", "--quiet",
            *_where(record.project, record.zone)]  # fmt: skip


def list_objects_argv(prefix: str) -> list[str]:
    return list_urls_argv([f"{prefix}/*"])


def list_urls_argv(urls: list[str]) -> list[str]:
    """One listing for several URLs or wildcards; those that match nothing are left out."""
    return ["storage", "objects", "list", *urls, "--format=json(name,size)"]


def cat_argv(url: str, start: int = 0) -> list[str]:
    return ["storage", "cat", *(["-r", f"{start}-"] if start else []), url]


def cp_argv(src: str, dst: str) -> list[str]:
    return ["storage", "cp", src, dst]


def one_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("ERROR:")]
    text = " ".join(lines[starts[0] :] if starts else lines[-2:]) or "(no message)"
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass(frozen=True)
class Gcloud:
    """Runs gcloud; failures become one-line ``CloudError``s."""

    binary: str = "gcloud"
    timeout: float = 120.0

    @classmethod
    def from_env(cls) -> Gcloud:
        return cls(os.environ.get("MULTIHOST_GCLOUD", "gcloud"))

    def run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        full = [self.binary, *argv]
        try:
            proc = subprocess.run(full, capture_output=True, timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise CloudError(f"{self.binary!r} not found: install the Google Cloud CLI") from None
        except subprocess.TimeoutExpired:
            raise CloudError(f"gcloud took over {self.timeout:g}s: {shlex.join(full)}") from None
        if check and proc.returncode != 0:
            message = one_line(proc.stderr.decode(errors="replace"))
            raise CloudError(f"gcloud failed (exit {proc.returncode}): {message}")
        return proc

    def objects(self, prefix: str) -> dict[str, int]:
        """Object URL → size for everything directly under ``prefix``."""
        return self._listed(prefix, list_objects_argv(prefix))

    def existing(self, *urls: str) -> set[str]:
        """Which of these objects (all in one bucket) exist: one gcloud call."""
        return set(self._listed(urls[0], list_urls_argv(list(urls))))

    def _listed(self, url: str, argv: list[str]) -> dict[str, int]:
        out = self.run(argv).stdout
        root = "/".join(url.split("/", 3)[:3])  # gs://BUCKET
        return {f"{root}/{o['name']}": int(o.get("size", 0)) for o in json.loads(out or b"[]")}

    def cat(self, url: str, start: int = 0) -> bytes:
        return self.run(cat_argv(url, start)).stdout

    def cat_many(self, urls: list[str]) -> bytes:
        """The objects' bytes, concatenated in the order given."""
        return self.run(["storage", "cat", *urls]).stdout

    def put_bytes(self, data: bytes, url: str) -> None:
        with tempfile.NamedTemporaryFile(prefix="multihost-", suffix=".tmp") as f:
            f.write(data)
            f.flush()
            self.run(cp_argv(f.name, url))

    def describe_state(self, record: JobRecord) -> str | None:
        """The queued resource's ``state.state``; None when it does not exist."""
        proc = self.run(describe_argv(record), check=False)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace")
            if "NOT_FOUND" in err:  # the API's status, as gcloud prints it
                return None
            raise CloudError(f"gcloud failed (exit {proc.returncode}): {one_line(err)}")
        state: str = json.loads(proc.stdout).get("state", {}).get("state", "UNKNOWN")
        return state

    def create(self, record: JobRecord, script: str) -> None:
        with tempfile.NamedTemporaryFile("w", prefix="multihost-startup-", suffix=".sh") as f:
            f.write(script)
            f.flush()
            self.run(create_argv(record, f.name))

    def delete(self, record: JobRecord, attempt: int | None = None) -> bool:
        """Delete the attempt's queued resource (its nodes go too); False if it was gone."""
        proc = self.run(delete_argv(record, attempt), check=False)
        if proc.returncode == 0:
            return True
        err = proc.stderr.decode(errors="replace")
        if "NOT_FOUND" in err:  # the API's status, as gcloud prints it
            return False
        raise CloudError(f"gcloud failed (exit {proc.returncode}): {one_line(err)}")

    def save_record(self, record: JobRecord) -> None:
        save_local(record)
        self.put_bytes(record.to_json().encode(), record.record_url)

    def load_record(self, record: JobRecord) -> JobRecord:
        """The bucket's copy of the record (the truth), mirrored locally."""
        try:
            fresh = JobRecord.from_json(self.cat(record.record_url))
        except JobRecordError as exc:
            raise JobRecordError(f"the bucket's record {record.record_url}: {exc}") from None
        if fresh.name != record.name:
            raise JobRecordError(f"the bucket's record {record.record_url} names {fresh.name!r}")
        save_local(fresh)
        return fresh
