"""The docs pages read from the code are current: the CLI reference names every flag of every
command, and the architecture page's layers are pyproject.toml's import contract."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from multihost.cli.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _gen()


def _sections(page: str) -> dict[str, str]:
    """The CLI page by command: ``run`` or ``job submit`` -> its section's text."""
    parts = re.split(r"^#{2,3} multihost ?(.*)$", page, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_cli_reference_is_current() -> None:
    committed = gen.CLI_PAGE.read_text()
    assert committed == gen.cli_reference(), "docs/reference/cli.md is stale: python docs/gen.py"


def test_cli_reference_names_every_flag_of_every_command() -> None:
    sections = _sections(gen.CLI_PAGE.read_text())
    commands = list(gen._commands(build_parser()))
    assert len(commands) > 20
    missing = []
    for path, _, parser in commands:
        text = sections.get(" ".join(path), "")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            for option in action.option_strings or [str(action.metavar or action.dest)]:
                if f"`{option}" not in text and f"/ {option}" not in text:
                    missing.append(f"multihost {' '.join(path)} {option}")
    assert not missing, f"not in docs/reference/cli.md: {missing}"


def test_architecture_layers_are_pyproject_contract() -> None:
    page = gen.ARCH_PAGE.read_text()
    assert page == gen.architecture_page(page), "docs/architecture.md is stale: python docs/gen.py"
    block = page[page.index(gen.LAYERS_START) : page.index(gen.LAYERS_END)]
    for _, run in gen.layers():
        for layer in run:
            row = ", ".join(f"`{m.strip()}`" for m in layer.split("|"))
            assert f" | {row} | " in block


def test_gen_check_passes_on_the_committed_pages() -> None:
    assert gen.main(["--check"]) == 0


def test_api_reference_documents_every_public_name() -> None:
    import multihost

    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    missing = [name for name in multihost.__all__ if f"::: multihost.{name}\n" not in page]
    assert not missing, f"not in docs/reference/api.md: {missing}"


def test_every_page_is_in_the_nav() -> None:
    """A page left out of mkdocs.yml's nav is built but never found."""
    nav = (ROOT / "mkdocs.yml").read_text()
    docs = ROOT / "docs"
    pages = [p.relative_to(docs).as_posix() for p in docs.rglob("*.md") if "notes" not in p.parts]
    missing = [page for page in pages if f": {page}\n" not in nav]
    assert not missing, f"not in mkdocs.yml's nav: {missing}"


# A ticket's number: "issue N" (or "issueN", as in a section key), "#N" (not "&#N;" entities,
# URL fragments or "#N-" ranges), "item N" and "goal N" of a ticket's list.
TICKET = re.compile(r"\b[Ii]ssues? ?\d+|(?<![\w&/])#\d+\b(?!-)|\b[Ii]tems? \d+\b|\b[Gg]oals? \d+\b")


def _tickets(files: list[Path]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{n}: {m.group()}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        for m in TICKET.finditer(line)
    ]


def test_no_issue_numbers_in_the_docs() -> None:
    """The docs say what and why, not which ticket asked for it (its number goes stale)."""
    pages = [ROOT / "README.md", ROOT / "mkdocs.yml"]
    pages += [p for p in (ROOT / "docs").rglob("*.md") if "notes" not in p.parts]
    found = _tickets(pages)
    assert not found, found


def test_no_issue_numbers_in_the_code() -> None:
    """Comments, docstrings and test names say what and why, not which ticket asked for it:
    the package, the payloads, the tests, the benchmarks and their results, the CI scripts."""
    files = [ROOT / "pyproject.toml", ROOT / "benchmarks" / "RESULTS.md"]
    files += sorted((ROOT / "benchmarks").glob("*.py"))
    for top in ("multihost", "payloads", "tests", ".ci"):
        tree = sorted((ROOT / top).rglob("*"))
        files += [p for p in tree if p.suffix in {"", ".py", ".sh", ".md"} and p.is_file()]
    found = _tickets(files)
    assert not found, found


def test_what_users_read_imports_only_the_public_names() -> None:
    """The README, the site's user pages, the payloads and the notebook examples import from
    ``multihost`` itself (its ``__all__``), never from a module inside it: those are private,
    free to move, as httpx's ``_client`` is. The architecture page is about the modules."""
    import multihost

    places = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    places += sorted((ROOT / "payloads").rglob("*.py"))
    private = re.compile(r"^\s*(?:from|import)\s+multihost\.(?!payloads\b)[\w.]+", re.M)
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
        for p in places
        if p.name != "architecture.md"
        for m in private.finditer(p.read_text())
    ]
    assert not found, found
    named = re.compile(r"^\s*from\s+multihost\s+import\s+\(?([\w, \n]+)\)?", re.M)
    for p in places:
        for m in named.finditer(p.read_text()):
            names = {n.strip() for n in m.group(1).replace("\n", ",").split(",") if n.strip()}
            assert names <= set(multihost.__all__), (p.name, names - set(multihost.__all__))
