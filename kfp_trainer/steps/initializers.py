"""Run-time work of the ``dataset_initializer`` and ``model_initializer`` components."""

from __future__ import annotations

import time
from typing import Any

from .checks import check_initializer
from .common import log, model_metadata


def run_initializer(*, uri: str, kind: str, output: Any, ignore_patterns: list[str] | None = None) -> dict[str, Any]:
    """Fetch ``uri`` into the output artifact and describe it in the artifact's metadata."""
    from ..data import discover
    from ..storage import fetch, redact

    check_initializer({"uri": uri})
    started = time.monotonic()
    log(f"fetching {kind} {redact(uri)}")
    info = fetch(uri, output.path, kind=kind, ignore_patterns=ignore_patterns)
    info["fetch_seconds"] = round(time.monotonic() - started, 2)
    if kind == "model":
        info.update(model_metadata(output.path, base_model=info["source_uri"]))
    else:
        layout = discover(output.path)
        splits = sorted(set(layout.splits) | ({"train"} if layout.find("train") else set()))
        if splits:
            info["splits"] = ",".join(splits)
    output.metadata.update(info)
    log(f"fetched {info['files']} files, {info['bytes']} bytes in {info['fetch_seconds']} s")
    return info
