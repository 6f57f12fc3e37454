"""The README's and the documentation's code blocks and links, read the way the tests need them."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GITHUB = "https://github.com/kfp-trainer/kfp-trainer/"
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    """README.md and every page of the documentation site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: Path, language: str) -> list[str]:
    """The fenced blocks of ``language`` in a Markdown file, in order."""
    return [m.group(2) for m in _FENCE.finditer(path.read_text()) if m.group(1) == language]


def pipeline_blocks() -> list[tuple[str, int, str]]:
    """(page, index, code) of every Python block that defines a pipeline."""
    out = []
    for page in pages():
        for i, code in enumerate(blocks(page, "python")):
            if "@dsl.pipeline" in code:
                out.append((page.relative_to(REPO).as_posix(), i, code))
    return out


def section(path: Path, heading: str) -> str:
    """The text under a Markdown heading, up to the next heading of the same or a higher level."""
    text = path.read_text()
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    following = re.search(rf"^#{{1,{level}}} ", text[start:], re.M)
    return text[start : start + following.start()] if following else text[start:]
