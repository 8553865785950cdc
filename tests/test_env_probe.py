"""The environment probe's key without json and platform: the same key as with them, so that
hosts keep their environments; and what it imports in the common case."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from multihost.remote import env_probe
from multihost.remote.staging import python_source

FACTS = {
    "lock": "ab" * 32,
    "python": ["cpython", "3.11.2", "/usr/bin/python3.11"],
    "platform": ["linux", "x86_64", "glibc-2.36"],
    "uv": "0.13.9",
}


@pytest.mark.parametrize(
    "facts",
    [
        FACTS,
        {**FACTS, "uv": "", "platform": ["linux", "aarch64", "unknown"]},
        {**FACTS, "python": ["cpython", "3.13.0rc1", "/opt/py thon/bin/python3"]},
        {**FACTS, "python": ["pypy", "3.10.14", "/opt/é/python3"]},  # json escapes: json itself
        {**FACTS, "python": ["cpython", "3.12.1", 'a"b\\c\t']},
    ],
)
def test_dumps_is_sorted_json(facts: dict[str, str | list[str]]) -> None:
    assert env_probe.dumps(facts) == json.dumps(facts, sort_keys=True)


def test_host_facts_match_platform() -> None:
    assert env_probe.python_version() == platform.python_version()
    assert env_probe.libc_version() == ("-".join(platform.libc_ver()) or "unknown")


def test_probe_imports_neither_json_nor_platform_nor_subprocess(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", "-c", python_source("env_probe"),
         str(tmp_path), "L", "0.13.9", ""],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines() if "|" in ln}
    assert "hashlib" in imported
    assert not {"json", "platform", "subprocess"} & imported
    assert out.stdout.startswith("key=")
