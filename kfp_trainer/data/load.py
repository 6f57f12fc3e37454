"""Reading one split of a dataset folder (or file) as prompt/completion examples."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .files import DATA_SUFFIXES, DatasetError, columns_of, read_rows
from .shapes import ACCEPTED, ChatRenderer, detect_shape, to_example, to_pair
from .splits import GROUPS, Layout, discover, holdout

_LISTED = 20


def _stderr(message: str) -> None:
    print(f"data: {message}", file=sys.stderr, flush=True)


def _names(paths: list[Path], root: Path) -> str:
    shown = [str(p.relative_to(root)) if p.is_relative_to(root) else p.name for p in paths[:_LISTED]]
    more = f" and {len(paths) - _LISTED} more" if len(paths) > _LISTED else ""
    return ", ".join(shown) + more if shown else "none"


def _columns(path: Path) -> str:
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return str(pq.read_schema(path).names)
        return str(columns_of(read_rows(path)))
    except (DatasetError, ImportError, OSError, ValueError):
        return "(unreadable)"


def _not_found(layout: Layout, split: str) -> DatasetError:
    root = layout.root
    files = layout.files
    if not files:
        present = sorted(p for p in root.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts))
        return DatasetError(
            f"dataset {root}: no data files ({', '.join(DATA_SUFFIXES)}); files found: {_names(present, root)}. "
            f"Accepted record shapes: {'; '.join(ACCEPTED)}"
        )
    columns = "; ".join(f"{p.relative_to(root)}: {_columns(p)}" for p in files[:3])
    return DatasetError(
        f"dataset {root}: no {split!r} split. Splits found: {sorted(layout.splits) or 'none'}; "
        f"data files: {_names(files, root)}; columns: {columns}"
    )


def _resolve(path: Path, split: str, log: Callable[[str], None]) -> tuple[list[Path], str | None, Path]:
    """The files to read and the holdout mode (``None``, ``"without"`` or ``"only"``)."""
    if path.is_file():  # a file given on its own is read whole, whatever the split
        return [path], None, path.parent
    layout = discover(path, split)
    files = layout.find(split)
    has_eval = bool(layout.find("test") or layout.find("validation"))
    if files and split.lower() in GROUPS["train"] and not has_eval:
        log(f"no test or validation split in {path}: holding out a slice of train for evaluation, training on the rest")
        return files, "without", path
    if not files and split.lower() in GROUPS["test"]:
        files = layout.find("validation")
        if files:
            log(f"no {split!r} split in {path}: reading the validation split instead")
            return files, None, path
        files = layout.find("train")
        if files:
            log(f"no {split!r} or validation split in {path}: reading the slice of train held out from training")
            return files, "only", path
    if not files:
        raise _not_found(layout, split)
    return files, None, path


def load_split(
    dataset: str | Path,
    split: str = "train",
    *,
    render_chat: ChatRenderer | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, str]]:
    """Reads one split of a dataset as ``{"prompt": ..., "completion": ...}`` examples.

    The accepted folder layouts, file formats and record shapes are described in
    :mod:`kfp_trainer.data`.

    Args:
        dataset: A dataset folder, or one data file (read whole, whatever the split).
        split: ``train``, ``test``, ``validation`` or any split name found on disk.
        render_chat: Renders chat prompts (:func:`~kfp_trainer.data.shapes.chat_renderer`);
            default: the simple template of :mod:`kfp_trainer.data.shapes`.
        log: Where the lines about fallbacks and what was read go (default: stderr).

    Returns:
        The examples, in file order.

    Raises:
        DatasetError: No such dataset or split, an unreadable file, records of no accepted
            shape (the message names files and columns, never a value).
    """
    return _load(dataset, split, render_chat=render_chat, log=log, preference=False)


def load_preference_split(
    dataset: str | Path,
    split: str = "train",
    *,
    render_chat: ChatRenderer | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, str]]:
    """Reads one split of a preference dataset as ``{"prompt", "chosen", "rejected"}`` texts (what DPO trains on).

    The same folder layouts, file formats, split fallbacks and held-out slice as
    :func:`load_split`; every file's records must have ``prompt``, ``chosen`` and ``rejected``
    columns (text, or chat turns: :func:`~kfp_trainer.data.shapes.to_pair`).

    Raises:
        DatasetError: No such dataset or split, an unreadable file, or records without the three
            columns (the message names files and columns, never a value).
    """
    return _load(dataset, split, render_chat=render_chat, log=log, preference=True)


def _load(
    dataset: str | Path, split: str, *, render_chat: ChatRenderer | None, log: Callable[[str], None] | None, preference: bool
) -> list[dict[str, str]]:
    log = log or _stderr
    path = Path(dataset)
    if not path.exists():
        raise DatasetError(f"dataset {dataset}: no such file or directory")
    files, mode, root = _resolve(path, split, log)
    rows: list[tuple[dict[str, Any], str, str]] = []  # (row, shape, where)
    shapes: set[str] = set()
    for file in files:
        records = read_rows(file)
        if not records:
            continue
        name = file.relative_to(root) if file.is_relative_to(root) else file.name
        columns = columns_of(records)
        shape = detect_shape(columns)
        if preference and shape != "preference":
            raise DatasetError(f"{name}: columns {columns} are not a preference pair; expected prompt, chosen and rejected columns")
        if shape is None:
            raise DatasetError(f"{name}: columns {columns} fit no accepted record shape; accepted: {'; '.join(ACCEPTED)}")
        shapes.add(shape)
        rows.extend((row, shape, f"{name}, record {i + 1}") for i, row in enumerate(records))
    if mode is not None:
        held = holdout([row for row, _, _ in rows])
        rows = [r for i, r in enumerate(rows) if (i in held) == (mode == "only")]
    if preference:
        examples = [to_pair(row, where, render_chat) for row, _, where in rows]
    else:
        examples = [to_example(row, shape, where, render_chat) for row, shape, where in rows]
    if not examples:
        raise DatasetError(f"dataset {path}: split {split!r} has no records (files: {_names(files, root)})")
    what = "pairs" if preference else "examples"
    log(f"split {split!r}: {len(examples)} {what} ({', '.join(sorted(shapes))}) from {_names(files, root)}")
    return examples


def load_prompt_split(
    dataset: str | Path,
    split: str = "train",
    *,
    columns: list[str] | tuple[str, ...] | None = (),
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Reads one split as prompts for online RL (GRPO): each record's ``prompt`` and the reference ``columns`` rewards read.

    ``columns=None`` keeps every column.

    The same folder layouts, file formats, split fallbacks and held-out slice as
    :func:`load_split`. ``prompt`` is text, or chat turns (a list of ``{"role", "content"}``:
    a conversational prompt, rendered by the model's chat template when sampled). The other
    columns are kept as they are, one value per record.

    Raises:
        DatasetError: No such dataset or split, an unreadable file, or a file without the
            ``prompt`` column or one of ``columns`` (the message names the file, what is
            missing and the columns it has, never a value).
    """
    log = log or _stderr
    path = Path(dataset)
    if not path.exists():
        raise DatasetError(f"dataset {dataset}: no such file or directory")
    files, mode, root = _resolve(path, split, log)
    wanted = ["prompt", *(c for c in columns or () if c != "prompt")]
    full: list[dict[str, Any]] = []  # the whole records: the held-out slice is chosen on them, as load_split chooses it
    for file in files:
        records = read_rows(file)
        if not records:
            continue
        name = file.relative_to(root) if file.is_relative_to(root) else file.name
        found = columns_of(records)
        if columns is None:
            wanted += [c for c in found if c not in wanted]
        missing = [c for c in wanted if c not in found]
        if missing:
            what = "prompt column" if missing == ["prompt"] else f"column{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
            raise DatasetError(f"{name}: has no {what} (GRPO reads prompt and {', '.join(wanted[1:]) or 'no other column'}); "
                               f"its columns: {found}")  # fmt: skip
        for i, row in enumerate(records):
            prompt = row.get("prompt")
            if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt):
                raise DatasetError(f"{name}, record {i + 1}: prompt is {type(prompt).__name__}; expected text or a list of chat turns")
            full.append(row)
    if mode is not None:
        held = holdout(full)
        full = [r for i, r in enumerate(full) if (i in held) == (mode == "only")]
    rows = [{c: row.get(c) for c in wanted} for row in full]
    if not rows:
        raise DatasetError(f"dataset {path}: split {split!r} has no records (files: {_names(files, root)})")
    log(f"split {split!r}: {len(rows)} prompts from {_names(files, root)}")
    return rows
