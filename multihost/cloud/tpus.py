"""Command lines of the TPU VM surface: discovery's list, guest attributes, metadata updates,
the IAP tunnel, and the project and OS Login reads of first contact (pure builders)."""

from __future__ import annotations

from multihost.cloud.queued import dict_flag, where

TPU_VM = ("compute", "tpus", "tpu-vm")


def list_argv(project: str | None = None, zone: str | None = None) -> list[str]:
    """``tpu-vm list --format=json``: every node (discovery's one call)."""
    return [*TPU_VM, "list", "--format=json", *where(project, zone)]


def guest_attributes_argv(node: str, project: str | None, zone: str | None) -> list[str]:
    """``tpu-vm get-guest-attributes NODE``: every worker's rows (key, namespace, value,
    worker_id), host keys and ``deviceInfo/hostname`` among them."""
    return [*TPU_VM, "get-guest-attributes", node, *where(project, zone), "--format=json"]


def update_metadata_argv(
    node: str, zone: str | None, project: str | None, key: str, value: str
) -> list[str]:
    """``tpu-vm update NODE --update-metadata KEY=VALUE``: merged into the node's map by the
    CLI (never ``--metadata-from-file``, which replaces the whole map); a value with commas
    goes with gcloud's ``^DELIM^`` prefix so it stays one value."""
    scope = ([f"--zone={zone}"] if zone else []) + ([f"--project={project}"] if project else [])
    return [
        *TPU_VM,
        "update",
        node,
        *scope,
        "--update-metadata",
        dict_flag({key: value}),
        "--quiet",
        "--format=json",
    ]


def iap_tunnel_argv(gcloud: str, instance: str, project: str, zone: str) -> tuple[str, ...]:
    """The ProxyCommand that reaches a worker through IAP (``%p`` left for ssh to fill in), as
    ``gcloud alpha compute tpus tpu-vm ssh --tunnel-through-iap`` builds it; ssh runs it."""
    return (
        gcloud,
        "alpha",
        "compute",
        "start-iap-tunnel",
        instance,
        "%p",
        "--listen-on-stdin",
        f"--project={project}",
        f"--zone={zone}",
        "--verbosity=warning",
    )


def project_info_argv(project: str | None) -> list[str]:
    """``compute project-info describe``: the project's ``commonInstanceMetadata``."""
    return [
        "compute",
        "project-info",
        "describe",
        "--format=json",
        *([f"--project={project}"] if project else []),
    ]


def oslogin_profile_argv(project: str | None) -> list[str]:
    """``compute os-login describe-profile``: the user's POSIX accounts and keys."""
    return [
        "compute",
        "os-login",
        "describe-profile",
        *([f"--project={project}"] if project else []),
        "--format=json",
    ]


def oslogin_add_key_argv(public_file: str, project: str | None) -> list[str]:
    """``compute os-login ssh-keys add --key-file FILE``: the key into the OS Login profile."""
    return [
        "compute",
        "os-login",
        "ssh-keys",
        "add",
        f"--key-file={public_file}",
        *([f"--project={project}"] if project else []),
        "--format=json",
    ]


def default_zone_argv() -> list[str]:
    """``config get compute/zone``: gcloud's default zone (``CLOUDSDK_COMPUTE_ZONE`` or the
    active configuration's); it prints nothing on stdout when none is set."""
    return ["config", "get", "compute/zone"]
