"""What the stand-in cloud is to gcloud: its project, zone and bucket, the settings that point
the real gcloud CLI at its servers, and a free port for one of them."""

from __future__ import annotations

import socket

BUCKET = "mh-test"
ZONE = "us-central2-b"
PROJECT = "p"


def gcloud_env(config_dir: str, tpu: str, storage: str, secrets: str) -> dict[str, str]:
    """The settings that point the real gcloud CLI at the stand-ins."""
    return {
        "CLOUDSDK_CONFIG": config_dir,
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "CLOUDSDK_CORE_PROJECT": PROJECT,
        "CLOUDSDK_COMPUTE_ZONE": ZONE,
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": tpu,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": storage,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER": secrets,
        # the compute API's project (``project-info describe``) and OS Login: the TPU stand-in
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{tpu}compute/v1/",
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_OSLOGIN": tpu,
    }


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now at ``address``."""
    with socket.socket() as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port
