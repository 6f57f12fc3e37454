"""No import circle between the modules of ``kfp_trainer``, read from the source with ``ast``.

Every import counts: at module level, inside functions (a lazy import is still a dependency),
and under ``if TYPE_CHECKING:`` (a type that needs the other module is one too) -- all but those
under ``if __name__ == "__main__":``, which run only when the module is a script (``python -m``),
not imported. A circle is reported as the path that closes it, e.g. ``a -> b -> a``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "kfp_trainer"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The package module ``name`` lives in (``a.b.C`` -> ``a.b`` when ``C`` is a name in it), or None outside."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``module`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    tree.body = [node for node in tree.body if not _main_guard(node)]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem for alias in node.names]
        for name in names:
            target = _target(name, known)
            if target and target != module:
                found.add(target)
    return found


def _main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` at module level."""
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )  # fmt: skip


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def groups(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (strongly connected, more than one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per group of :func:`groups`, as the path that closes it."""
    return [_path(group, edges) for group in groups(edges)]


def _path(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest circle through the group's first module, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges.get(v, ()) & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return group


def test_no_module_of_the_package_takes_part_in_an_import_circle():
    edges = graph()
    found = groups(edges)
    assert not found, "import circles:\n" + "\n".join(
        f"  {' -> '.join(_path(group, edges))}" + (f" (the group: {', '.join(group)})" if len(group) > 2 else "") for group in found
    )


def test_the_check_finds_a_circle_through_a_function_level_and_a_type_checking_import(tmp_path):
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .b import B\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\nclass B: ...\n"
    )
    (package / "c.py").write_text("from kfp_trainer.a import f\nimport os\n")
    found = cycles(graph(tmp_path))
    assert found == [["kfp_trainer.a", "kfp_trainer.sub.b", "kfp_trainer.c", "kfp_trainer.a"]]


@pytest.mark.parametrize("source", ["from . import b\n", "from .b import thing\n", "import kfp_trainer.b\n"])
def test_each_form_of_import_is_an_edge(tmp_path, source):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(source)
    (package / "b.py").write_text("from .a import x\n")
    assert cycles(graph(tmp_path)) == [["kfp_trainer.a", "kfp_trainer.b", "kfp_trainer.a"]]


def test_an_import_under_the_main_guard_is_no_edge(tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import sys\nif __name__ == '__main__':\n    from .b import main\n")
    (package / "b.py").write_text("def main():\n    from . import a\n")
    assert cycles(graph(tmp_path)) == []
    assert graph(tmp_path)["kfp_trainer.b"] == {"kfp_trainer.a"}
