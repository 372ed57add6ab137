"""The shape of inferd/: one package per concern, faces between packages, and no import cycles.

The import graph is read with `ast`, so it sees every import: module level, inside functions, and
under `if TYPE_CHECKING:` (an annotation-only cycle is still two modules that each need the other).
"""
from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "inferd"
# Bottom to top: a package imports (at run time) only packages below it. `types` and the root package
# sit under all of them, `__main__` (the CLI) over all of them.
LAYERS = ["observability", "artifacts", "engine", "config", "capacity", "slo", "safety", "cache", "store", "models",
          "admission", "tenancy", "cluster", "api", "jobs", "daemon"]
PACKAGES = sorted(LAYERS)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def top_package(module: str) -> str:
    """`inferd.admission.fair_queue` -> `admission`; a top-level module (`inferd.types`) is its own."""
    return module.split(".")[1] if module != "inferd" else "inferd"


def face(module: str) -> str:
    """The package whose __init__ a module belongs behind: `inferd.engine.sim.profiles` -> `inferd.engine.sim`."""
    while module not in MODULES or MODULES[module].name != "__init__.py":
        module = module.rpartition(".")[0]
    return module


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str, *, runtime_only: bool = False) -> list[tuple[str, int]]:
    """(imported inferd module, line) for every import in `module`; a `from pkg import name` that
    names a submodule counts as importing it. `runtime_only` skips `if TYPE_CHECKING:` blocks."""
    path = MODULES[module]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if runtime_only and isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in MODULES else base
                if target in MODULES:
                    found.append((target, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names if a.name in MODULES)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in `graph` as a path [a, b, ..., a], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        color[node] = GREY
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if color.get(nxt, BLACK) == GREY:
                return stack[stack.index(nxt):] + [nxt]
            if color.get(nxt) == WHITE and (cycle := dfs(nxt)):
                return cycle
        stack.pop()
        color[node] = BLACK
        return None

    for node in sorted(graph):
        if color[node] == WHITE and (cycle := dfs(node)):
            return cycle
    return None


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_no_module_imports_itself_back_through_any_chain():
    graph = {m: {t for t, _ in imports(m) if t != m and not m.startswith(t + ".")} for m in MODULES}
    assert find_cycle(graph) is None


def test_packages_depend_on_each_other_in_one_direction():
    """Faces import their insides eagerly, so two packages importing each other at run time would
    fail on a partially initialised face; a package DAG is what keeps every face importable."""
    graph: dict[str, set[str]] = {}
    for m in MODULES:
        graph.setdefault(top_package(m), set()).update(
            top_package(t) for t, _ in imports(m, runtime_only=True) if top_package(t) != top_package(m))
    assert find_cycle(graph) is None


def test_each_package_imports_only_the_layers_below_it():
    upward = []
    for m in MODULES:
        here = top_package(m)
        if here not in LAYERS:
            continue
        for target, line in imports(m, runtime_only=True):
            there = top_package(target)
            if there in LAYERS and LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{MODULES[m].relative_to(ROOT.parent)}:{line}: {here} imports {there}")
    assert upward == []


def test_other_packages_import_the_face_not_the_inside():
    inside = []
    for m in MODULES:
        for target, line in imports(m):
            if top_package(target) == top_package(m) or face(target) == "inferd":
                continue
            if target != face(target):
                inside.append(f"{MODULES[m].relative_to(ROOT.parent)}:{line} imports {target} (use {face(target)})")
    assert inside == []


def test_inferd_top_level_is_the_packages_plus_the_cli_and_the_seam_types():
    entries = sorted(p.name for p in ROOT.iterdir() if p.name not in ("__init__.py", "__pycache__"))
    assert entries == sorted([*PACKAGES, "__main__.py", "types.py"])


@pytest.mark.parametrize("package", sorted(m for m, p in MODULES.items() if p.name == "__init__.py"))
def test_every_package_says_in_one_line_what_it_owns(package):
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text(encoding="utf-8")))
    assert doc, f"{package} has no docstring"
    assert len(doc.splitlines()[0]) <= 120 and doc.splitlines()[0].endswith(".")


# -- code rules, read from the source ----------------------------------------------------------------------

MAX_FUNCTION_LINES = 80
ISSUE_REFERENCE = re.compile(r"\b[Ii]ssues? \d+")
# `inferd/types.py` keeps its name: design.md and the top-level test above name it, and the interpreter
# imports the standard `types` while it starts, before any script's folder is on sys.path, so this file can
# never be picked up in its place (unlike `tokenize` or `queue`, which load on first use).
STDLIB_NAMES_ALLOWED = {"inferd.types"}


def where(module: str, line: int | None = None) -> str:
    path = str(MODULES[module].relative_to(ROOT.parent))
    return path if line is None else f"{path}:{line}"


def syntax_tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"))


def offenders(found: list[str]) -> str:
    return f"{len(found)} offender(s):\n" + "\n".join(found)


def test_no_function_is_longer_than_80_lines():
    """A function's length runs from its `def` line to the last line of its body, both included:
    decorators are not counted, while its docstring, comments and blank lines are. A nested function counts
    in its parent's length and is measured on its own as well. Methods are functions."""
    long = []
    for m in MODULES:
        for node in ast.walk(syntax_tree(m)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{where(m, node.lineno)}: {node.name} is {lines} lines")
    assert not long, offenders(long)


def test_no_module_or_package_is_named_like_a_standard_library_module():
    """A script run from a folder holding `tokenize.py` imports that file instead of the standard one."""
    shadowing = []
    for m, path in MODULES.items():
        name = m.rpartition(".")[2]
        if m != "inferd" and name in sys.stdlib_module_names and m not in STDLIB_NAMES_ALLOWED:
            kind = "package" if path.name == "__init__.py" else "module"
            shadowing.append(f"{where(m)}: {kind} {name!r} shadows the standard library's {name}")
    assert not shadowing, offenders(shadowing)


def issue_references(path: Path) -> list[tuple[int, str]]:
    """(line, text) for each comment or docstring line in `path` that points at an issue number."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and ISSUE_REFERENCE.search(token.string):
            found.add(token.start[0])
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and \
                ast.get_docstring(node) is not None:
            doc = node.body[0]
            found.update(n for n in range(doc.lineno, doc.end_lineno + 1) if ISSUE_REFERENCE.search(lines[n - 1]))
    return [(n, lines[n - 1].strip()) for n in sorted(found)]


def test_no_comment_or_docstring_points_at_an_issue_number():
    """Readers of the code cannot open the tracker: a comment says why itself."""
    found = [f"{where(m, line)}: {text}" for m, path in MODULES.items() for line, text in issue_references(path)]
    assert not found, offenders(found)


def test_issue_references_are_found_in_comments_and_docstrings_only(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""Module docstring (issue 3)."""\n'
                     'X = "issue 4 in a string is data"\n'
                     'def f():\n'
                     '    """Line one.\n\n    Fixed in Issues 5 and 6."""\n'
                     '    return 1  # see issue 7, not tissue 8\n', encoding="utf-8")
    assert [line for line, _ in issue_references(probe)] == [1, 6, 7]


def subcommand_registrations(module: str) -> list[int]:
    """Lines where `module` registers an `inferd` subcommand (`subparsers.add_parser(...)`)."""
    return [node.lineno for node in ast.walk(syntax_tree(module))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser"]


def test_cli_modules_are_named_after_their_subcommand():
    """A module that registers an `inferd` subcommand (other than `__main__`, the root parser) is named
    `<noun>_cli.py`, and a `*_cli.py` module holds the entry of a subcommand: a module-level `*_main` function.
    (build_engines.py's options, added by the trtllm builder, are not an `inferd` subcommand.)"""
    misnamed = []
    for m, path in MODULES.items():
        is_cli_name = path.stem.endswith("_cli")
        registrations = [] if m == "inferd.__main__" else subcommand_registrations(m)
        if registrations and not is_cli_name:
            misnamed.append(f"{where(m, registrations[0])}: registers a subcommand but is not named *_cli.py")
        if is_cli_name and not any(isinstance(node, ast.FunctionDef) and node.name.endswith("_main")
                                   for node in syntax_tree(m).body):
            misnamed.append(f"{where(m)}: named *_cli.py but has no module-level *_main entry function")
    assert not misnamed, offenders(misnamed)


# The HTTP face split by job, bottom to top: wire formats, streaming, the request pipeline, the other
# routes, the admin routes. A sub-package imports (at run time) only those below it; the modules at the
# top of inferd/api (app, state, auth, errors, ...) are shared by all of them.
API_LAYERS = ["wire", "streaming", "pipeline", "routes", "admin", "console"]


def api_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["inferd", "api"] and parts[2] in API_LAYERS else None


def test_the_http_face_is_split_by_job():
    api = ROOT / "api"
    packages = sorted(p.name for p in api.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(API_LAYERS)
    top = sorted(p.stem for p in api.glob("*.py"))
    assert top == ["__init__", "app", "appkeys", "auth", "errors", "state", "state_builder"]


def test_api_sub_packages_import_only_the_ones_below_them():
    upward = []
    for m in MODULES:
        here = api_part(m)
        if here is None:
            continue
        for target, line in imports(m, runtime_only=True):
            there = api_part(target)
            if there is not None and API_LAYERS.index(there) > API_LAYERS.index(here):
                upward.append(f"{MODULES[m].relative_to(ROOT.parent)}:{line}: api.{here} imports api.{there}")
    assert upward == []


def test_the_request_path_is_one_pipeline_module_per_job():
    """The handlers name their stages in one module; no endpoint keeps a request path of its own."""
    pipeline = ROOT / "api" / "pipeline"
    assert (pipeline / "run.py").exists() and (pipeline / "settle.py").exists()
    for gone in ("completions.py", "embeddings.py", "context.py", "batch_runner.py"):
        assert not (ROOT / "api" / gone).exists(), gone
