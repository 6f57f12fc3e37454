"""MkDocs hook: the command-line reference, generated from ``kfp_trainer.cli.build_parser()`` at build time.

A page holding the line ``<!-- cli-reference -->`` gets, in its place, ``kfp-trainer --help`` and
every command's ``--help`` as the parser prints them, so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
WIDTH = "100"  # the help text's width: the same on every machine, whatever the terminal


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse has no public way to list its sub-commands
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def reference() -> str:
    """Markdown of the whole command line: the top-level help, then each command's."""
    from kfp_trainer.cli import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        parts = ["## kfp-trainer", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in _commands(parser):
            parts += [f"## kfp-trainer {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(parts)


def on_config(config: Any, **kwargs: Any) -> Any:
    """Put the checkout that holds ``mkdocs.yml`` first on the path: the reference is of its code."""
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace the marker with the reference."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())
