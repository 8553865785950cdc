"""Command lines of ``gcloud secrets`` (Secret Manager): pure builders, no binary."""

from __future__ import annotations


def access_argv(name: str, project: str | None = None) -> list[str]:
    """The secret's latest version, printed on stdout."""
    return [
        "secrets",
        "versions",
        "access",
        "latest",
        "--secret",
        name,
        *(["--project", project] if project else []),
    ]
