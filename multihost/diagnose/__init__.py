"""Hangs and stragglers: where every host is, right now (stacks, grouped across hosts)."""
