"""docs/INTERFACES.md against the code, so the map cannot drift: every module path it names exists, every
dotted name of ours it names (`launcher.train.rank.start`) is defined where it says, and its "lower layers
first" list is the real direction of the imports (imports inside functions counted)."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import grimp

from tests.support.helpers import REPO

MAP = REPO / "docs" / "INTERFACES.md"
PACKAGES = ("roformer", "data_pipeline", "launcher")
# A repository path in backticks (`launcher/common/io.py`, `launcher/run_dir/`), and a dotted name of ours.
PATH = re.compile(r"`((?:roformer|data_pipeline|launcher|tests|bench|docs|scripts|configs|ds_configs)/[\w./-]*)`")
DOTTED = re.compile(r"(?<![\w./])((?:roformer|data_pipeline|launcher)(?:\.[A-Za-z_]\w*)+)")
FROM_IMPORT = re.compile(r"from ((?:roformer|data_pipeline|launcher)[\w.]*) import ([\w, ]+)")
LAYOUT_HEADING = "## Layout: where each concern lives"


def _module_file(parts: list[str]) -> Path | None:
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _defined(body: list[ast.stmt], name: str, imports: bool) -> ast.stmt | None:
    """The statement of `body` that binds `name` (a def, a class, an assignment; an import when `imports`:
    a package's own re-exports), if any. A module that merely imports a name is not where it lives."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
        if imports and isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name
                                                                              for a in node.names):
            return node
        if isinstance(node, ast.If):  # TYPE_CHECKING blocks and the like
            found = _defined(node.body + node.orelse, name, imports)
            if found is not None:
                return found
    return None


def _lazy_exports(tree: ast.Module) -> set[str]:
    """The names a package's module-level __getattr__ serves: its _EXPORTS table (name -> module in
    data_pipeline/__init__.py, module -> names in roformer/__init__.py)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            for key, value in zip(node.value.keys, node.value.values):
                entries = value.elts if isinstance(value, ast.Tuple) else [key]
                names.update(e.value for e in entries if isinstance(e, ast.Constant))
    return names


def unresolved(dotted: str) -> str | None:
    """Why `dotted` names nothing in the code, or None: the longest module prefix, then each attribute
    defined at the module's top level, then inside that class."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            break
    else:
        return "no such module"
    body, rest = _tree(path).body, parts[cut:]
    for depth, name in enumerate(rest):
        node = _defined(body, name, imports=path.name == "__init__.py")
        if node is None and depth == 0 and name in _lazy_exports(_tree(path)):
            return None
        if node is None:
            return f"{'.'.join(parts[:cut + depth])} defines no {name!r}"
        if not isinstance(node, ast.ClassDef):
            return None  # a function's or a value's attributes are not checked
        body = node.body
    return None


def layout_lines() -> list[str]:
    """The bullets of the layout section, each joined into one line, in the map's order."""
    text = MAP.read_text(encoding="utf-8").split(LAYOUT_HEADING, 1)[1].split("\n## ", 1)[0]
    bullets: list[str] = []
    for line in text.splitlines():
        if line.startswith("- "):
            bullets.append(line)
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
    return bullets


def _module_of_path(path: str) -> str:
    return path.rstrip("/").removesuffix(".py").replace("/", ".")


def test_every_module_path_the_map_names_exists():
    text = MAP.read_text(encoding="utf-8")
    missing = sorted({path for path in PATH.findall(text) if not (REPO / path.split("#")[0]).exists()})
    assert not missing, f"docs/INTERFACES.md names paths that do not exist: {missing}"


def test_every_dotted_name_the_map_names_resolves():
    text = MAP.read_text(encoding="utf-8")
    names = set(DOTTED.findall(text))
    names.update(f"{module}.{name.strip()}" for module, imported in FROM_IMPORT.findall(text)
                 for name in imported.split(",") if name.strip())
    problems = sorted({f"{name}: {why}" for name in names if (why := unresolved(name))})
    assert not problems, "docs/INTERFACES.md names what the code does not define:\n" + "\n".join(problems)


def test_the_layout_lists_lower_layers_first():
    """A module of one line of the layout never imports a module of a later line (the most specific line
    naming a module is its line; modules no line names are not placed)."""
    line_of: dict[str, int] = {}
    for index, bullet in enumerate(layout_lines()):
        for path in PATH.findall(bullet):
            if path.split("/")[0] in PACKAGES:
                line_of[_module_of_path(path)] = index
    assert len(set(line_of.values())) >= 10, line_of  # the map still has its layout

    def placed(module: str) -> tuple[str, int] | None:
        prefixes = [p for p in line_of if module == p or module.startswith(p + ".")]
        return (max(prefixes, key=len), line_of[max(prefixes, key=len)]) if prefixes else None

    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    upward = set()
    for importer in graph.modules:
        here = placed(importer)
        if here is None:
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            there = placed(imported)
            if there is not None and there[1] > here[1]:
                upward.add(f"{here[0]} (line {here[1] + 1}) imports {there[0]} (line {there[1] + 1}): "
                           f"{importer} -> {imported}")
    assert not upward, "docs/INTERFACES.md's layout is not lower layers first:\n" + "\n".join(sorted(upward))
