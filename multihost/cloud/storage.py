"""Command lines of ``gcloud storage``: list, cat, cp (pure builders, no binary)."""

from __future__ import annotations


def list_objects_argv(prefix: str) -> list[str]:
    """Every object directly under ``prefix`` (no trailing ``/``), with its size."""
    return list_urls_argv([f"{prefix}/*"])


def list_urls_argv(urls: list[str]) -> list[str]:
    """One listing for several URLs or wildcards; those that match nothing are left out."""
    return ["storage", "objects", "list", *urls, "--format=json(name,size)"]


def cat_argv(url: str, start: int = 0) -> list[str]:
    """The object's bytes, from byte ``start`` on."""
    return ["storage", "cat", *(["-r", f"{start}-"] if start else []), url]


def cat_many_argv(urls: list[str]) -> list[str]:
    """The objects' bytes, concatenated in the order given."""
    return ["storage", "cat", *urls]


def cp_argv(src: str, dst: str) -> list[str]:
    return ["storage", "cp", src, dst]
