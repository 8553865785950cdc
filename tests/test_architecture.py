"""The import graph has no cycle at all, type-checking imports included (pyproject's import
contracts say which way each import may go; this says that none comes back around)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_are_found() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle() -> None:
    graph = grimp.build_graph("multihost", exclude_type_checking_imports=False)
    modules = {m for m in graph.modules if m.startswith("multihost")}
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    problems = []
    for component in _cycles(edges):
        members = set(component)
        lines = [
            f"  {m}:{d['line_number']} imports {w}"
            for m in component
            for w in sorted(edges[m] & members)
            for d in graph.get_import_details(importer=m, imported=w)
        ]
        problems.append(f"a cycle through {len(component)} modules:\n" + "\n".join(lines))
    assert not problems, "\n".join(problems)


def test_the_import_contracts_are_kept() -> None:
    """pyproject's contracts (layers, asyncssh and rich where they belong, acyclic siblings),
    as CI's ``lint-imports`` checks them: here too, so the pure tier says so first."""
    check = (
        "from importlinter.cli import lint_imports; "
        "raise SystemExit(lint_imports(no_cache=True, no_logo=True))"
    )
    res = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


MAX_LINES = 400  # a module is read whole: past this, split it by what it holds
OVER_MAX = {
    # asyncssh's one seam: connections, channels, hops, keys and their errors, kept together
    "multihost/transport/ssh.py": "the SSH transport",
}


def test_no_module_is_over_the_size_limit() -> None:
    files = (REPO / "multihost").rglob("*.py")
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in files}
    over = [f"{path}: {n} lines" for path, n in sorted(sizes.items()) if n > MAX_LINES]
    over = [line for line in over if line.split(":")[0] not in OVER_MAX]
    assert not over, f"over {MAX_LINES} lines (split by what it holds): {over}"
    assert set(OVER_MAX) <= set(sizes), "an exception names a module that is gone"
