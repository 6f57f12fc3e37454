"""The log relay's reading speed lives in one module (``backends/kube/bodylines.py``).

The HTTP client hands back a body's bytes and knows nothing of lines, threads or timers; the
backend contract has one sink protocol (``LogSink``, taking ``LogLine``), with no second
batch-taking kind of sink beside it. Read from the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kfp_trainer.backends.kube.client import Stream

PACKAGE = Path(__file__).resolve().parents[2] / "kfp_trainer"


def calls(path: Path) -> set[str]:
    """The dotted names called anywhere in ``path`` (``threading.Thread``, ``time.sleep`` ...)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            found.add(f"{node.func.value.id}.{node.func.attr}")
    return found


def test_the_http_client_hands_back_bytes_and_starts_no_thread_and_waits_no_timer():
    client = PACKAGE / "backends" / "kube" / "client.py"
    assert not calls(client) & {"threading.Thread", "time.sleep", "threading.Event"}
    assert {name for name in vars(Stream) if not name.startswith("_")} == {"chunks", "close", "shutdown"}


def test_reading_ahead_gathering_and_cutting_lines_are_in_one_module():
    kube = PACKAGE / "backends" / "kube"
    readers = sorted(p.name for p in kube.glob("*.py") if "threading.Thread" in calls(p) and "time.sleep" in calls(p))
    assert readers == ["bodylines.py"]
    cutters = sorted(p.name for p in kube.glob("*.py") if 'split(b"\\n")' in p.read_text())
    assert cutters == ["bodylines.py"]


def test_the_backend_contract_has_one_sink_protocol():
    base = ast.parse((PACKAGE / "backends" / "base.py").read_text())
    sinks = [n.name for n in ast.walk(base) if isinstance(n, (ast.ClassDef, ast.Assign)) and "Sink" in getattr(n, "name", "")]
    sinks += [t.id for n in ast.walk(base) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name) and "Sink" in t.id]
    assert sinks == ["LogSink"]
    methods = {n.name for p in PACKAGE.rglob("*.py") for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.FunctionDef)}
    assert "batch" not in methods  # no second way into a sink
