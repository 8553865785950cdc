"""First contact with TPU VMs: the pure rules (the metadata line, gcloud's test, the CLI line)."""

from __future__ import annotations

from pathlib import Path

from multihost.cloud.tpus import update_metadata_argv
from multihost.fleetops.contact.keys import SSH_KEYS, has_key, key_line, merged, oslogin_on


def test_the_line_and_the_merge_are_gclouds() -> None:
    line = key_line("ann", "ssh-rsa AAAAB3")
    assert line == "ann:ssh-rsa AAAAB3 ann"
    assert has_key("x:y z\nann:ssh-rsa AAAAB3 ann", line)
    assert not has_key(None, line)
    assert not has_key("", line)
    assert merged("", line) == line
    assert merged("a:b c", line) == f"a:b c\n{line}"


def test_update_command_merges_and_guards_commas() -> None:
    argv = update_metadata_argv("n1", "z", "p", SSH_KEYS, "a:b c")
    assert argv == [
        "compute",
        "tpus",
        "tpu-vm",
        "update",
        "n1",
        "--zone=z",
        "--project=p",
        "--update-metadata",
        "ssh-keys=a:b c",
        "--quiet",
        "--format=json",
    ]
    assert "--metadata-from-file" not in " ".join(argv)  # never: it replaces the whole map
    comma = update_metadata_argv("n1", None, None, SSH_KEYS, 'a:b c {"x":1,"y":2}')
    assert comma[-3] == '^;^ssh-keys=a:b c {"x":1,"y":2}'


def test_oslogin_node_first_then_project() -> None:
    assert oslogin_on({"metadata": {"enable-oslogin": "true"}}, None)
    assert not oslogin_on({"metadata": {"enable-oslogin": "FALSE"}}, {"enable-oslogin": "TRUE"})
    assert oslogin_on({"metadata": {}}, {"enable-oslogin": "True"})
    assert not oslogin_on({}, {})


def test_published_keys_replace_what_was_recorded(tmp_path: Path) -> None:
    from multihost.transport.hostkeys import record_pins

    trust = tmp_path / "state" / "known_hosts"
    trust.parent.mkdir()
    trust.write_text("10.0.0.2 ssh-ed25519 OLD\nother ssh-ed25519 KEEP\n")
    n = record_pins(
        [("10.0.0.2", None, ("ssh-ed25519 NEW",)), ("10.0.0.3", 2222, ("ssh-rsa R", "bad"))], trust
    )
    assert n == 2
    assert trust.read_text().splitlines() == [
        "other ssh-ed25519 KEEP",
        "10.0.0.2 ssh-ed25519 NEW",
        "[10.0.0.3]:2222 ssh-rsa R",
    ]
