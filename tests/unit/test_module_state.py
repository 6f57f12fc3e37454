"""Where the package keeps state: in objects handed around, not in modules.

A function that changes a module-level name (``global``, a mutating method, an item assigned)
is state shared by every caller in the process, which a test would have to reset. Read from
the source with ``ast``. What remains is listed here, each with why it is not such state.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "kfp_trainer"
MUTATORS = {"clear", "append", "update", "pop", "setdefault", "add", "extend", "remove", "discard", "popitem", "insert"}
ALLOWED = {
    # Memos of pure functions (an answer depends on the argument only), bounded: nothing to reset.
    ("timestamps.py", "_seconds"),
    ("timestamps.py", "KNOWN_SECONDS"),
    ("compile.py", "_MODULES"),  # a pipeline file's module, loaded once per process (importing it twice would re-run it)
    # The process's default reporter of the trainer-side API, as logging's root logger is; a run's code passes its own.
    ("progress.py", "_default"),
    ("tracking/trainer.py", "_default"),
}


def changed_module_names(path: Path) -> set[str]:
    """The module-level names a function of ``path`` changes."""
    tree = ast.parse(path.read_text())
    top = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
           for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}  # fmt: skip
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        local = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found.update(node.names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id in top and owner.id not in local:
                    found.add(owner.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                        if target.value.id in top and target.value.id not in local:
                            found.add(target.value.id)
    return found


def test_no_module_keeps_state_its_functions_change_but_the_listed_memos_and_defaults():
    found = {(str(path.relative_to(ROOT)), name) for path in sorted(ROOT.rglob("*.py")) for name in changed_module_names(path)}
    assert found - ALLOWED == set()
    assert ALLOWED - found == set(), "listed but gone: take it off the list"


def test_the_check_sees_a_cache_a_global_and_an_item_assigned(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "CACHE = {}\nSEEN = []\nCOUNT = 0\nLOCAL = {}\n"
        "def f(x):\n    CACHE[x] = 1\n    SEEN.append(x)\n"
        "def g():\n    global COUNT\n    COUNT += 1\n"
        "def h(LOCAL):\n    LOCAL.clear()\n"
    )
    assert changed_module_names(module) == {"CACHE", "SEEN", "COUNT"}
