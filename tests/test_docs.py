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


def test_cli_reference_is_written_for_users() -> None:
    """The page's own text (before the first command) says how to get help and read the page:
    no source file, no class of the code, no regenerating; each command lists its flags under
    the headings its --help has, in that order."""
    page = gen.CLI_PAGE.read_text()
    visible = re.sub(r"<!--.*?-->", "", page[: page.index("## multihost\n")], flags=re.S)
    for word in (".py`", "`multihost/", "Flag.", "GROUPS", "gen.py", "schema"):
        assert word not in visible, word
    sections = _sections(page)
    for path, _, parser in gen._commands(build_parser()):
        text = sections[" ".join(path)]
        shown = [
            str(g.title)
            for g in parser._action_groups
            if any(
                a.option_strings and not isinstance(a, argparse._HelpAction)
                for a in g._group_actions
            )
        ]
        headings = [h for h in re.findall(r"^\*\*(.+?)\*\*$", text, flags=re.M) if h != "Arguments"]
        if shown == [gen.OTHER] and "**Arguments**" not in text:
            shown = []  # argparse's own heading alone is not shown
        assert [h.lower() for h in headings] == [s.lower() for s in shown], path


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


def test_api_reference_names_the_run_flags_that_are_not_keywords() -> None:
    """The API page says a setting of ``multihost run`` is a keyword, and lists the flags that
    are not: that list is exactly the run flags the API refuses."""
    from multihost.api.keywords import accepted

    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    said = page[page.index("- **Not keywords**") :].split("\n- ")[0].split("\n\n")[0]
    listed = set(re.findall(r"`(--[\w-]+)`", said))
    run = dict((path, parser) for path, _, parser in gen._commands(build_parser()))[("run",)]
    refused = {
        option
        for action in run._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
        if action.dest not in accepted("run")
        for option in action.option_strings
        if option.startswith("--")
    }
    assert listed == refused, (
        f"listed, not refused: {listed - refused}; refused, not listed: {refused - listed}"
    )


def test_readme_names_what_a_test_session_leaves() -> None:
    """What tests/conftest.py lets a session leave (the fleet's dir and users, the users' lock,
    the test sites under /opt) is what the README's "Run the tests" says stays."""
    from tests import fleet

    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Run the tests")
    section = readme[start : readme.index("\n## ", start)]
    stays = ["/tmp/multihost-fleet", "mhw0", str(fleet.USERS_LOCK), *map(str, fleet.PURGED)]
    stays += ["/tmp/pytest-of-$USER"]
    missing = [s for s in stays if f"`{s}" not in section]
    assert not missing, f"not in the README's Run the tests: {missing}"
    assert "left behind by this session" in section


def test_every_page_is_in_the_nav() -> None:
    """A page left out of mkdocs.yml's nav is built but never found."""
    nav = (ROOT / "mkdocs.yml").read_text()
    docs = ROOT / "docs"
    pages = [p.relative_to(docs).as_posix() for p in docs.rglob("*.md")]
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
    pages += sorted((ROOT / "docs").rglob("*.md"))
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


# -- every name and path the docs and the docstrings give is there ------------------------------
# A reference to code is checked where it can be: a dotted ``multihost.x.y`` anywhere, a path of
# the repository or the package (``multihost/remote/job_startup.sh``, ``cli/report.py``,
# ``payloads/train.py``), a ``module.name`` in backticks whose first part is a module of the
# package or a payload (``commands.plan_hosts``), and a docstring's ``:func:`...``` target.
# Paths and names of the user's own (``train.py``, ``out/metrics.json``, ``args.x``) are not:
# a path is checked only under a folder of this repository, a name only after a module's name.
_PACKAGE = ROOT / "multihost"
_EXTENSIONS = {
    *("py", "sh", "toml", "json", "jsonl", "md", "txt", "yml", "yaml", "log", "csv", "lock"),
    *("html", "cfg", "ini", "whl", "tar", "gz", "zst", "pid", "npz", "ipynb", "png", "css", "out"),
}
_DOTTED = re.compile(r"(?<![\w./-])multihost(?:\.[A-Za-z_]\w*)+")
_CODE = re.compile(r"``?([^`\s]+?)``?")
_ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc|obj|const):`[!~]?([^`]+)`")
_PATH = re.compile(r"(?<![\w./~$:-])((?:\.?[\w-]+/)+[\w.*-]*)")
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
# `args` is argparse's Namespace in every function that has one, not multihost.cli.args
_VARIABLES = {"args"}


def _modules() -> dict[str, list[str]]:
    """The package's modules and the payloads by their last name: ``plan`` -> its modules."""
    import pkgutil

    import multihost

    found: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(multihost.__path__, "multihost."):
        found.setdefault(info.name.rsplit(".", 1)[1], []).append(info.name)
    for path in sorted((ROOT / "payloads").glob("*.py")):
        found.setdefault(path.stem, []).append(f"payloads.{path.stem}")
    return found


_BY_NAME = _modules()


def _payload_names(stem: str) -> set[str]:
    """The top-level names a payload defines, read without importing it (it imports JAX)."""
    import ast

    path = ROOT / "payloads" / f"{stem}.py"
    if not path.is_file():
        return set()
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _has(obj: object, name: str) -> tuple[bool, object]:
    """``obj.name``: an attribute, a dataclass field or an annotation, or (on a class) an
    attribute its methods set on ``self``."""
    import inspect

    if hasattr(obj, name):
        return True, getattr(obj, name)
    if isinstance(obj, type):
        fields = getattr(obj, "__dataclass_fields__", {})
        if name in fields or name in getattr(obj, "__annotations__", {}):
            return True, None
        try:
            return f"self.{name} " in inspect.getsource(obj), None
        except (OSError, TypeError):
            return False, None
    return False, None


def _resolves(dotted: str) -> bool:
    """A module, or an attribute of one, by its full dotted name."""
    return _RESOLVED.setdefault(dotted, _look_up(dotted))


_RESOLVED: dict[str, bool] = {}


def _look_up(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    if parts[:2] == ["multihost", "payloads"]:  # the wheel's name for payloads/
        parts = parts[1:]
    if parts[0] == "payloads":
        if len(parts) == 1:
            return True
        if not (ROOT / "payloads" / f"{parts[1]}.py").is_file():
            return False
        return len(parts) == 2 or parts[2] in _payload_names(parts[1])
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            spec = None
        if spec is None:
            continue
        if i == len(parts):
            return True
        obj: object = importlib.import_module(name)
        for part in parts[i:]:
            found, obj = _has(obj, part)
            if not found:
                return False
            if obj is None:  # a field: nothing further to look into
                return True
        return True
    return False


def _module_name(token: str) -> str | None:
    """``module.name`` (or ``.name.attr``) whose first part is a module of the package or a
    payload; None for anything else (``config.toml``, ``jax.jit``, ``r.result()``)."""
    token = token.removesuffix("()").rstrip(":,.")
    if not _NAME.fullmatch(token):
        return None
    first, *_, last = token.split(".")
    if last in _EXTENSIONS or first not in _BY_NAME or first in _VARIABLES:
        return None
    return token


def _module_name_resolves(token: str) -> bool:
    first, rest = token.split(".", 1)
    return any(_resolves(f"{module}.{rest}") for module in _BY_NAME[first])


def _path_roots() -> set[str]:
    """The folders a checked path may start with: the repository's and the package's."""
    roots = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in {".git", "site"}}
    roots |= {p.name for p in _PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    roots |= {p.name for p in (ROOT / "docs").iterdir() if p.is_dir()}
    return roots - {".venv", "build", "dist"}


_ROOTS = _path_roots()


def _path_exists(path: str, here: Path) -> bool:
    """``path`` under the repository, the package, the docs or the file's own folder."""
    path = path.rstrip(".")
    if path.startswith("multihost/payloads"):  # the wheel's name for payloads/
        path = path.removeprefix("multihost/")
    for base in (ROOT, _PACKAGE, ROOT / "docs", here):
        if "*" in path:
            if any(base.glob(path)):
                return True
        elif (base / path).exists() or (base / f"{path.rstrip('/')}.py").is_file():
            return True
    return False


def _broken(line: str, here: Path) -> list[str]:
    """What one line of text names that is not there: dotted names and paths."""
    found = [m.group() for m in _DOTTED.finditer(line) if not _resolves(m.group())]
    for m in _PATH.finditer(line):
        path = m.group(1)
        if path.split("/")[0] in _ROOTS and not _path_exists(path, here):
            found.append(path)
    return found


def _doc_lines() -> list[tuple[Path, int, str]]:
    pages = [ROOT / "README.md", ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md"))]
    return [(p, n, line) for p in pages for n, line in enumerate(p.read_text().splitlines(), 1)]


def _code_texts(path: Path) -> list[tuple[int, str, set[str]]]:
    """A module's comments and docstrings, line by line, each with the parameter names of the
    function it documents (``job.workers`` in a function of ``job`` is that argument's)."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    tree = ast.parse(source)
    every_param = {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
    texts = [
        (tok.start[0], tok.string, every_param)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = node.body[0] if node.body else None
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
            continue
        if not isinstance(doc.value.value, str):
            continue
        params: set[str] = set()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        source_lines = ast.get_source_segment(source, doc.value) or ""
        texts += [(doc.lineno + i, t, params) for i, t in enumerate(source_lines.splitlines())]
    return texts


def _role_resolves(target: str, module: str, package: str) -> bool:
    """A docstring's ``:func:`X``` target: absolute, relative to its package (``.slot``), a
    name of its module or of its package, a builtin, or ``module.name`` as in the docs."""
    target = target.strip().removesuffix("()")
    if target.startswith("."):
        candidates = [package + target, module + target]
    else:
        candidates = [target, f"{module}.{target}", f"{package}.{target}", f"builtins.{target}"]
        if _module_name(target):
            first, rest = target.split(".", 1)
            candidates += [f"{m}.{rest}" for m in _BY_NAME[first]]
    return any(_resolves(c) for c in candidates)


def test_the_docs_and_docstrings_name_only_what_exists() -> None:
    """Every dotted ``multihost.…`` name, every path of the repository or the package, and
    every ``module.name`` in backticks, in the docs pages, the README, mkdocs.yml and the
    package's docstrings and comments, names a module, an attribute or a file that exists."""
    broken: list[str] = []
    for path, n, line in _doc_lines():
        where = f"{path.relative_to(ROOT)}:{n}"
        names = [m.group(1) for m in _CODE.finditer(line)]
        wrong = [t for t in map(_module_name, names) if t and not _module_name_resolves(t)]
        broken += [f"{where}: {what}" for what in _broken(line, path.parent) + wrong]
    for path in sorted(_PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for n, text, params in _code_texts(path):
            where = f"{path.relative_to(ROOT)}:{n}"
            wrong = _broken(text, path.parent)
            wrong += [
                t
                for t in (m.group(1) for m in _ROLE.finditer(text))
                if not _role_resolves(t, module, package)
            ]
            for m in _CODE.finditer(_ROLE.sub("", text)):
                token = _module_name(m.group(1))
                if token is None or token.split(".")[0] in params:
                    continue
                if not (_module_name_resolves(token) or _resolves(f"{module}.{token}")):
                    wrong.append(token)
            broken += [f"{where}: {what}" for what in dict.fromkeys(wrong)]
    for path in sorted(_PACKAGE.rglob("*.sh")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                broken += [f"{path.relative_to(ROOT)}:{n}: {w}" for w in _broken(line, path.parent)]
    assert not broken, (
        "names and paths that are not there (a module renamed or moved, a function gone: name "
        "what is there now):\n" + "\n".join(broken)
    )


def test_the_name_check_sees_what_is_gone() -> None:
    """The check above against lines of each kind: what is gone is found, what is there and
    what is the user's own are not."""
    here = ROOT / "docs"
    assert _broken("multihost.core.slot, `multihost.results.records.Staging`", here) == [
        "multihost.core.slot"
    ]
    paths = "cli/gone.py, core/start.py, remote/job_startup.sh, payloads/train.py, tests/"
    assert _broken(paths, here) == ["cli/gone.py"]
    assert _broken("docs/notes/, multihost/remote/env_*.sh, multihost/payloads/steps.py", here) == [
        "docs/notes/"
    ]
    assert _broken("your train.py, out/metrics.json, ~/.config/multihost/config.toml", here) == []
    tokens = ["plan.plan_hosts", "record.write_records", "commands.plan_hosts", "steps.Hooks"]
    tokens += ["config.toml", "jax.jit", "args.config", "r.result()", "core.Run.execute"]
    gone = [t for t in tokens if _module_name(t) and not _module_name_resolves(t)]
    assert gone == ["plan.plan_hosts", "record.write_records"]
    assert not _role_resolves(".slot", "multihost.core", "multihost.core")
    assert _role_resolves(".livehost.LiveHost", "multihost.core", "multihost.core")
    assert _role_resolves("Detached", "multihost.bridge", "multihost")


# -- warnings are admonitions, figures live on the performance page -----------------------------
_FENCE = re.compile(r"^\s*(```|~~~)")
_ADMONITION = re.compile(r"^(\s*)(?:!!!|\?\?\?\+?) ?\w")
# A paragraph (or list item) that opens with a prose warning: "Note:", "Warning:", "Careful:",
# "Caution:", "Important:", or any of them (and "Beware") set in bold or italics.
_WORDS = "Note|Notes|Warning|Careful|Caution|Important|Beware"
_PROSE_WARNING = re.compile(
    rf"^(?:>\s*)?(?:(?:[-*+]|\d+\.)\s+)?(?:(?:{_WORDS})\s*:|[*_]{{1,2}}(?:{_WORDS})\b)"
)
# A measurement: a table row holding a ratio such as "0.47×" or "(1.30×)" (not a shape such as
# "4×4×4") ...
_RATIO_ROW = re.compile(r"^\s*\|.*\d×(?!\w)")
# ... or a paragraph that says "measured" (or dates a run by its load) and gives a figure: an
# ISO date, a ratio, or a number with a unit of time, size or share.
_MEASURED = re.compile(r"\b(?:[Mm]easured|load \d|load average)\b")
_FIGURE = re.compile(
    r"\b20\d\d-[01]\d-[0-3]\d\b|\d×(?!\w)"
    r"|\d(?:[.,]\d+)?\s?(?:s|ms|µs|min|B|KB|MB|GB|KiB|MiB|GiB|%)(?![\w/])"
)


def _prose(path: Path) -> list[tuple[int, list[str]]]:
    """A page's paragraphs outside code fences and admonitions: (first line's number, lines)."""
    paragraphs: list[tuple[int, list[str]]] = []
    current: list[str] = []
    start = 0
    fenced = False
    admonition: int | None = None  # the admonition's own indent while inside one
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        if admonition is not None:
            indent = len(line) - len(line.lstrip())
            if not line.strip() or indent > admonition:
                continue
            admonition = None
        opened = _ADMONITION.match(line)
        if opened:
            admonition = len(opened.group(1))
        if opened or not line.strip():
            if current:
                paragraphs.append((start, current))
            current = []
            continue
        if not current or re.match(r"^\s*(?:[-*+]|\d+\.)\s", line):
            if current:
                paragraphs.append((start, current))
            current, start = [], n
        current.append(line)
    if current:
        paragraphs.append((start, current))
    return paragraphs


def _site_pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def test_warnings_are_admonitions() -> None:
    """A warning or a note on a docs page is an admonition (``!!! warning``, ``!!! note``), which
    the site sets apart, never a paragraph or list item that opens with "Note:", "Warning:",
    "Careful:", "Caution:", "Important:", or one of those words (or "Beware") in bold or italics.
    Code blocks and the admonitions' own bodies are not read. The README is not checked: GitHub
    renders no admonitions."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {lines[0].strip()}"
        for path in _site_pages()
        for n, lines in _prose(path)
        if _PROSE_WARNING.match(lines[0].strip())
    ]
    assert not found, "a prose warning: make it an admonition (!!! warning / !!! note):\n" + (
        "\n".join(found)
    )


def _stray_figures(path: Path) -> list[str]:
    """The figure-like lines of one page: table rows with a ratio, and paragraphs that say
    "measured" (or give a load) next to a figure."""
    found: list[str] = []
    for n, lines in _prose(path):
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{n}"
        found += [f"{where}: {line.strip()[:80]}" for line in lines if _RATIO_ROW.match(line)]
        text = " ".join(lines)
        if _MEASURED.search(text) and _FIGURE.search(text):
            found.append(f"{where}: a measurement: {lines[0].strip()[:80]}")
    return found


def test_figures_live_on_the_performance_page() -> None:
    """A measured figure is stated once, on docs/performance.md (or in benchmarks/RESULTS.md, the
    raw record), and other pages link to its section. Two patterns catch a figure that strayed
    elsewhere with few false alarms: a table row holding a ratio (``0.47×``: a comparison
    measured), and a paragraph that says "measured" (or gives a run's load) next to a figure: an
    ISO date, a ratio, or a number with a unit of time, size or share. The README (the door: a
    headline figure in prose, no "measured") and every docs page but the performance page are
    read, outside code blocks (sample output keeps its own numbers)."""
    pages = [ROOT / "README.md", *_site_pages()]
    found: list[str] = []
    for path in pages:
        if path.relative_to(ROOT).as_posix() != "docs/performance.md":
            found += _stray_figures(path)
    assert not found, (
        "figures belong on docs/performance.md (link to its section instead):\n" + "\n".join(found)
    )


def test_the_docs_rules_see_what_they_look_for(tmp_path: Path) -> None:
    """The two rules above against a page of each kind: what they look for is found; an
    admonition, a code block, a shape such as 4×4×4 and prose that names a note, a median or
    what the hook measures are not."""
    page = tmp_path / "page.md"
    page.write_text(
        "Note: prose.\n\n- **Warning** in a list.\n\nA note: fine, and so is Note that x.\n\n"
        '!!! warning "Title"\n    Note: inside, fine.\n\n    Warning: still inside.\n\n'
        "```\nNote: in code\n| 1 | 0.5× |\n```\n\n| a | 0.47× |\n\n"
        "Measured 2026-11-28 at load 3.\n\nThe 2026-11-28 release.\n\n"
        "| v4 | 4×4×4 blocks |\n\nThe hook measured it: the median step of 3 hosts.\n\n"
        "Measured on CPU: 2.85 s, then 0.57 s.\n"
    )
    paragraphs = _prose(page)
    warnings = [n for n, lines in paragraphs if _PROSE_WARNING.match(lines[0].strip())]
    assert warnings == [1, 3]
    assert [f.split(":")[1] for f in _stray_figures(page)] == ["17", "19", "27"]
